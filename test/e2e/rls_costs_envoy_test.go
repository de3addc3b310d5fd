package e2e

import (
	"context"
	"fmt"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc"

	"github.com/ratelimit-authz/ratelimit-authz/internal/freeport"
	"github.com/ratelimit-authz/ratelimit-authz/internal/poll"
)

// rlsStub is a minimal RateLimitService: it records every ShouldRateLimit
// call Envoy's ratelimit filter makes and answers OVER_LIMIT when a
// descriptor has an entry keyed "deny", else OK. It is the instrument the
// tests of Envoy's own behaviour read (what hits_addend, apply_on_stream_done
// and is_negative_hits put on the wire); the product's server is tested
// against the same Envoy elsewhere.
type rlsStub struct {
	rlsv3.UnimplementedRateLimitServiceServer
	addr string

	mu    sync.Mutex
	calls []stubCall
}

// stubCall is one ShouldRateLimit request, as received.
type stubCall struct {
	domain string
	hits   uint32 // the request's hits_addend
	descs  []stubDesc
}

// stubDesc is one descriptor: its entries as "k=v,k=v", its own
// hits_addend ("-" when unset) and is_negative_hits.
type stubDesc struct {
	entries  string
	hits     string
	negative bool
}

func (d stubDesc) String() string {
	s := d.entries + " hits=" + d.hits
	if d.negative {
		s += " negative"
	}
	return s
}

func (c stubCall) String() string {
	ds := make([]string, len(c.descs))
	for i, d := range c.descs {
		ds[i] = "[" + d.String() + "]"
	}
	return fmt.Sprintf("%s hits_addend=%d %s", c.domain, c.hits, strings.Join(ds, " "))
}

func startRLSStub(t *testing.T) *rlsStub {
	t.Helper()
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatalf("stub RLS: %v", err)
	}
	s := &rlsStub{addr: lis.Addr().String()}
	srv := grpc.NewServer()
	rlsv3.RegisterRateLimitServiceServer(srv, s)
	go srv.Serve(lis)
	t.Cleanup(srv.Stop)
	return s
}

func (s *rlsStub) ShouldRateLimit(_ context.Context, req *rlsv3.RateLimitRequest) (*rlsv3.RateLimitResponse, error) {
	c := stubCall{domain: req.GetDomain(), hits: req.GetHitsAddend()}
	code := rlsv3.RateLimitResponse_OK
	for _, d := range req.GetDescriptors() {
		var es []string
		for _, e := range d.GetEntries() {
			es = append(es, e.GetKey()+"="+e.GetValue())
			if e.GetKey() == "deny" {
				code = rlsv3.RateLimitResponse_OVER_LIMIT
			}
		}
		sd := stubDesc{entries: strings.Join(es, ","), hits: "-", negative: d.GetIsNegativeHits()}
		if h := d.GetHitsAddend(); h != nil {
			sd.hits = strconv.FormatUint(h.GetValue(), 10)
		}
		c.descs = append(c.descs, sd)
	}
	s.mu.Lock()
	s.calls = append(s.calls, c)
	s.mu.Unlock()
	return &rlsv3.RateLimitResponse{OverallCode: code}, nil
}

// take returns the calls recorded so far and forgets them.
func (s *rlsStub) take() []stubCall {
	s.mu.Lock()
	defer s.mu.Unlock()
	c := s.calls
	s.calls = nil
	return c
}

// requestID is a request_id entry as stubCall.String writes it.
var requestID = regexp.MustCompile(`request_id=[^,\] ]*`)

