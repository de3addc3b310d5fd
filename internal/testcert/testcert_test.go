package testcert_test

import (
	"crypto/tls"
	"crypto/x509"
	"net"
	"os"
	"testing"
	"time"

	"github.com/ratelimit-authz/ratelimit-authz/internal/testcert"
)

// A server and a client certificate of one CA complete a mutual TLS
// handshake over loopback, each side seeing the other's names; a client of
// another CA is refused.
func TestMutualHandshake(t *testing.T) {
	ca := testcert.New(t)
	cf, kf := ca.Issue(t, testcert.Leaf{Name: "server", Usage: x509.ExtKeyUsageServerAuth})
	srvCert, err := tls.LoadX509KeyPair(cf, kf)
	if err != nil {
		t.Fatal(err)
	}
	if fi, err := os.Stat(kf); err != nil || fi.Mode().Perm() != 0o600 {
		t.Errorf("key file %s: %v %v, want mode 0600", kf, fi.Mode(), err)
	}
	l, err := tls.Listen("tcp", "127.0.0.1:0", &tls.Config{
		Certificates: []tls.Certificate{srvCert}, ClientCAs: ca.Pool, ClientAuth: tls.RequireAndVerifyClientCert,
	})
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	peers := make(chan *x509.Certificate, 2)
	go func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			tc := c.(*tls.Conn)
			tc.SetDeadline(time.Now().Add(5 * time.Second))
			if tc.Handshake() == nil {
				peers <- tc.ConnectionState().PeerCertificates[0]
			}
			tc.Close()
		}
	}()

	cfg := ca.Client(t, testcert.Leaf{Name: "edge", CommonName: "edge-cn", DNS: []string{"edge.mesh"}, URIs: []string{"spiffe://cluster.local/ns/edge/sa/envoy"}})
	c, err := tls.DialWithDialer(&net.Dialer{Timeout: 5 * time.Second}, "tcp", l.Addr().String(), cfg)
	if err != nil {
		t.Fatalf("client of the CA: %v", err)
	}
	if err := c.VerifyHostname("127.0.0.1"); err != nil {
		t.Errorf("server certificate for loopback: %v", err)
	}
	c.Close()
	select {
	case p := <-peers:
		if p.Subject.CommonName != "edge-cn" || len(p.DNSNames) != 1 || p.DNSNames[0] != "edge.mesh" ||
			len(p.URIs) != 1 || p.URIs[0].String() != "spiffe://cluster.local/ns/edge/sa/envoy" {
			t.Errorf("client certificate: CN %q DNS %v URIs %v", p.Subject.CommonName, p.DNSNames, p.URIs)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("server saw no handshake")
	}

	other := testcert.New(t)
	foreign := other.Client(t, testcert.Leaf{Name: "foreign"})
	foreign.RootCAs = ca.Pool
	if c, err := tls.DialWithDialer(&net.Dialer{Timeout: 5 * time.Second}, "tcp", l.Addr().String(), foreign); err == nil {
		// TLS 1.3 reports a refused client certificate on the first read.
		c.SetDeadline(time.Now().Add(5 * time.Second))
		if _, err := c.Read(make([]byte, 1)); err == nil {
			t.Error("a client of another CA was accepted")
		}
		c.Close()
	}
}
