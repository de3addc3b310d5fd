// Package testcert makes throwaway certificate authorities for tests: a CA
// and the server and client certificates it issues, written as PEM files
// into the test's temporary folder, valid from an hour ago to an hour from
// now.
//
// Every leaf carries the IP SAN 127.0.0.1, so a server certificate
// verifies for a loopback listener; client leaves add the DNS and URI
// SANs an allow-list is tested with. Keys are ECDSA P-256.
package testcert

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"math/big"
	"net"
	"net/url"
	"os"
	"path/filepath"
	"testing"
	"time"
)

// CA is a throwaway certificate authority. Issue is safe for concurrent
// use (each leaf has its own files); the zero value is not usable, make
// one with New.
type CA struct {
	Dir  string         // where the PEM files are written
	File string         // the CA certificate, PEM: what a peer is told to trust
	Pool *x509.CertPool // the CA certificate, for a tls.Config

	cert *x509.Certificate
	key  *ecdsa.PrivateKey
}

// Leaf describes a certificate to issue.
type Leaf struct {
	Name       string           // files Name.pem and Name-key.pem in the CA's Dir
	CommonName string           // the subject's CN; Name when empty
	Usage      x509.ExtKeyUsage // server or client authentication
	DNS        []string         // DNS SANs
	URIs       []string         // URI SANs, such as spiffe://…
}

// New makes a CA whose files live in a fresh t.TempDir().
func New(t testing.TB) *CA {
	t.Helper()
	c := &CA{Dir: t.TempDir()}
	var err error
	if c.key, err = ecdsa.GenerateKey(elliptic.P256(), rand.Reader); err != nil {
		t.Fatalf("testcert: CA key: %v", err)
	}
	tmpl := &x509.Certificate{
		SerialNumber: serial(t), Subject: pkix.Name{CommonName: "test CA"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
		IsCA: true, BasicConstraintsValid: true, KeyUsage: x509.KeyUsageCertSign,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &c.key.PublicKey, c.key)
	if err != nil {
		t.Fatalf("testcert: CA certificate: %v", err)
	}
	if c.cert, err = x509.ParseCertificate(der); err != nil {
		t.Fatalf("testcert: CA certificate: %v", err)
	}
	c.Pool = x509.NewCertPool()
	c.Pool.AddCert(c.cert)
	c.File = c.write(t, "ca.pem", "CERTIFICATE", der)
	return c
}

// Issue signs a certificate described by l and returns the paths of its
// certificate and key files.
func (c *CA) Issue(t testing.TB, l Leaf) (certFile, keyFile string) {
	t.Helper()
	if l.Name == "" || filepath.Base(l.Name) != l.Name {
		t.Fatalf("testcert: leaf name %q is not a plain file name", l.Name)
	}
	cn := l.CommonName
	if cn == "" {
		cn = l.Name
	}
	var uris []*url.URL
	for _, s := range l.URIs {
		u, err := url.Parse(s)
		if err != nil {
			t.Fatalf("testcert: URI SAN %q: %v", s, err)
		}
		uris = append(uris, u)
	}
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatalf("testcert: key of %s: %v", l.Name, err)
	}
	tmpl := &x509.Certificate{
		SerialNumber: serial(t), Subject: pkix.Name{CommonName: cn},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
		KeyUsage: x509.KeyUsageDigitalSignature, ExtKeyUsage: []x509.ExtKeyUsage{l.Usage},
		IPAddresses: []net.IP{net.ParseIP("127.0.0.1")}, DNSNames: l.DNS, URIs: uris,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, c.cert, &key.PublicKey, c.key)
	if err != nil {
		t.Fatalf("testcert: certificate of %s: %v", l.Name, err)
	}
	kder, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		t.Fatalf("testcert: key of %s: %v", l.Name, err)
	}
	return c.write(t, l.Name+".pem", "CERTIFICATE", der), c.write(t, l.Name+"-key.pem", "EC PRIVATE KEY", kder)
}

// KeyPair issues l and loads it, for a tls.Config's Certificates.
func (c *CA) KeyPair(t testing.TB, l Leaf) tls.Certificate {
	t.Helper()
	cf, kf := c.Issue(t, l)
	kp, err := tls.LoadX509KeyPair(cf, kf)
	if err != nil {
		t.Fatalf("testcert: load %s: %v", l.Name, err)
	}
	return kp
}

// Client returns a client's TLS configuration that trusts this CA and
// presents the client certificate l (its Usage is set to client
// authentication).
func (c *CA) Client(t testing.TB, l Leaf) *tls.Config {
	t.Helper()
	l.Usage = x509.ExtKeyUsageClientAuth
	return &tls.Config{RootCAs: c.Pool, Certificates: []tls.Certificate{c.KeyPair(t, l)}}
}

func (c *CA) write(t testing.TB, name, typ string, der []byte) string {
	t.Helper()
	p := filepath.Join(c.Dir, name)
	if err := os.WriteFile(p, pem.EncodeToMemory(&pem.Block{Type: typ, Bytes: der}), 0o600); err != nil {
		t.Fatalf("testcert: %v", err)
	}
	return p
}

// serial is a random 128-bit serial number, so that no two certificates
// of one CA share one.
func serial(t testing.TB) *big.Int {
	t.Helper()
	n, err := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 128))
	if err != nil {
		t.Fatalf("testcert: serial: %v", err)
	}
	return n
}
