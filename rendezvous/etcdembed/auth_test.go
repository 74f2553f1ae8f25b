package etcdembed

import (
	"context"
	"crypto/tls"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"

	"github.com/gorun/gorun/internal/jobsecret"
)

// dial returns a client of endpoints as user (none: ""), closed in t's
// cleanup, or the error of its authentication. With a non-zero secret it
// speaks the secret's TLS (ClientTLS), endpoints made https.
func dial(t *testing.T, endpoints []string, secret jobsecret.Secret, user, password string) (*clientv3.Client, error) {
	t.Helper()
	cfg := clientv3.Config{
		Endpoints: endpoints, DialTimeout: 5 * time.Second, Logger: zap.NewNop(),
		Username: user, Password: password,
	}
	if !secret.IsZero() {
		tlsCfg, err := ClientTLS(secret)
		require.NoError(t, err)
		cfg.TLS = tlsCfg
		cfg.Endpoints = nil
		for _, ep := range endpoints {
			cfg.Endpoints = append(cfg.Endpoints, "https://"+strings.TrimPrefix(strings.TrimPrefix(ep, "http://"), "https://"))
		}
	}
	cli, err := clientv3.New(cfg)
	if err != nil {
		return nil, err
	}
	t.Cleanup(func() { _ = cli.Close() })
	return cli, nil
}

func newSecret(t testing.TB) jobsecret.Secret {
	s, err := jobsecret.New()
	require.NoError(t, err)
	return s
}

// requireGuarded checks that a member started with secret lets only its
// credentials in, and them only under AuthPrefix.
func requireGuarded(t *testing.T, ctx context.Context, endpoints []string, secret jobsecret.Secret) {
	t.Helper()
	user, password := Credentials(secret)
	agent, err := dial(t, endpoints, secret, user, password)
	require.NoError(t, err)
	_, err = agent.Put(ctx, AuthPrefix+"job/state", `{"phase":"running"}`)
	require.NoError(t, err)
	resp, err := agent.Get(ctx, AuthPrefix, clientv3.WithPrefix())
	require.NoError(t, err)
	require.NotEmpty(t, resp.Kvs)
	_, err = agent.Put(ctx, "/elsewhere", "x")
	require.ErrorContains(t, err, "permission denied", "the agents' user reaches only "+AuthPrefix)

	// The job's client certificate without the password is the agents'
	// user (ClientCertCN): the job's keys, nothing else. An agent that
	// connected before authentication was on relies on it.
	certOnly, err := dial(t, endpoints, secret, "", "")
	require.NoError(t, err)
	_, err = certOnly.Get(ctx, AuthPrefix, clientv3.WithPrefix())
	require.NoError(t, err)
	_, err = certOnly.Put(ctx, "/elsewhere", "x")
	require.ErrorContains(t, err, "permission denied")

	_, other := Credentials(newSecret(t))
	for _, u := range []string{user, rootUser} {
		_, err = dial(t, endpoints, secret, u, other)
		require.ErrorContains(t, err, "authentication failed", "user %s with another secret's password", u)
	}
}

func TestCredentials(t *testing.T) {
	s := newSecret(t)
	user, password := Credentials(s)
	require.Equal(t, AuthUser, user)
	require.Len(t, password, 64)
	u2, p2 := Credentials(s)
	require.Equal(t, user+password, u2+p2, "a pure function of the secret")
	_, other := Credentials(newSecret(t))
	require.NotEqual(t, password, other)
	require.NotContains(t, password, s.Encode())
	require.NotEqual(t, password, rootPassword(s))
	u0, p0 := Credentials(jobsecret.Secret{})
	require.Empty(t, u0+p0)
}

