package server_test

import (
	"context"
	"crypto/x509"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/ratelimit-authz/ratelimit-authz/internal/binaries"
	"github.com/ratelimit-authz/ratelimit-authz/internal/freeport"
	"github.com/ratelimit-authz/ratelimit-authz/internal/proc"
	"github.com/ratelimit-authz/ratelimit-authz/internal/scrape"
	"github.com/ratelimit-authz/ratelimit-authz/internal/server"
	"github.com/ratelimit-authz/ratelimit-authz/internal/testcert"
)

// envoyMTLS is a bootstrap of listeners (envoyListener) that check through
// gRPC clusters (envoyCluster) presenting a client certificate and
// verifying the server's, and ship their access log to the "als" cluster.
const envoyMTLS = `
admin: { address: { socket_address: { address: 127.0.0.1, port_value: {{admin}} } } }
static_resources:
  listeners:
{{listeners}}
  clusters:
{{clusters}}
`

const envoyListener = `
  - name: NAME
    address: { socket_address: { address: 127.0.0.1, port_value: PORT } }
    filter_chains:
    - filters:
      - name: envoy.filters.network.http_connection_manager
        typed_config:
          "@type": type.googleapis.com/envoy.extensions.filters.network.http_connection_manager.v3.HttpConnectionManager
          stat_prefix: NAME
          access_log:
          - name: envoy.access_loggers.http_grpc
            typed_config:
              "@type": type.googleapis.com/envoy.extensions.access_loggers.grpc.v3.HttpGrpcAccessLogConfig
              common_config:
                log_name: NAME
                transport_api_version: V3
                grpc_service: { envoy_grpc: { cluster_name: ALS } }
                buffer_size_bytes: 0
                buffer_flush_interval: 0.1s
          route_config:
            virtual_hosts:
            - name: all
              domains: [ "*" ]
              routes:
              - match: { prefix: / }
                direct_response: { status: 200, body: { inline_string: ok } }
          http_filters:
          - name: envoy.filters.http.ext_authz
            typed_config:
              "@type": type.googleapis.com/envoy.extensions.filters.http.ext_authz.v3.ExtAuthz
              transport_api_version: V3
              grpc_service: { envoy_grpc: { cluster_name: CHECK }, timeout: 10s }
              failure_mode_allow: false
              status_on_error: { code: ServiceUnavailable }
          - name: envoy.filters.http.router
            typed_config:
              "@type": type.googleapis.com/envoy.extensions.filters.http.router.v3.Router
`

const envoyCluster = `
  - name: NAME
    type: STATIC
    connect_timeout: 2s
    typed_extension_protocol_options:
      envoy.extensions.upstreams.http.v3.HttpProtocolOptions:
        "@type": type.googleapis.com/envoy.extensions.upstreams.http.v3.HttpProtocolOptions
        explicit_http_config: { http2_protocol_options: { STREAMS } }
    load_assignment:
      cluster_name: NAME
      endpoints:
      - lb_endpoints:
        - endpoint: { address: { socket_address: { address: 127.0.0.1, port_value: PORT } } }
    transport_socket:
      name: envoy.transport_sockets.tls
      typed_config:
        "@type": type.googleapis.com/envoy.extensions.transport_sockets.tls.v3.UpstreamTlsContext
        sni: limiter.mesh
        common_tls_context:
          alpn_protocols: [ h2 ]
          tls_certificates:
          - certificate_chain: { filename: DIR/CERT.pem }
            private_key: { filename: DIR/CERT-key.pem }
          validation_context:
            trusted_ca: { filename: DIR/ca.pem }
            match_typed_subject_alt_names:
            - san_type: DNS
              matcher: { exact: limiter.mesh }
`

func port(addr string) string { return addr[strings.LastIndexByte(addr, ':')+1:] }

