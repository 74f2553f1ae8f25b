package etcdembed

import (
	"crypto/ed25519"
	"crypto/sha256"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/hex"
	"encoding/pem"
	"errors"
	"fmt"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"github.com/gorun/gorun/internal/jobsecret"
)

// ClientCertCN is the common name of the client certificate PKI.Client
// gives: AuthUser. etcd takes a verified client certificate's common name
// for the user of a request that carries no password (or no token yet),
// so the certificate alone gives AuthUser's rights: read-write under
// AuthPrefix. Both it and AuthUser's password come from the job secret.
// It must name that user: an agent that connects while the leader is
// still turning authentication on gets no token (authentication is off
// then) and is judged by its certificate afterwards; a certificate naming
// no user made every request of such an agent "permission denied" (seen on
// 2-node SLURM jobs, whose second node connects at once).
const ClientCertCN = AuthUser

// jobsecret.Key purposes of the PKI's keys.
const (
	caKeyPurpose     = "tls-ca"
	clientKeyPurpose = "tls-client"
	serverKeyPurpose = "tls-member"
)

// Every certificate of a PKI is valid from certNotBefore to certNotAfter
// (RFC 5280's "no well-defined expiration date"): a certificate must be
// byte-identical wherever it is made, so its validity cannot follow a
// clock; a job secret lives as long as its job, and so do they.
var (
	certNotBefore = time.Date(2020, 1, 1, 0, 0, 0, 0, time.UTC)
	certNotAfter  = time.Date(9999, 12, 31, 23, 59, 59, 0, time.UTC)
)

// PKI is the certificate authority of one job, derived from its job
// secret: every holder of the secret derives the same CA (an Ed25519 key
// from secret.Key("tls-ca"), a self-signed certificate with a fixed
// serial number and validity; Ed25519 signatures are deterministic), so
// that members and agents trust each other with nothing to distribute.
// Each member signs its own server certificate; agents sign their own
// client certificate. The zero PKI is not usable: use NewPKI.
type PKI struct {
	caKey  ed25519.PrivateKey
	caCert *x509.Certificate
	caDER  []byte
	tag    string // a short fingerprint of the CA key, in its name
}

// NewPKI derives the PKI of secret. The zero secret is an error: a CA
// anyone can compute protects nothing.
func NewPKI(secret jobsecret.Secret) (*PKI, error) {
	if secret.IsZero() {
		return nil, errors.New("rendezvous: TLS: no job secret to derive a certificate authority from")
	}
	key := ed25519.NewKeyFromSeed(secret.Key(caKeyPurpose))
	pub := key.Public().(ed25519.PublicKey)
	sum := sha256.Sum256(pub)
	p := &PKI{caKey: key, tag: hex.EncodeToString(sum[:6])}
	tmpl := &x509.Certificate{
		SerialNumber:          big.NewInt(1),
		Subject:               pkix.Name{CommonName: "gorun job CA " + p.tag},
		NotBefore:             certNotBefore,
		NotAfter:              certNotAfter,
		KeyUsage:              x509.KeyUsageCertSign | x509.KeyUsageCRLSign | x509.KeyUsageDigitalSignature,
		BasicConstraintsValid: true,
		IsCA:                  true,
		MaxPathLenZero:        true,
		SubjectKeyId:          sum[:20],
	}
	der, err := x509.CreateCertificate(nil, tmpl, tmpl, pub, key)
	if err != nil {
		return nil, fmt.Errorf("rendezvous: TLS: make the job CA: %w", err)
	}
	if p.caCert, err = x509.ParseCertificate(der); err != nil {
		return nil, fmt.Errorf("rendezvous: TLS: parse the job CA: %w", err)
	}
	p.caDER = der
	return p, nil
}

// CAPEM returns the CA's certificate in PEM: the same bytes for every
// holder of the secret (etcdctl's --cacert, openssl's -CAfile).
func (p *PKI) CAPEM() []byte {
	return pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: p.caDER})
}

// Name returns the CA's subject common name, "gorun job CA <tag>", where
// the tag is a fingerprint of its key that tells jobs apart.
func (p *PKI) Name() string { return p.caCert.Subject.CommonName }

// Client returns the job's client certificate and its key, in PEM: common
// name ClientCertCN, no addresses, for client authentication only, the
// same for every holder of the secret (its key comes from
// secret.Key("tls-client")).
func (p *PKI) Client(secret jobsecret.Secret) (certPEM, keyPEM []byte, err error) {
	key := ed25519.NewKeyFromSeed(secret.Key(clientKeyPurpose))
	tmpl := &x509.Certificate{
		Subject:     pkix.Name{CommonName: ClientCertCN},
		KeyUsage:    x509.KeyUsageDigitalSignature,
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth},
	}
	return p.sign(tmpl, key, "client")
}

