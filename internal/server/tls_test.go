package server_test

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	authv3 "github.com/envoyproxy/go-control-plane/envoy/service/auth/v3"
	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/ratelimit-authz/ratelimit-authz/internal/server"
	"github.com/ratelimit-authz/ratelimit-authz/internal/testcert"
)

// pki is a throwaway CA with a server and a client certificate, as files.
type pki struct {
	*testcert.CA
	serverCert, serverKey string
	client                tls.Certificate
}

func newPKI(t *testing.T) *pki {
	t.Helper()
	p := &pki{CA: testcert.New(t)}
	p.serverCert, p.serverKey = p.Issue(t, testcert.Leaf{Name: "server", Usage: x509.ExtKeyUsageServerAuth})
	p.client = p.KeyPair(t, testcert.Leaf{Name: "client", Usage: x509.ExtKeyUsageClientAuth})
	return p
}

// startTLS runs a server with tlsCfg and returns its gRPC address.
func startTLS(t *testing.T, tlsCfg server.TLS) string {
	t.Helper()
	srv, err := server.New(server.Config{GRPCAddr: "127.0.0.1:0", HTTPAddr: "127.0.0.1:0", TLS: tlsCfg},
		server.Services{Authz: allowAll{}}, prometheus.NewRegistry(), slog.New(slog.NewTextHandler(io.Discard, nil)))
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- srv.Run(ctx) }()
	t.Cleanup(func() { cancel(); <-done })
	return srv.GRPCAddr().String()
}

// check makes one Check call with the given transport credentials.
func check(t *testing.T, addr string, creds credentials.TransportCredentials) error {
	t.Helper()
	conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(creds))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
	defer cancel()
	_, err = authv3.NewAuthorizationClient(conn).Check(ctx, &authv3.CheckRequest{})
	return err
}

func TestTLS(t *testing.T) {
	p := newPKI(t)
	addr := startTLS(t, server.TLS{CertFile: p.serverCert, KeyFile: p.serverKey})
	if err := check(t, addr, credentials.NewTLS(&tls.Config{RootCAs: p.Pool})); err != nil {
		t.Errorf("TLS client: %v", err)
	}
	if err := check(t, addr, insecure.NewCredentials()); err == nil {
		t.Error("plaintext client accepted by a TLS port")
	}
}

func TestMutualTLS(t *testing.T) {
	p := newPKI(t)
	addr := startTLS(t, server.TLS{CertFile: p.serverCert, KeyFile: p.serverKey, ClientCAFile: p.File})
	if err := check(t, addr, credentials.NewTLS(&tls.Config{RootCAs: p.Pool, Certificates: []tls.Certificate{p.client}})); err != nil {
		t.Errorf("client with a certificate: %v", err)
	}
	if err := check(t, addr, credentials.NewTLS(&tls.Config{RootCAs: p.Pool})); err == nil {
		t.Error("client without a certificate accepted under mTLS")
	}
	// A certificate from another CA is refused too.
	other := newPKI(t)
	if err := check(t, addr, credentials.NewTLS(&tls.Config{RootCAs: p.Pool, Certificates: []tls.Certificate{other.client}})); err == nil {
		t.Error("client certificate of a foreign CA accepted")
	}
}

func TestTLSConfigErrors(t *testing.T) {
	p := newPKI(t)
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	for _, tc := range []struct {
		name string
		tls  server.TLS
		want string
	}{
		{"cert without key", server.TLS{CertFile: p.serverCert}, "both a certificate and a key"},
		{"missing cert", server.TLS{CertFile: filepath.Join(p.Dir, "nope.pem"), KeyFile: p.serverKey}, "no such file"},
		{"key of another cert", server.TLS{CertFile: p.serverCert, KeyFile: filepath.Join(p.Dir, "client-key.pem")}, "load TLS key pair"},
		{"CA file without certificates", server.TLS{CertFile: p.serverCert, KeyFile: p.serverKey, ClientCAFile: p.serverKey}, "no PEM certificate"},
	} {
		_, err := server.New(server.Config{GRPCAddr: "127.0.0.1:0", HTTPAddr: "127.0.0.1:0", TLS: tc.tls},
			server.Services{Authz: allowAll{}}, prometheus.NewRegistry(), log)
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: %v, want %q", tc.name, err, tc.want)
		}
	}
}

