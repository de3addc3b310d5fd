package server

import (
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"net/url"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"time"
)

// TLS configures the transport security of the gRPC listeners (the Check
// port and, when it has its own, the access-log port: both present the same
// certificate and trust the same client CA). With CertFile and KeyFile set
// a listener speaks TLS only; with ClientCAFile too, every client (Envoy)
// must present a certificate signed by one of those CAs (mTLS).
type TLS struct {
	CertFile     string
	KeyFile      string
	ClientCAFile string
	// AllowedClients, when set, narrows mTLS on the Check port to client
	// certificates that carry one of these names as a subject alternative
	// name: a DNS name (compared without regard to case) or a URI such as
	// a SPIFFE ID (compared exactly). The subject common name is never
	// consulted. Needs ClientCAFile. Empty: any certificate of the CA.
	AllowedClients []string
}

func (t TLS) enabled() bool {
	return t.CertFile != "" || t.KeyFile != "" || t.ClientCAFile != "" || len(t.AllowedClients) > 0
}

// maxClientName bounds one allowed name: a URI SAN longer than this is not
// something a CA issues for a proxy.
const maxClientName = 1024

// allowList is the set of client certificate names a listener accepts.
// The zero value (no names) accepts any certificate.
type allowList struct {
	dns  map[string]struct{} // lower-case DNS names
	uris map[string]struct{} // URIs as url.URL.String() prints them
}

// parseAllowList validates the names. A name with a colon is a URI (it
// must have a scheme and no spaces); any other is a DNS name: letters,
// digits, '-' and '.', no wildcard (a wildcard name would allow a whole
// domain of clients, which an allow-list exists to prevent).
func parseAllowList(names []string) (allowList, error) {
	a := allowList{dns: map[string]struct{}{}, uris: map[string]struct{}{}}
	for _, n := range names {
		if n == "" || len(n) > maxClientName {
			return allowList{}, fmt.Errorf("server: allowed client name %q: must be 1 to %d bytes", clip(n), maxClientName)
		}
		for i := 0; i < len(n); i++ {
			if c := n[i]; c <= ' ' || c >= 0x7f || c == ',' {
				return allowList{}, fmt.Errorf("server: allowed client name %q: only printable ASCII without spaces or commas", clip(n))
			}
		}
		if strings.Contains(n, ":") {
			u, err := url.Parse(n)
			if err != nil || u.Scheme == "" || u.Opaque == "" && u.Host == "" && u.Path == "" {
				return allowList{}, fmt.Errorf("server: allowed client name %q: not a URI with a scheme", clip(n))
			}
			a.uris[u.String()] = struct{}{}
			continue
		}
		if !validDNSName(n) {
			return allowList{}, fmt.Errorf("server: allowed client name %q: not a DNS name (letters, digits, '-', '.'; no wildcard)", clip(n))
		}
		a.dns[strings.ToLower(n)] = struct{}{}
	}
	return a, nil
}

func validDNSName(n string) bool {
	if len(n) > 253 {
		return false
	}
	for _, label := range strings.Split(n, ".") {
		if label == "" || len(label) > 63 || label[0] == '-' || label[len(label)-1] == '-' {
			return false
		}
		for i := 0; i < len(label); i++ {
			c := label[i]
			if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '-') {
				return false
			}
		}
	}
	return true
}

func (a allowList) empty() bool { return len(a.dns) == 0 && len(a.uris) == 0 }

// allows reports whether the certificate carries an allowed name.
func (a allowList) allows(c *x509.Certificate) bool {
	for _, n := range c.DNSNames {
		if _, ok := a.dns[strings.ToLower(n)]; ok {
			return true
		}
	}
	for _, u := range c.URIs {
		if _, ok := a.uris[u.String()]; ok {
			return true
		}
	}
	return false
}

// certNames is a certificate's SAN names, clipped, for a log line.
func certNames(c *x509.Certificate) []string {
	var out []string
	for _, n := range c.DNSNames {
		out = append(out, clip(n))
	}
	for _, u := range c.URIs {
		out = append(out, clip(u.String()))
	}
	if len(out) > 8 {
		out = append(out[:8], "…")
	}
	return out
}

// clip bounds a name quoted in an error or a log line.
func clip(s string) string {
	if len(s) > 64 {
		return s[:64] + "…"
	}
	return s
}

// config loads the files once to fail early, and returns a tls.Config that
// picks up a rotated certificate at the next handshake: Envoy keeps its
// connections for long, so a handshake is rare and a stat is cheap. A
// client certificate whose names are not in allowed fails the handshake
// (the client never reaches a service) and is counted in refused; onRefuse
// is told its names.
func (t TLS) config(allowed allowList, refused *atomic.Uint64, onRefuse func(names []string)) (*tls.Config, error) {
	if t.CertFile == "" || t.KeyFile == "" {
		return nil, errors.New("server: TLS needs both a certificate and a key file")
	}
	kp := &keyPair{certFile: t.CertFile, keyFile: t.KeyFile}
	if _, err := kp.get(); err != nil {
		return nil, err
	}
	cfg := &tls.Config{
		MinVersion: tls.VersionTLS12,
		NextProtos: []string{"h2"},
		GetCertificate: func(*tls.ClientHelloInfo) (*tls.Certificate, error) {
			return kp.get()
		},
	}
	if t.ClientCAFile == "" {
		if !allowed.empty() {
			return nil, errors.New("server: allowed client names need a client CA file (mTLS)")
		}
		return cfg, nil
	}
	pem, err := os.ReadFile(t.ClientCAFile)
	if err != nil {
		return nil, fmt.Errorf("server: read client CA: %w", err)
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(pem) {
		return nil, fmt.Errorf("server: client CA %s holds no PEM certificate", t.ClientCAFile)
	}
	cfg.ClientCAs = pool
	cfg.ClientAuth = tls.RequireAndVerifyClientCert
	if !allowed.empty() {
		// Runs after the chain is verified, on full and resumed handshakes.
		cfg.VerifyConnection = func(cs tls.ConnectionState) error {
			if len(cs.PeerCertificates) == 0 {
				return errors.New("server: no client certificate")
			}
			if leaf := cs.PeerCertificates[0]; !allowed.allows(leaf) {
				refused.Add(1)
				onRefuse(certNames(leaf))
				return errors.New("server: client certificate name not allowed")
			}
			return nil
		}
	}
	return cfg, nil
}

// keyPair is a certificate and key reloaded when the certificate file
// changes (rotation by cert-manager and the like, without a restart).
type keyPair struct {
	certFile, keyFile string

	mu      sync.Mutex
	cert    *tls.Certificate
	modTime time.Time
}

func (k *keyPair) get() (*tls.Certificate, error) {
	st, err := os.Stat(k.certFile)
	if err != nil {
		return nil, fmt.Errorf("server: TLS certificate: %w", err)
	}
	k.mu.Lock()
	defer k.mu.Unlock()
	if k.cert != nil && st.ModTime().Equal(k.modTime) {
		return k.cert, nil
	}
	c, err := tls.LoadX509KeyPair(k.certFile, k.keyFile)
	if err != nil {
		if k.cert != nil {
			return k.cert, nil // half-written rotation: keep serving the old one
		}
		return nil, fmt.Errorf("server: load TLS key pair: %w", err)
	}
	k.cert, k.modTime = &c, st.ModTime()
	return k.cert, nil
}