// server returns a member's certificate and key, in PEM: for both server
// and client authentication (a member dials its peers with it), with the
// given addresses and host names as subject alternative names, so that
// etcdctl and openssl verify it as they would any server's.
func (p *PKI) server(secret jobsecret.Secret, name string, ips []net.IP, hosts []string) (certPEM, keyPEM []byte, err error) {
	key := ed25519.NewKeyFromSeed(secret.Key(serverKeyPurpose + ": " + name))
	tmpl := &x509.Certificate{
		Subject:     pkix.Name{CommonName: "gorun etcd member " + name},
		KeyUsage:    x509.KeyUsageDigitalSignature,
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth, x509.ExtKeyUsageClientAuth},
		IPAddresses: ips,
		DNSNames:    hosts,
	}
	return p.sign(tmpl, key, "member "+name)
}

// sign completes tmpl (serial from its contents, the PKI's validity,
// issuer) and signs it with the CA.
func (p *PKI) sign(tmpl *x509.Certificate, key ed25519.PrivateKey, what string) (certPEM, keyPEM []byte, err error) {
	pub := key.Public().(ed25519.PublicKey)
	h := sha256.New()
	h.Write(pub)
	h.Write([]byte(tmpl.Subject.CommonName))
	for _, ip := range tmpl.IPAddresses {
		h.Write(ip)
	}
	h.Write([]byte(strings.Join(tmpl.DNSNames, ",")))
	serial := new(big.Int).SetBytes(h.Sum(nil)[:16])
	tmpl.SerialNumber = serial.SetBit(serial, 127, 0).Add(serial, big.NewInt(2)) // positive, never the CA's 1
	tmpl.NotBefore, tmpl.NotAfter = certNotBefore, certNotAfter
	tmpl.BasicConstraintsValid = true
	der, err := x509.CreateCertificate(nil, tmpl, p.caCert, pub, p.caKey)
	if err != nil {
		return nil, nil, fmt.Errorf("rendezvous: TLS: sign the %s certificate: %w", what, err)
	}
	pkcs8, err := x509.MarshalPKCS8PrivateKey(key)
	if err != nil {
		return nil, nil, fmt.Errorf("rendezvous: TLS: encode the %s key: %w", what, err)
	}
	return pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}),
		pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: pkcs8}), nil
}

// ClientTLS returns the TLS configuration with which an agent holding
// secret reaches a member started with it: the job's client certificate
// (Client), and trust in the job's CA alone. The server's certificate
// must chain to that CA for server authentication; its names are not
// checked against the address dialled, since only holders of the secret
// can have such a certificate at all and an agent may reach a member by
// any of its names.
func ClientTLS(secret jobsecret.Secret) (*tls.Config, error) {
	p, err := NewPKI(secret)
	if err != nil {
		return nil, err
	}
	certPEM, keyPEM, err := p.Client(secret)
	if err != nil {
		return nil, err
	}
	pair, err := tls.X509KeyPair(certPEM, keyPEM)
	if err != nil {
		return nil, fmt.Errorf("rendezvous: TLS: client key pair: %w", err)
	}
	roots := x509.NewCertPool()
	roots.AddCert(p.caCert)
	return &tls.Config{
		MinVersion:         tls.VersionTLS12,
		Certificates:       []tls.Certificate{pair},
		RootCAs:            roots,
		InsecureSkipVerify: true, // names unchecked: VerifyConnection checks the chain
		VerifyConnection: func(cs tls.ConnectionState) error {
			return verifyChain(cs, roots)
		},
	}, nil
}

// verifyChain checks that the server's certificate chains to roots for
// server authentication.
func verifyChain(cs tls.ConnectionState, roots *x509.CertPool) error {
	if len(cs.PeerCertificates) == 0 {
		return errors.New("rendezvous: TLS: the server sent no certificate")
	}
	inter := x509.NewCertPool()
	for _, c := range cs.PeerCertificates[1:] {
		inter.AddCert(c)
	}
	_, err := cs.PeerCertificates[0].Verify(x509.VerifyOptions{
		Roots: roots, Intermediates: inter, KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
	})
	if err != nil {
		return fmt.Errorf("rendezvous: TLS: the server's certificate is not from this job's secret (another job's etcd at this address, or another %s?): %w",
			jobsecret.EnvVar, err)
	}
	return nil
}

// TLS file names in a member's tlsDir.
const (
	tlsCAFile   = "ca.pem"
	tlsCertFile = "member.pem"
	tlsKeyFile  = "member-key.pem"
)

// memberTLSFiles holds the paths of a member's TLS files.
type memberTLSFiles struct{ ca, cert, key string }

