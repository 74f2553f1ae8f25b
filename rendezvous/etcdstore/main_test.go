package etcdstore_test

import (
	"testing"

	"go.uber.org/goleak"

	"github.com/gorun/gorun/internal/etcdtest"
)

// etcd's own servers leave a few goroutines winding down; etcdtest knows which.
func TestMain(m *testing.M) { goleak.VerifyTestMain(m, etcdtest.GoleakOptions()...) }