// costFieldsBootstrap is a bootstrap of Envoy's ratelimit filter with one
// route per question about hits_addend, apply_on_stream_done and
// is_negative_hits; the domain of each route's calls is the route's name.
const costFieldsBootstrap = `
admin:
  address: { socket_address: { address: 127.0.0.1, port_value: ADMIN_PORT } }
static_resources:
  listeners:
  - name: ingress
    address: { socket_address: { address: 127.0.0.1, port_value: LISTENER_PORT } }
    filter_chains:
    - filters:
      - name: envoy.filters.network.http_connection_manager
        typed_config:
          "@type": type.googleapis.com/envoy.extensions.filters.network.http_connection_manager.v3.HttpConnectionManager
          stat_prefix: ingress
          route_config:
            virtual_hosts:
            - name: app
              domains: [ "*" ]
              # The virtual host's rate_limits apply to a route without
              # rate_limits of its own (and without RateLimitPerRoute's).
              rate_limits:
              - actions: [ { generic_key: { descriptor_value: vh } } ]
                hits_addend: { number: 3 }
              - actions: [ { generic_key: { descriptor_value: vh-done } } ]
                apply_on_stream_done: true
                hits_addend: { number: 4 }
              routes:
              - match: { path: /vh-level }
                route: { cluster: app }
                typed_per_filter_config:
                  envoy.filters.http.ratelimit:
                    "@type": type.googleapis.com/envoy.extensions.filters.http.ratelimit.v3.RateLimitPerRoute
                    domain: vh-level
              - match: { path: /fence }
                route: { cluster: app }
                typed_per_filter_config:
                  envoy.filters.http.ratelimit:
                    "@type": type.googleapis.com/envoy.extensions.filters.http.ratelimit.v3.RateLimitPerRoute
                    domain: fence
                    rate_limits: [ { actions: [ { generic_key: { descriptor_value: fence } } ] } ]
              # hits_addend as a number, in RateLimitPerRoute.rate_limits.
              - match: { path: /number }
                route: { cluster: app }
                typed_per_filter_config:
                  envoy.filters.http.ratelimit:
                    "@type": type.googleapis.com/envoy.extensions.filters.http.ratelimit.v3.RateLimitPerRoute
                    domain: number
                    rate_limits:
                    - actions: [ { generic_key: { descriptor_value: number } } ]
                      hits_addend: { number: 7 }
              # hits_addend from a request header.
              - match: { path: /format }
                route: { cluster: app }
                typed_per_filter_config:
                  envoy.filters.http.ratelimit:
                    "@type": type.googleapis.com/envoy.extensions.filters.http.ratelimit.v3.RateLimitPerRoute
                    domain: format
                    rate_limits:
                    - actions: [ { generic_key: { descriptor_value: format } } ]
                      hits_addend: { format: "%REQ(x-cost)%" }
              # hits_addend on the route's own rate_limits (not RateLimitPerRoute).
              - match: { path: /route-level }
                route:
                  cluster: app
                  rate_limits:
                  - actions: [ { generic_key: { descriptor_value: route-level } } ]
                    hits_addend: { number: 5 }
                  - actions: [ { generic_key: { descriptor_value: route-level-done } } ]
                    apply_on_stream_done: true
                    hits_addend: { format: "%RESP(x-usage-total-tokens)%" }
                typed_per_filter_config:
                  envoy.filters.http.ratelimit:
                    "@type": type.googleapis.com/envoy.extensions.filters.http.ratelimit.v3.RateLimitPerRoute
                    domain: route-level
              # A request-phase check plus stream-done charges: a response
              # header, the bytes sent, the dynamic metadata a response
              # header became, and a request header.
              - match: { path: /done }
                route: { cluster: app }
                typed_per_filter_config:
                  envoy.filters.http.ratelimit:
                    "@type": type.googleapis.com/envoy.extensions.filters.http.ratelimit.v3.RateLimitPerRoute
                    domain: done
                    rate_limits:
                    - actions: [ { generic_key: { descriptor_value: check } }, { request_headers: { header_name: x-deny, descriptor_key: deny, skip_if_absent: true } } ]
                      hits_addend: { number: 0 }
                    - actions: [ { generic_key: { descriptor_value: resp-header } } ]
                      apply_on_stream_done: true
                      hits_addend: { format: "%RESP(x-usage-total-tokens)%" }
                    - actions: [ { generic_key: { descriptor_value: bytes-sent } } ]
                      apply_on_stream_done: true
                      hits_addend: { format: "%BYTES_SENT%" }
                    - actions: [ { generic_key: { descriptor_value: metadata } } ]
                      apply_on_stream_done: true
                      hits_addend: { format: "%DYNAMIC_METADATA(usage:tokens)%" }
                    - actions: [ { generic_key: { descriptor_value: req-header } } ]
                      apply_on_stream_done: true
                      hits_addend: { format: "%REQ(x-cost)%" }
                    - actions: [ { generic_key: { descriptor_value: number } }, { request_headers: { header_name: x-deny-done, descriptor_key: deny, skip_if_absent: true } } ]
                      apply_on_stream_done: true
                      hits_addend: { number: 9 }
              # is_negative_hits.
              - match: { path: /negative }
                route: { cluster: app }
                typed_per_filter_config:
                  envoy.filters.http.ratelimit:
                    "@type": type.googleapis.com/envoy.extensions.filters.http.ratelimit.v3.RateLimitPerRoute
                    domain: negative
                    rate_limits:
                    - actions: [ { generic_key: { descriptor_value: acquire } }, { request_headers: { header_name: x-request-id, descriptor_key: request_id } },
                                 { request_headers: { header_name: x-deny, descriptor_key: deny, skip_if_absent: true } } ]
                      hits_addend: { number: 1 }
                    - actions: [ { generic_key: { descriptor_value: release } }, { request_headers: { header_name: x-request-id, descriptor_key: request_id } } ]
                      apply_on_stream_done: true
                      hits_addend: { number: 1, is_negative_hits: true }
          http_filters:
          - name: envoy.filters.http.header_to_metadata
            typed_config:
              "@type": type.googleapis.com/envoy.extensions.filters.http.header_to_metadata.v3.Config
              response_rules:
              - header: x-usage-total-tokens
                on_header_present: { metadata_namespace: usage, key: tokens, type: NUMBER }
          - name: envoy.filters.http.ratelimit
            typed_config:
              "@type": type.googleapis.com/envoy.extensions.filters.http.ratelimit.v3.RateLimit
              domain: default
              failure_mode_deny: true
              timeout: 1s
              rate_limit_service:
                transport_api_version: V3
                grpc_service: { envoy_grpc: { cluster_name: ratelimit } }
          - name: envoy.filters.http.router
            typed_config:
              "@type": type.googleapis.com/envoy.extensions.filters.http.router.v3.Router
  clusters:
  - name: ratelimit
    type: STATIC
    connect_timeout: 1s
    typed_extension_protocol_options:
      envoy.extensions.upstreams.http.v3.HttpProtocolOptions:
        "@type": type.googleapis.com/envoy.extensions.upstreams.http.v3.HttpProtocolOptions
        explicit_http_config: { http2_protocol_options: {} }
    load_assignment:
      cluster_name: ratelimit
      endpoints: [ { lb_endpoints: [ { endpoint: { address: { socket_address: { address: 127.0.0.1, port_value: RLS_PORT } } } } ] } ]
  - name: app
    type: STATIC
    connect_timeout: 1s
    load_assignment:
      cluster_name: app
      endpoints: [ { lb_endpoints: [ { endpoint: { address: { socket_address: { address: 127.0.0.1, port_value: APP_PORT } } } } ] } ]
`

