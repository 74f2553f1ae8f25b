package etcdembed

import (
	"context"
	"encoding/hex"
	"errors"
	"fmt"
	"slices"
	"time"

	"go.etcd.io/etcd/api/v3/authpb"
	pb "go.etcd.io/etcd/api/v3/etcdserverpb"
	"go.etcd.io/etcd/client/pkg/v3/types"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.etcd.io/etcd/server/v3/auth"
	"go.etcd.io/etcd/server/v3/etcdserver"
	etcderr "go.etcd.io/etcd/server/v3/etcdserver/errors"

	"github.com/gorun/gorun/internal/jobsecret"
)

// The etcd authentication of a member started with a job secret.
const (
	// AuthUser is the etcd user of the agents: it may read and write
	// the keys under AuthPrefix, nothing else.
	AuthUser = "gorun"
	// AuthPrefix starts every key of the rendezvous (etcdstore.JobPrefix).
	AuthPrefix = "/gorun/"

	authRole   = AuthUser // the role holding AuthUser's permission
	rootUser   = "root"   // etcd enables authentication only once root exists with the root role
	rootRole   = "root"
	userKey    = "etcd"      // jobsecret.Key purpose of AuthUser's password
	rootKey    = "etcd-root" // and of root's
	bcryptCost = 4           // bcrypt.MinCost: see Config.Secret
	tokenTTL   = 24 * 3600   // seconds a simple token lives without use: see Config.Secret
)

// Credentials returns the etcd user and password with which a holder of
// secret reaches a member started with it (Config.Secret): AuthUser and
// the hex of secret.Key("etcd"). The zero secret gives "", "".
func Credentials(secret jobsecret.Secret) (user, password string) {
	if secret.IsZero() {
		return "", ""
	}
	return AuthUser, hex.EncodeToString(secret.Key(userKey))
}

// rootPassword is root's password: known to the job, so that a member can
// tell the root gorun made from one someone else made first.
func rootPassword(secret jobsecret.Secret) string {
	return hex.EncodeToString(secret.Key(rootKey))
}

// authPoll is how often a member that waits for the leader to turn on
// authentication looks at its own applied state (an in-memory flag; etcd
// has no notification of it).
const authPoll = 10 * time.Millisecond

// enableAuth turns on the cluster's authentication for secret, or waits
// for it to be on, then checks it is exactly what secret gives. Every
// member runs it as it becomes ready; only the raft leader sets up the
// users, roles and authentication (setUpAuth), the others wait until the
// leader's last step is applied here. Leadership may move while the
// leader sets up: each step is idempotent, so the new leader runs them
// all again, and steps that fail because another member turned
// authentication on first are judged by the check. Members therefore
// never race to add the same users, and a cluster whose members all
// start at once sets up authentication once. fresh says whether this
// member started on an empty data dir, which the error of a failed check
// reflects. It gives up when ctx ends.
func enableAuth(ctx context.Context, s *etcdserver.EtcdServer, secret jobsecret.Secret, fresh bool) error {
	store := s.AuthStore()
	poll := time.NewTicker(authPoll)
	defer poll.Stop()
	for !store.IsAuthEnabled() {
		var err error
		if s.Leader() == s.MemberID() {
			err = setUpAuth(ctx, s, secret)
			if err == nil || store.IsAuthEnabled() || s.Leader() != s.MemberID() {
				continue
			}
			if !transient(err) || ctx.Err() != nil {
				return fmt.Errorf("rendezvous: enable etcd authentication: %w", err)
			}
		}
		select {
		case <-ctx.Done():
			if err != nil {
				return fmt.Errorf("rendezvous: enable etcd authentication: %w (%w)", err, ctx.Err())
			}
			return fmt.Errorf("rendezvous: etcd authentication: waiting for the leader (member %s) to enable it: %w",
				memberName(s, s.Leader()), ctx.Err())
		case <-poll.C:
		}
	}
	if err := checkAuth(store, secret, fresh); err != nil {
		return fmt.Errorf("rendezvous: etcd authentication: %w", err)
	}
	return nil
}

// transient says whether err is one of etcd's errors of a slow or
// changing cluster (a busy machine, an election), after which the same
// request may succeed.
func transient(err error) bool {
	for _, t := range []error{
		etcderr.ErrTimeout, etcderr.ErrTimeoutDueToLeaderFail, etcderr.ErrTimeoutDueToConnectionLost,
		etcderr.ErrTimeoutLeaderTransfer, etcderr.ErrTimeoutWaitAppliedIndex, etcderr.ErrLeaderChanged,
		etcderr.ErrNoLeader, etcderr.ErrNotLeader, etcderr.ErrTooManyRequests,
	} {
		if errors.Is(err, t) {
			return true
		}
	}
	return false
}

// memberName returns the name of member id of s's cluster, or "unknown"
// when there is none (no leader).
func memberName(s *etcdserver.EtcdServer, id types.ID) string {
	if m := s.Cluster().Member(id); m != nil && m.Name != "" {
		return m.Name
	}
	return "unknown"
}