// A member started with a secret lets in only that secret's user, and a
// restart on its data dir needs the same secret.
func TestServerAuth(t *testing.T) {
	ctx := testCtx(t)
	secret := newSecret(t)
	cfg := fastServer(t)
	cfg.Secret = secret
	s, err := Start(ctx, cfg)
	require.NoError(t, err)
	requireGuarded(t, ctx, s.Endpoints(), secret)
	require.NoError(t, s.Close())

	s, err = Start(ctx, cfg)
	require.NoError(t, err, "a restart with the same secret")
	requireGuarded(t, ctx, s.Endpoints(), secret)
	require.NoError(t, s.Close())

	cfg.Secret = newSecret(t)
	_, err = Start(ctx, cfg)
	require.ErrorContains(t, err, "does not have the job secret's password")
	require.ErrorContains(t, err, "etcd member m0")
}

// Users that someone made before authentication was on are not taken
// for gorun's: the member refuses to start.
func TestServerAuthRefusesForeignUsers(t *testing.T) {
	ctx := testCtx(t)
	tests := []struct {
		name  string
		setUp func(*clientv3.Client) error
		want  string
	}{
		{"foreign root", func(c *clientv3.Client) error {
			_, err := c.UserAdd(ctx, rootUser, "guessed")
			return err
		}, "user root does not have the job secret's password"},
		{"extra user", func(c *clientv3.Client) error {
			_, err := c.UserAdd(ctx, "eve", "eve")
			return err
		}, `users are ["eve" "gorun" "root"]`},
		{"extra permission", func(c *clientv3.Client) error {
			if _, err := c.RoleAdd(ctx, authRole); err != nil {
				return err
			}
			_, err := c.RoleGrantPermission(ctx, authRole, "/", "\x00", clientv3.PermissionType(clientv3.PermReadWrite))
			return err
		}, "want only read-write on /gorun/"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			cfg := fastServer(t)
			s, err := Start(ctx, cfg)
			require.NoError(t, err)
			cli, err := dial(t, s.Endpoints(), jobsecret.Secret{}, "", "")
			require.NoError(t, err)
			require.NoError(t, tc.setUp(cli))
			require.NoError(t, cli.Close())
			require.NoError(t, s.Close())

			cfg.Secret = newSecret(t)
			_, err = Start(ctx, cfg)
			require.ErrorContains(t, err, tc.want)
		})
	}
}

// The three members of a job's embedded etcd, each its own process,
// start at once with one secret: each sets up authentication or finds it
// set up by another, and every member guards the keys.
func TestServerClusterAuth(t *testing.T) {
	hosts := []string{"127.0.0.1", "127.0.0.2", "127.0.0.3"}
	cfgs := clusterOn(t, hosts, t.TempDir())
	secret := newSecret(t)
	startMembers(t, cfgs, secret)
	ctx := testCtx(t)
	for _, cfg := range cfgs {
		requireGuarded(t, ctx, []string{"http://" + cfg.ClientAddr}, secret)
	}
}

// BenchmarkConnect measures what an agent's connection costs a member:
// a client built and its first Get, with the secret's credentials (one
// login: a bcrypt check and a raft entry) and, for comparison, without
// authentication.
func BenchmarkConnect(b *testing.B) {
	for _, withSecret := range []bool{false, true} {
		name := "no-auth"
		if withSecret {
			name = "secret"
		}
		b.Run(name, func(b *testing.B) {
			cfg := fastServer(b)
			var user, password string
			var tlsCfg *tls.Config
			if withSecret {
				cfg.Secret = newSecret(b)
				user, password = Credentials(cfg.Secret)
				var err error
				tlsCfg, err = ClientTLS(cfg.Secret)
				require.NoError(b, err)
			}
			s, err := Start(context.Background(), cfg)
			require.NoError(b, err)
			defer s.Close()
			ctx := context.Background()
			b.ResetTimer()
			for range b.N {
				cli, err := clientv3.New(clientv3.Config{Endpoints: s.Endpoints(), DialTimeout: 5 * time.Second, Logger: zap.NewNop(), Username: user, Password: password, TLS: tlsCfg})
				require.NoError(b, err)
				_, err = cli.Get(ctx, AuthPrefix+"x")
				require.NoError(b, err)
				require.NoError(b, cli.Close())
			}
		})
	}
}