// TestEnvoyRateLimitCostFields records what Envoy's ratelimit filter sends
// for hits_addend (a number, a format over a request header, on the
// route's own rate_limits), apply_on_stream_done (a response header, the
// bytes sent, dynamic metadata, after a denial) and is_negative_hits: the
// findings of docs/envoy.md "Costs and releases through the ratelimit
// filter".
func TestEnvoyRateLimitCostFields(t *testing.T) {
	envoyBin := envoyBinary(t)
	lg := newLogs(t)
	stub := startRLSStub(t)
	// The app answers x-usage-total-tokens with the request's x-report and
	// a body of x-body-bytes bytes.
	app := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Header.Get("x-slow") != "" {
			// It answers nothing until Envoy gives the request up (the
			// bound only ends the test's handler should Envoy never do).
			select {
			case <-r.Context().Done():
			case <-time.After(30 * time.Second):
			}
			return
		}
		if v := r.Header.Get("x-report"); v != "" {
			w.Header().Set("x-usage-total-tokens", v)
		}
		n, _ := strconv.Atoi(r.Header.Get("x-body-bytes"))
		w.Header().Set("content-length", strconv.Itoa(n))
		w.Write([]byte(strings.Repeat("x", n)))
	}))
	t.Cleanup(app.Close)

	addrs := freeport.TestAddrs(t, 2)
	port := func(a string) string { _, p, _ := net.SplitHostPort(a); return p }
	cfg := strings.NewReplacer("ADMIN_PORT", port(addrs[0]), "LISTENER_PORT", port(addrs[1]),
		"RLS_PORT", port(stub.addr), "APP_PORT", port(app.Listener.Addr().String())).Replace(costFieldsBootstrap)
	path := filepath.Join(lg.dir, "envoy.yaml")
	if err := os.WriteFile(path, []byte(cfg), 0o644); err != nil {
		t.Fatal(err)
	}
	envoy := lg.start(t, "envoy", envoyBin, "-c", path, "--concurrency", "1", "--disable-hot-restart", "--log-level", "warn",
		"--component-log-level", "config:info,filter:debug")
	waitHTTP200(t, envoy, "http://"+addrs[0]+"/ready")
	client := &http.Client{Timeout: 5 * time.Second, Transport: &http.Transport{Proxy: nil}}
	t.Cleanup(client.CloseIdleConnections)

	get := func(path string, hdr map[string]string) int {
		t.Helper()
		req, _ := http.NewRequest(http.MethodGet, "http://"+addrs[1]+path, nil)
		for k, v := range hdr {
			req.Header.Set(k, v)
		}
		resp, err := client.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		return resp.StatusCode
	}
	// send makes one request and returns its status and the calls it
	// caused: it waits for want calls (the stream-done call comes after
	// the answer), then for the call of a fence request sent after them,
	// and returns every call recorded before the fence's. A call the case
	// does not expect that comes later still fails the next case.
	send := func(path string, hdr map[string]string, want int) (int, []stubCall) {
		t.Helper()
		st := get(path, hdr)
		var calls []stubCall
		poll.UntilTrue(t, 5*time.Second, 5*time.Millisecond, func() bool {
			calls = append(calls, stub.take()...)
			return len(calls) >= want
		})
		if f := get("/fence", nil); f != 200 {
			t.Fatalf("fence: %d", f)
		}
		poll.UntilTrue(t, 5*time.Second, 5*time.Millisecond, func() bool {
			for _, c := range stub.take() {
				if c.domain == "fence" {
					return true
				}
				calls = append(calls, c)
			}
			return false
		})
		return st, calls
	}
	// Each case: the request, its status, and the calls it caused in
	// order (the request-phase call, then the stream-done call).
	for _, c := range []struct {
		path   string
		hdr    map[string]string
		status int
		calls  []string
	}{
		// A number in RateLimitPerRoute.rate_limits: the descriptor's own
		// hits_addend; the request's stays 0 (filter state unset).
		{"/number", nil, 200, []string{"number hits_addend=0 [generic_key=number hits=7]"}},
		// A format: the header's value; absent, not a number, negative or
		// above 1e9 drops the descriptor (here the only one: no call); a
		// fraction is truncated.
		{"/format", map[string]string{"x-cost": "25"}, 200, []string{"format hits_addend=0 [generic_key=format hits=25]"}},
		{"/format", nil, 200, nil},
		{"/format", map[string]string{"x-cost": "abc"}, 200, nil},
		{"/format", map[string]string{"x-cost": "-5"}, 200, nil},
		{"/format", map[string]string{"x-cost": "2.7"}, 200, []string{"format hits_addend=0 [generic_key=format hits=2]"}},
		{"/format", map[string]string{"x-cost": "1000000000"}, 200, []string{"format hits_addend=0 [generic_key=format hits=1000000000]"}},
		{"/format", map[string]string{"x-cost": "1000000001"}, 200, nil},
		{"/format", map[string]string{"x-cost": "4294967297"}, 200, nil},
		// A route's and a virtual host's rate_limits: apply_on_stream_done
		// is honoured, hits_addend is not sent (the server counts 1).
		{"/route-level", map[string]string{"x-report": "12"}, 200, []string{
			"route-level hits_addend=0 [generic_key=route-level hits=-]",
			"route-level hits_addend=0 [generic_key=route-level-done hits=-]"}},
		{"/vh-level", nil, 200, []string{
			"vh-level hits_addend=0 [generic_key=vh hits=-]",
			"vh-level hits_addend=0 [generic_key=vh-done hits=-]"}},
		// Stream done: one more call with every stream-done descriptor; a
		// format reads the response's headers, the bytes sent, and dynamic
		// metadata a response header became.
		{"/done", map[string]string{"x-report": "321", "x-body-bytes": "100", "x-cost": "4"}, 200, []string{
			"done hits_addend=0 [generic_key=check hits=0]",
			"done hits_addend=0 [generic_key=resp-header hits=321] [generic_key=bytes-sent hits=100] [generic_key=metadata hits=321] [generic_key=req-header hits=4] [generic_key=number hits=9]"}},
		// A request the check denied still makes the stream-done call; its
		// local 429 has no x-usage-total-tokens (those descriptors are
		// dropped) and sent no body.
		{"/done", map[string]string{"x-deny": "1", "x-report": "321", "x-body-bytes": "100", "x-cost": "4"}, 429, []string{
			"done hits_addend=0 [generic_key=check,deny=1 hits=0]",
			"done hits_addend=0 [generic_key=bytes-sent hits=0] [generic_key=req-header hits=4] [generic_key=number hits=9]"}},
		// The stream-done call's answer changes nothing: OVER_LIMIT there
		// and the request was answered 200.
		{"/done", map[string]string{"x-deny-done": "1", "x-body-bytes": "5"}, 200, []string{
			"done hits_addend=0 [generic_key=check hits=0]",
			"done hits_addend=0 [generic_key=bytes-sent hits=5] [generic_key=number,deny=1 hits=9]"}},
		// is_negative_hits: the descriptor's hits_addend with the flag.
		// The x-request-id Envoy generated is the same in both calls (ID
		// below: checked equal, then replaced), and a denied acquire is
		// still followed by its release.
		{"/negative", nil, 200, []string{
			"negative hits_addend=0 [generic_key=acquire,request_id=ID hits=1]",
			"negative hits_addend=0 [generic_key=release,request_id=ID hits=1 negative]"}},
		{"/negative", map[string]string{"x-deny": "1"}, 429, []string{
			"negative hits_addend=0 [generic_key=acquire,request_id=ID,deny=1 hits=1]",
			"negative hits_addend=0 [generic_key=release,request_id=ID hits=1 negative]"}},
	} {
		st, calls := send(c.path, c.hdr, len(c.calls))
		got := make([]string, len(calls))
		ids := map[string]bool{}
		for i, cl := range calls {
			got[i] = requestID.ReplaceAllStringFunc(cl.String(), func(m string) string {
				ids[m] = true
				return "request_id=ID"
			})
		}
		if len(ids) > 1 || ids["request_id="] {
			t.Errorf("%s %v: request ids %v, want one, not empty", c.path, c.hdr, ids)
		}
		if st != c.status || !slices.Equal(got, c.calls) {
			t.Errorf("%s %v: %d, calls\n\t%s\nwant %d, calls\n\t%s", c.path, c.hdr, st, strings.Join(got, "\n\t"), c.status, strings.Join(c.calls, "\n\t"))
		}
	}

	// A client that gives up while the upstream is still working: the
	// stream is reset, and the stream-done call (the release) is still
	// made, long before the upstream's handler would end on its own.
	req, _ := http.NewRequest(http.MethodGet, "http://"+addrs[1]+"/negative", nil)
	req.Header.Set("x-slow", "1")
	impatient := &http.Client{Timeout: 300 * time.Millisecond, Transport: &http.Transport{Proxy: nil}}
	if resp, err := impatient.Do(req); err == nil {
		resp.Body.Close()
		t.Fatalf("the slow request was answered %d before the client gave up", resp.StatusCode)
	}
	var calls []string
	poll.UntilTrue(t, 5*time.Second, 5*time.Millisecond, func() bool {
		for _, c := range stub.take() {
			calls = append(calls, requestID.ReplaceAllString(c.String(), "request_id=ID"))
		}
		return len(calls) >= 2
	})
	if want := []string{"negative hits_addend=0 [generic_key=acquire,request_id=ID hits=1]",
		"negative hits_addend=0 [generic_key=release,request_id=ID hits=1 negative]"}; !slices.Equal(calls, want) {
		t.Errorf("a request the client abandoned: calls\n\t%s\nwant\n\t%s", strings.Join(calls, "\n\t"), strings.Join(want, "\n\t"))
	}
}