// writeMemberTLS writes the job CA and member name's certificate (for
// ips and hosts) and key into dir (made 0700; the files 0600), where
// etcd, which takes only files, reads them.
func writeMemberTLS(dir string, secret jobsecret.Secret, name string, ips []net.IP, hosts []string) (memberTLSFiles, error) {
	p, err := NewPKI(secret)
	if err != nil {
		return memberTLSFiles{}, err
	}
	certPEM, keyPEM, err := p.server(secret, name, ips, hosts)
	if err != nil {
		return memberTLSFiles{}, err
	}
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return memberTLSFiles{}, fmt.Errorf("rendezvous: TLS files: %w", err)
	}
	f := memberTLSFiles{ca: filepath.Join(dir, tlsCAFile), cert: filepath.Join(dir, tlsCertFile), key: filepath.Join(dir, tlsKeyFile)}
	for path, data := range map[string][]byte{f.ca: p.CAPEM(), f.cert: certPEM, f.key: keyPEM} {
		if err := os.WriteFile(path, data, 0o600); err != nil {
			return memberTLSFiles{}, fmt.Errorf("rendezvous: TLS files: %w", err)
		}
	}
	return f, nil
}

// certNames splits the hosts of a member's URLs and addresses into the IP
// addresses and host names its certificate names, each once, in order.
func certNames(hosts ...string) (ips []net.IP, names []string) {
	for _, h := range hosts {
		if ip := net.ParseIP(h); ip != nil {
			if !slices.ContainsFunc(ips, ip.Equal) {
				ips = append(ips, ip)
			}
		} else if h != "" && !slices.Contains(names, h) {
			names = append(names, h)
		}
	}
	return ips, names
}

// ClientFiles are the files with which a holder of a job secret points
// etcdctl (or any etcd client) at an etcd gorun runs with that secret.
type ClientFiles struct {
	CA, Cert, Key string // PEM: the job CA, the client certificate and its key
	Password      string // AuthUser's password (Credentials), without a newline
}

// WriteClientFiles writes the job CA (ca.pem), the client certificate
// (client.pem) and key (client-key.pem), and AuthUser's password
// (password) of secret into dir, made 0700 if need be, every file 0600,
// and returns their paths.
func WriteClientFiles(dir string, secret jobsecret.Secret) (ClientFiles, error) {
	p, err := NewPKI(secret)
	if err != nil {
		return ClientFiles{}, err
	}
	certPEM, keyPEM, err := p.Client(secret)
	if err != nil {
		return ClientFiles{}, err
	}
	_, password := Credentials(secret)
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return ClientFiles{}, fmt.Errorf("rendezvous: client files: %w", err)
	}
	f := ClientFiles{
		CA: filepath.Join(dir, "ca.pem"), Cert: filepath.Join(dir, "client.pem"),
		Key: filepath.Join(dir, "client-key.pem"), Password: filepath.Join(dir, "password"),
	}
	for _, w := range []struct {
		path string
		data []byte
	}{{f.CA, p.CAPEM()}, {f.Cert, certPEM}, {f.Key, keyPEM}, {f.Password, []byte(password)}} {
		if err := os.WriteFile(w.path, w.data, 0o600); err != nil {
			return ClientFiles{}, fmt.Errorf("rendezvous: client files: %w", err)
		}
	}
	return f, nil
}

// EtcdctlShell returns a shell command line that runs etcdctl against
// endpoints with f, the password read from its file when the line runs;
// etcdctl's command (e.g. "get --prefix /gorun/") follows it.
func (f ClientFiles) EtcdctlShell(endpoints []string) string {
	return fmt.Sprintf("etcdctl --endpoints=%s --cacert=%s --cert=%s --key=%s --user=%s:\"$(cat %s)\"",
		shellWord(httpsEndpoints(endpoints)), shellWord(f.CA), shellWord(f.Cert), shellWord(f.Key), AuthUser, shellWord(f.Password))
}

// httpsEndpoints joins endpoints with commas, each with https://.
func httpsEndpoints(endpoints []string) string {
	out := make([]string, len(endpoints))
	for i, ep := range endpoints {
		_, rest, ok := strings.Cut(ep, "://")
		if !ok {
			rest = ep
		}
		out[i] = "https://" + rest
	}
	return strings.Join(out, ",")
}

// shellWord quotes s for a POSIX shell when it needs it.
func shellWord(s string) string {
	if s != "" && strings.IndexFunc(s, func(r rune) bool {
		return !(r == '/' || r == '.' || r == '-' || r == '_' || r == ':' || r == ',' || r == '=' ||
			r >= '0' && r <= '9' || r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z')
	}) < 0 {
		return s
	}
	return "'" + strings.ReplaceAll(s, "'", `'\''`) + "'"
}