// A rotated certificate is served from the next handshake, no restart.
func TestTLSRotation(t *testing.T) {
	p := newPKI(t)
	addr := startTLS(t, server.TLS{CertFile: p.serverCert, KeyFile: p.serverKey})
	served := func() string {
		var cn string
		cfg := &tls.Config{RootCAs: p.Pool, VerifyConnection: func(cs tls.ConnectionState) error {
			cn = cs.PeerCertificates[0].Subject.CommonName
			return nil
		}}
		if err := check(t, addr, credentials.NewTLS(cfg)); err != nil {
			t.Fatal(err)
		}
		return cn
	}
	if cn := served(); cn != "server" {
		t.Fatalf("served %q", cn)
	}
	cert, key := p.Issue(t, testcert.Leaf{Name: "rotated", Usage: x509.ExtKeyUsageServerAuth})
	for _, f := range [][2]string{{cert, p.serverCert}, {key, p.serverKey}} {
		b, err := os.ReadFile(f[0])
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(f[1], b, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	later := time.Now().Add(time.Minute) // a new mtime even on a coarse clock
	if err := os.Chtimes(p.serverCert, later, later); err != nil {
		t.Fatal(err)
	}
	if cn := served(); cn != "rotated" {
		t.Errorf("after rotation served %q, want rotated", cn)
	}
}

// clientCert issues a client certificate of p with the given SANs.
func (p *pki) clientCert(t *testing.T, name, cn string, dns, uris []string) tls.Certificate {
	t.Helper()
	return p.KeyPair(t, testcert.Leaf{Name: name, CommonName: cn, Usage: x509.ExtKeyUsageClientAuth, DNS: dns, URIs: uris})
}

func (p *pki) creds(cert tls.Certificate) credentials.TransportCredentials {
	return credentials.NewTLS(&tls.Config{RootCAs: p.Pool, Certificates: []tls.Certificate{cert}})
}

// With an allow-list, a certificate of the trusted CA is refused at the
// handshake unless it carries an allowed DNS or URI SAN; the common name
// counts for nothing. Refusals are counted; no check reaches the service.
func TestMutualTLSAllowList(t *testing.T) {
	p := newPKI(t)
	g := newGate()
	g.release()
	srv, reg := start(t, server.Config{TLS: server.TLS{
		CertFile: p.serverCert, KeyFile: p.serverKey, ClientCAFile: p.File,
		AllowedClients: []string{"edge-envoy.mesh.internal", "spiffe://cluster.local/ns/edge/sa/envoy"},
	}}, server.Services{Authz: g})
	addr := srv.GRPCAddr().String()
	for _, tc := range []struct {
		name     string
		cert     tls.Certificate
		accepted bool
	}{
		{"allowed DNS SAN", p.clientCert(t, "dns", "x", []string{"other.mesh.internal", "edge-envoy.mesh.internal"}, nil), true},
		{"allowed DNS SAN, other case", p.clientCert(t, "dnscase", "x", []string{"Edge-Envoy.Mesh.Internal"}, nil), true},
		{"allowed URI SAN", p.clientCert(t, "uri", "x", nil, []string{"spiffe://cluster.local/ns/edge/sa/envoy"}), true},
		{"other DNS SAN", p.clientCert(t, "otherdns", "x", []string{"attacker.mesh.internal"}, nil), false},
		{"allowed name as a suffix", p.clientCert(t, "suffix", "x", []string{"edge-envoy.mesh.internal.evil"}, nil), false},
		{"other URI SAN", p.clientCert(t, "otheruri", "x", nil, []string{"spiffe://cluster.local/ns/edge/sa/envoy2"}), false},
		{"allowed URI as a DNS name", p.clientCert(t, "uriasdns", "x", []string{"cluster.local"}, []string{"spiffe://cluster.local/ns/web/sa/app"}), false},
		{"allowed name only as common name", p.clientCert(t, "cn", "edge-envoy.mesh.internal", nil, nil), false},
	} {
		err := check(t, addr, p.creds(tc.cert))
		if tc.accepted && err != nil {
			t.Errorf("%s: refused: %v", tc.name, err)
		}
		if !tc.accepted && err == nil {
			t.Errorf("%s: accepted", tc.name)
		}
	}
	if n := g.calls.Load(); n != 3 {
		t.Errorf("%d checks reached the service, want 3", n)
	}
	if n := metric(t, reg, "ratelimit_authz_server_tls_clients_refused_total", "grpc"); n != 5 {
		t.Errorf("tls_clients_refused_total %v, want 5", n)
	}
}

func TestAllowListErrors(t *testing.T) {
	p := newPKI(t)
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	mtls := server.TLS{CertFile: p.serverCert, KeyFile: p.serverKey, ClientCAFile: p.File}
	for _, tc := range []struct {
		name  string
		names []string
		tls   server.TLS
		want  string
	}{
		{"no client CA", []string{"edge"}, server.TLS{CertFile: p.serverCert, KeyFile: p.serverKey}, "need a client CA"},
		{"no TLS at all", []string{"edge"}, server.TLS{}, "both a certificate and a key"},
		{"wildcard", []string{"*.mesh.internal"}, mtls, "no wildcard"},
		{"empty name", []string{""}, mtls, "1 to 1024 bytes"},
		{"space", []string{"edge envoy"}, mtls, "printable ASCII"},
		{"control character", []string{"edge\nenvoy"}, mtls, "printable ASCII"},
		{"non-ASCII", []string{"édge"}, mtls, "printable ASCII"},
		{"too long", []string{strings.Repeat("a", 2000)}, mtls, "1 to 1024 bytes"},
		{"label too long", []string{strings.Repeat("a", 64) + ".x"}, mtls, "not a DNS name"},
		{"URI without scheme", []string{":/x"}, mtls, "not a URI"},
	} {
		cfg := tc.tls
		cfg.AllowedClients = tc.names
		_, err := server.New(server.Config{GRPCAddr: "127.0.0.1:0", HTTPAddr: "127.0.0.1:0", TLS: cfg},
			server.Services{Authz: allowAll{}}, prometheus.NewRegistry(), log)
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: %v, want %q", tc.name, err, tc.want)
		}
	}
}