// setUpAuth adds root and AuthUser with AuthUser's role, then enables
// authentication. Users and roles that exist already are kept (checkAuth
// judges them).
func setUpAuth(ctx context.Context, s *etcdserver.EtcdServer, secret jobsecret.Secret) error {
	user, password := Credentials(secret)
	prefixEnd := clientv3.GetPrefixRangeEnd(AuthPrefix)
	steps := []struct {
		what string
		do   func() error
	}{
		{"add user " + rootUser, func() error {
			_, err := s.UserAdd(ctx, &pb.AuthUserAddRequest{Name: rootUser, Password: rootPassword(secret)})
			return ignore(err, auth.ErrUserAlreadyExist)
		}},
		{"grant role " + rootRole + " to " + rootUser, func() error {
			_, err := s.UserGrantRole(ctx, &pb.AuthUserGrantRoleRequest{User: rootUser, Role: rootRole})
			return err
		}},
		{"add role " + authRole, func() error {
			_, err := s.RoleAdd(ctx, &pb.AuthRoleAddRequest{Name: authRole})
			return ignore(err, auth.ErrRoleAlreadyExist)
		}},
		{"grant " + authRole + " read-write on " + AuthPrefix, func() error {
			_, err := s.RoleGrantPermission(ctx, &pb.AuthRoleGrantPermissionRequest{Name: authRole, Perm: &authpb.Permission{
				PermType: authpb.READWRITE, Key: []byte(AuthPrefix), RangeEnd: []byte(prefixEnd),
			}})
			return err
		}},
		{"add user " + user, func() error {
			_, err := s.UserAdd(ctx, &pb.AuthUserAddRequest{Name: user, Password: password})
			return ignore(err, auth.ErrUserAlreadyExist)
		}},
		{"grant role " + authRole + " to " + user, func() error {
			_, err := s.UserGrantRole(ctx, &pb.AuthUserGrantRoleRequest{User: user, Role: authRole})
			return err
		}},
		{"enable", func() error {
			_, err := s.AuthEnable(ctx, &pb.AuthEnableRequest{})
			return err
		}},
	}
	for _, step := range steps {
		if err := step.do(); err != nil {
			return fmt.Errorf("%s: %w", step.what, err)
		}
	}
	return nil
}

// ignore returns nil for err being harmless, else err.
func ignore(err, harmless error) error {
	if errors.Is(err, harmless) {
		return nil
	}
	return err
}

// checkAuth checks this member's view of the authentication it applied:
// on, with exactly root and AuthUser, their passwords from secret, root
// with the root role only, and AuthUser with its role only, which grants
// read-write on AuthPrefix and nothing else.
//
// fresh says whether the member started on an empty data dir: then a
// mismatch means that another member of the cluster was started with a
// different secret; else the data dir may have been set up with another.
func checkAuth(store auth.AuthStore, secret jobsecret.Secret, fresh bool) error {
	if !store.IsAuthEnabled() {
		return errors.New("not enabled")
	}
	fix := "(this member's data dir was set up with another job secret: start with that secret, or with a new data dir)"
	if fresh {
		fix = "(another member of this etcd cluster was started with a different job secret: every gorun of the job needs the same " + jobsecret.EnvVar + ")"
	}
	user, password := Credentials(secret)
	for name, pw := range map[string]string{rootUser: rootPassword(secret), user: password} {
		if _, err := store.CheckPassword(name, pw); err != nil {
			return fmt.Errorf("user %s does not have the job secret's password %s: %w", name, fix, err)
		}
	}
	users, err := store.UserList(&pb.AuthUserListRequest{})
	if err != nil {
		return fmt.Errorf("list users: %w", err)
	}
	if got := slices.Sorted(slices.Values(users.Users)); !slices.Equal(got, []string{user, rootUser}) {
		return fmt.Errorf("users are %q, want only %q and %q %s", got, rootUser, user, fix)
	}
	roles, err := store.RoleList(&pb.AuthRoleListRequest{})
	if err != nil {
		return fmt.Errorf("list roles: %w", err)
	}
	if !slices.Equal(roles.Roles, []string{authRole}) {
		return fmt.Errorf("roles are %q, want only %q %s", roles.Roles, authRole, fix)
	}
	for name, want := range map[string]string{rootUser: rootRole, user: authRole} {
		got, err := store.UserGet(&pb.AuthUserGetRequest{Name: name})
		if err != nil {
			return fmt.Errorf("user %s: %w", name, err)
		}
		if !slices.Equal(got.Roles, []string{want}) {
			return fmt.Errorf("user %s has roles %q, want only %q %s", name, got.Roles, want, fix)
		}
	}
	role, err := store.RoleGet(&pb.AuthRoleGetRequest{Role: authRole})
	if err != nil {
		return fmt.Errorf("role %s: %w", authRole, err)
	}
	want := authpb.Permission{PermType: authpb.READWRITE, Key: []byte(AuthPrefix), RangeEnd: []byte(clientv3.GetPrefixRangeEnd(AuthPrefix))}
	if len(role.Perm) != 1 || role.Perm[0].PermType != want.PermType ||
		string(role.Perm[0].Key) != string(want.Key) || string(role.Perm[0].RangeEnd) != string(want.RangeEnd) {
		return fmt.Errorf("role %s grants %v, want only read-write on %s %s", authRole, role.Perm, AuthPrefix, fix)
	}
	return nil
}