// The production setting with the real Envoy: mTLS both ways, allow-lists
// on both gRPC listeners, the access log on its own port, and a stream
// bound. Envoy with an allowed certificate is served (checks and access
// log); Envoy with a certificate of the CA whose name is not on the list
// is refused at the handshake, so its requests get status_on_error (503).
//
// With the cluster's http2_protocol_options.max_concurrent_streams at the
// server's stream bound, a burst larger than the bound is spread over more
// connections, none refused. (Without it, Envoy 1.40 sends streams past
// the bound before and even after it has read the server's SETTINGS, and
// those checks fail: see docs/envoy.md.)
func TestEnvoyMutualTLSAndStreamBound(t *testing.T) {
	envoy := binaries.InstalledEnvoy(t)
	p := newPKI(t)
	cert, key := p.Issue(t, testcert.Leaf{Name: "limiter", CommonName: "limiter", Usage: x509.ExtKeyUsageServerAuth, DNS: []string{"limiter.mesh"}})
	p.Issue(t, testcert.Leaf{Name: "edge", CommonName: "edge", Usage: x509.ExtKeyUsageClientAuth, DNS: []string{"edge.mesh"}})
	p.Issue(t, testcert.Leaf{Name: "other", CommonName: "edge.mesh", Usage: x509.ExtKeyUsageClientAuth, DNS: []string{"other.mesh"}})

	g := newGate()
	als := &countingStreams{streams: streams{closing: make(chan struct{})}}
	srv, reg := start(t, server.Config{
		AccessLogAddr: "127.0.0.1:0",
		TLS: server.TLS{CertFile: cert, KeyFile: key, ClientCAFile: p.File,
			AllowedClients: []string{"edge.mesh"}},
		Bounds: server.Bounds{MaxConcurrentStreams: 2},
	}, server.Services{Authz: g, AccessLog: als})

	addrs := map[string]string{}
	for _, name := range []string{"admin", "spread", "bad"} {
		a, err := freeport.Addr()
		if err != nil {
			t.Fatal(err)
		}
		addrs[name] = a
	}
	listener := func(name, check string) string {
		return strings.NewReplacer("NAME", name, "PORT", port(addrs[name]), "CHECK", check, "ALS", "als").Replace(envoyListener)
	}
	cluster := func(name, addr, cert, streams string) string {
		return strings.NewReplacer("NAME", name, "PORT", port(addr), "DIR", p.Dir, "CERT", cert, "STREAMS", streams).Replace(envoyCluster)
	}
	grpcAddr := srv.GRPCAddr().String()
	bootstrap := strings.NewReplacer(
		"{{admin}}", port(addrs["admin"]),
		"{{listeners}}", listener("spread", "check_spread")+listener("bad", "check_bad"),
		"{{clusters}}", cluster("check_spread", grpcAddr, "edge", "max_concurrent_streams: 2")+
			cluster("check_bad", grpcAddr, "other", "")+
			cluster("als", srv.AccessLogAddr().String(), "edge", ""),
	).Replace(envoyMTLS)
	dir := t.TempDir()
	cfgFile := filepath.Join(dir, "envoy.yaml")
	if err := os.WriteFile(cfgFile, []byte(bootstrap), 0o600); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	e, err := proc.Start(ctx, proc.Config{Name: "envoy", Path: envoy, LogDir: dir, Lifetime: 2 * time.Minute,
		Args: []string{"-c", cfgFile, "--concurrency", "1", "--disable-hot-restart", "-l", "warn"}})
	if err != nil {
		t.Fatal(err)
	}
	defer func() {
		if err := e.Stop(); err != nil {
			t.Errorf("envoy: %v\n%s", err, e.Tail(30))
		}
	}()
	admin := "http://" + addrs["admin"]
	if err := e.WaitHTTP200(ctx, admin+"/ready"); err != nil {
		t.Fatalf("envoy not ready: %v\n%s", err, e.Tail(30))
	}
	client := &http.Client{Timeout: 30 * time.Second}
	stat := func(name string) int {
		stats, err := scrape.EnvoyStats(client, admin, "^"+regexp.QuoteMeta(name)+"$")
		if err != nil {
			t.Fatal(err)
		}
		return int(stats[name])
	}
	burst := func(listener string) <-chan int {
		codes := make(chan int, 6)
		for range 6 {
			go func() {
				resp, err := client.Get("http://" + addrs[listener] + "/x")
				if err != nil {
					codes <- 0
					return
				}
				resp.Body.Close()
				codes <- resp.StatusCode
			}()
		}
		return codes
	}
	collect := func(what string, codes <-chan int) {
		t.Helper()
		for range 6 {
			if c := <-codes; c != 200 {
				t.Errorf("%s: %d, want 200", what, c)
			}
		}
	}

	// A burst on a cold cluster whose max_concurrent_streams is the
	// server's bound: three connections of two streams, every check served.
	codes := burst("spread")
	waitFor(t, func() bool { return g.inflight.Load() == 6 })
	if n := metric(t, reg, "ratelimit_authz_server_connections_open", "grpc"); n != 3 {
		t.Errorf("%v connections to the Check port, want 3", n)
	}
	g.release()
	collect("checks", codes)
	if m := g.max.Load(); m != 6 {
		t.Errorf("at most %d checks at once, want 6", m)
	}
	waitFor(t, func() bool { return als.msgs.Load() >= 6 })

	calls := g.calls.Load()
	resp, err := client.Get("http://" + addrs["bad"] + "/x")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusServiceUnavailable {
		t.Errorf("through the Envoy whose name is not allowed: %d, want 503", resp.StatusCode)
	}
	if g.calls.Load() != calls {
		t.Error("a check from the refused Envoy reached the service")
	}
	if n := metric(t, reg, "ratelimit_authz_server_tls_clients_refused_total", "grpc"); n < 1 {
		t.Errorf("tls_clients_refused_total %v", n)
	}
	if n := stat("cluster.check_bad.ssl.connection_error"); n < 1 {
		t.Errorf("envoy: cluster.check_bad.ssl.connection_error %d", n)
	}
}
