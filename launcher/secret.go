package launcher

import (
	"fmt"
	"strings"

	"github.com/gorun/gorun/internal/jobsecret"
	"github.com/gorun/gorun/rendezvous/etcdembed"
	"github.com/gorun/gorun/rendezvous/etcdstore"
)

// Where a Launch's job secret came from (Launch.SecretSource).
const (
	secretFromEnv  = "GORUN_JOB_SECRET"
	secretFromFile = "--job-secret-file"
	secretNew      = "made for this one-node launch"
)

// UnauthenticatedWarning says why a launch of several nodes without a job
// secret runs unauthenticated; the CLI logs it once.
const UnauthenticatedWarning = "no job secret (GORUN_JOB_SECRET or --job-secret-file): the workers of this job do not authenticate each other, " +
	"so any user who can reach its nodes and knows its run id can join it as a worker or disturb it. " +
	"Use gorun sbatch (it makes one per job), or export GORUN_JOB_SECRET=$(gorun job-secret) before srun"

// GivenSecret returns the job secret the user gave: GORUN_JOB_SECRET
// (read through lookup), or the file of --job-secret-file (file; ""
// for none), and where it came from. Neither gives the zero Secret and
// source ""; both, or a malformed value or file, is an error naming
// the variable or the flag (never the value).
func GivenSecret(lookup func(string) (string, bool), file string) (secret jobsecret.Secret, source string, err error) {
	fromEnv, err := jobsecret.FromEnv(lookup)
	switch {
	case err != nil:
		return jobsecret.Secret{}, "", err
	case !fromEnv.IsZero() && file != "":
		return jobsecret.Secret{}, "", fmt.Errorf("%s is set and --job-secret-file=%s is given: give one of them", jobsecret.EnvVar, file)
	case !fromEnv.IsZero():
		return fromEnv, secretFromEnv, nil
	case file != "":
		if secret, err = jobsecret.ReadFile(file); err != nil {
			return jobsecret.Secret{}, "", fmt.Errorf("--job-secret-file: %w", err)
		}
		return secret, secretFromFile + " " + file, nil
	}
	return jobsecret.Secret{}, "", nil
}

// resolveSecret picks the job secret: GORUN_JOB_SECRET, else
// --job-secret-file, else a fresh one for a launch of one node (no other
// agent needs to know it). A launch of several nodes without one runs
// unauthenticated. The secret reaches every worker in GORUN_JOB_SECRET;
// a given one (or any, for an embedded etcd) opens the etcd rendezvous
// (secureRendezvous).
func (l *Launch) resolveSecret(opts Options, host Host) error {
	secret, source, err := GivenSecret(host.Lookup, opts.JobSecretFile)
	if err != nil {
		return usagef("%v", err)
	}
	switch {
	case !secret.IsZero():
		l.Secret, l.SecretSource = secret, source
		if err := l.secureRendezvous(); err != nil {
			return err
		}
	case l.MaxNodes == 1:
		if l.Secret, err = jobsecret.New(); err != nil {
			return err
		}
		l.SecretSource = secretNew
		if l.Rendezvous.Embedded != nil {
			if err := l.secureRendezvous(); err != nil { // its own etcd; another etcd cannot know this secret
				return err
			}
		}
	default:
		l.SecretSource = "none"
		return nil
	}
	l.Environ = setEnv(l.Environ, jobsecret.EnvVar, l.Secret.Encode())
	return nil
}

// secureRendezvous gives the etcd rendezvous the job secret's
// credentials and TLS (SecretCredentials) unless --rdzv-conf gives a user
// or a client certificate, which an external etcd may need. An embedded
// etcd speaks only TLS with the secret: its agents never try plain HTTP.
func (l *Launch) secureRendezvous() error {
	r := &l.Rendezvous
	if r.Backend != BackendEtcd {
		return nil
	}
	client, ok, err := SecretCredentials(r.Client, l.Secret)
	if err != nil {
		return err
	}
	if ok {
		r.Client, r.Auth = client, rdzvAuthSecret
		r.Client.TLSIfOffered = r.Client.TLSIfOffered && r.Embedded == nil
	}
	return nil
}

// rdzvAuthSecret is Rendezvous.Auth when the job secret opens the
// rendezvous.
const rdzvAuthSecret = "job secret (etcd user " + etcdembed.AuthUser + ")"

// SecretCredentials returns cfg with the user and password of secret
// (etcdembed.Credentials) and its TLS (etcdembed.ClientTLS): what an etcd
// that gorun runs with that secret (embedded, or gorun rendezvous serve)
// asks for. TLS is used where the etcd offers it (TLSIfOffered): an etcd
// that gorun does not run speaks plain HTTP and ignores the user and
// password when it has no authentication. cfg is returned as it is, with
// false, when secret is zero or cfg has a user or a client certificate
// of its own (--rdzv-conf user=, cert=); with a CA of its own (cacert=)
// it gets the user and password only.
func SecretCredentials(cfg etcdstore.ClientConfig, secret jobsecret.Secret) (etcdstore.ClientConfig, bool, error) {
	if secret.IsZero() || cfg.User != "" || cfg.Cert != "" {
		return cfg, false, nil
	}
	if cfg.CACert == "" && cfg.TLS == nil {
		tlsCfg, err := etcdembed.ClientTLS(secret)
		if err != nil {
			return cfg, false, err
		}
		cfg.TLS, cfg.TLSIfOffered = tlsCfg, true
	}
	cfg.User, cfg.Password = etcdembed.Credentials(secret)
	return cfg, true, nil
}

// Unauthenticated reports whether l runs without a job secret.
func (l *Launch) Unauthenticated() bool { return l.Secret.IsZero() }

// setEnv returns environ with key set to value (once), in a new slice.
func setEnv(environ []string, key, value string) []string {
	out := make([]string, 0, len(environ)+1)
	for _, kv := range environ {
		if k, _, _ := strings.Cut(kv, "="); k != key {
			out = append(out, kv)
		}
	}
	return append(out, key+"="+value)
}

// Redact masks what `gorun plan` must not print: the rendezvous
// password, the job secret and any environment variable whose name says
// it holds a password, secret or token (--rdzv-conf in GORUN_RDZV_CONF or
// PET_RDZV_CONF is masked key by key). l must not be run afterwards.
func (l *Launch) Redact() {
	if len(l.Rendezvous.Conf) > 0 {
		conf := make(map[string]string, len(l.Rendezvous.Conf))
		for k, v := range l.Rendezvous.Conf {
			conf[k] = v
			if k == etcdstore.ConfPassword {
				conf[k] = jobsecret.Redacted
			}
		}
		l.Rendezvous.Conf = conf
	}
	for i, env := range l.WorkerEnv {
		l.WorkerEnv[i] = redactEnv(env)
	}
}

// redactEnv returns environ with secret values masked.
func redactEnv(environ []string) []string {
	out := make([]string, len(environ))
	for i, kv := range environ {
		k, v, _ := strings.Cut(kv, "=")
		switch up := strings.ToUpper(k); {
		case up == "GORUN_RDZV_CONF" || up == "PET_RDZV_CONF":
			v = redactConf(v)
		case strings.Contains(up, "PASSWORD") || strings.Contains(up, "SECRET") || strings.Contains(up, "TOKEN"):
			v = jobsecret.Redacted
		}
		out[i] = k + "=" + v
	}
	return out
}

// redactConf masks the password in a --rdzv-conf value k=v,...
func redactConf(conf string) string {
	parts := strings.Split(conf, ",")
	for i, kv := range parts {
		if k, _, ok := strings.Cut(kv, "="); ok && strings.TrimSpace(k) == etcdstore.ConfPassword {
			parts[i] = k + "=" + jobsecret.Redacted
		}
	}
	return strings.Join(parts, ",")
}

// secretLines are the shell lines of a batch script that give the job a
// fresh secret when it starts (gorun job-secret), unless env sets one.
func secretLines(gorun string, env []string) string {
	for _, kv := range env {
		if k, _, _ := strings.Cut(kv, "="); k == jobsecret.EnvVar {
			return ""
		}
	}
	return fmt.Sprintf("# A fresh secret for each run of this job, made when it starts (never written to a file):\n"+
		"# srun passes it to every gorun, and gorun to every worker; only they can join the job.\n"+
		"%s=\"$(%s job-secret)\" || exit 1\nexport %s\n", jobsecret.EnvVar, ShellQuote(gorun), jobsecret.EnvVar)
}
