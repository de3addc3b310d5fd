package e2e

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	accesslogv3 "github.com/envoyproxy/go-control-plane/envoy/data/accesslog/v3"
	alsv3 "github.com/envoyproxy/go-control-plane/envoy/service/accesslog/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/protobuf/types/known/structpb"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/ratelimit-authz/ratelimit-authz/internal/freeport"
	"github.com/ratelimit-authz/ratelimit-authz/internal/poll"
)

// Concurrency budgets through the real Envoy: the shipped bootstrap, a
// server config whose legacy_tokens route (/api/v1/tokens, routed by the
// shipped bootstrap through ext_authz) spends a concurrency bucket, and an
// upstream that holds each request until the test lets it go, and
// measures how many it holds at once.

// concurrencyPath is a route of the shipped bootstrap.
const concurrencyPath = "/api/v1/tokens"

func concurrencyConfig(t *testing.T, dir string, limit int, ttl time.Duration) string {
	t.Helper()
	cfg := fmt.Sprintf(`
buckets:
  db_pool: {count: concurrency, limit: %d, lease_ttl: %s, key: tenant}
routes:
  - {name: legacy_tokens, method: POST, path: %s, buckets: [db_pool]}
`, limit, ttl, concurrencyPath)
	p := filepath.Join(dir, "concurrency.yaml")
	if err := os.WriteFile(p, []byte(cfg), 0o644); err != nil {
		t.Fatal(err)
	}
	return p
}

// gatedUpstream holds every request until its gate is open (a closed
// gate holds them until opened), counting those it holds and the most
// it held at once.
type gatedUpstream struct {
	addr    string
	hold    time.Duration // each request, once through the gate
	mu      sync.Mutex
	gate    chan struct{} // closed: open
	held    int
	maxHeld int
	ids     []string // x-request-id of the requests held now
	served  atomic.Int64
}

func startGatedUpstream(t *testing.T) *gatedUpstream {
	t.Helper()
	u := &gatedUpstream{gate: make(chan struct{})}
	close(u.gate)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		// Reading the body to its end lets the server notice a closed
		// connection (Envoy killed) and cancel the request's context.
		io.Copy(io.Discard, r.Body)
		id := r.Header.Get("x-request-id")
		u.mu.Lock()
		u.held++
		u.maxHeld = max(u.maxHeld, u.held)
		u.ids = append(u.ids, id)
		gate := u.gate
		u.mu.Unlock()
		select {
		case <-gate:
		case <-r.Context().Done():
		}
		if u.hold > 0 {
			time.Sleep(u.hold)
		}
		u.mu.Lock()
		u.held--
		u.ids = slices.DeleteFunc(u.ids, func(x string) bool { return x == id })
		u.mu.Unlock()
		u.served.Add(1)
		w.Header().Set("Content-Type", "application/json")
		fmt.Fprint(w, `{"ok":true}`)
	}))
	t.Cleanup(srv.Close) // waits for the requests it serves: the gate opens first
	t.Cleanup(u.open)
	u.addr = srv.Listener.Addr().String()
	return u
}

// close makes the upstream hold the requests that arrive from now on.
func (u *gatedUpstream) close() {
	u.mu.Lock()
	defer u.mu.Unlock()
	u.gate = make(chan struct{})
}

// open lets every held request and every later one through.
func (u *gatedUpstream) open() {
	u.mu.Lock()
	defer u.mu.Unlock()
	select {
	case <-u.gate:
	default:
		close(u.gate)
	}
}

// heldIDs are the request ids of the requests held now.
func (u *gatedUpstream) heldIDs() []string {
	u.mu.Lock()
	defer u.mu.Unlock()
	return slices.Clone(u.ids)
}

func (u *gatedUpstream) holding() (held, maxHeld int) {
	u.mu.Lock()
	defer u.mu.Unlock()
	return u.held, u.maxHeld
}

func startConcurrencyStack(t *testing.T, limit int, ttl time.Duration) (*stack, *gatedUpstream) {
	t.Helper()
	s := prepareStack(t, 1)
	up := startGatedUpstream(t)
	s.addrs.App = up.addr
	s.startEnvoy()
	s.startServer(serverBinary(t), concurrencyConfig(t, s.logs.dir, limit, ttl))
	return s, up
}

// concurrentPosts sends n requests of tenant at once and returns their
// statuses, in the order they finished (0: the exchange broke, an error
// unless broken is set).
func (s *stack) concurrentPosts(n int, tenant string, broken bool) <-chan int {
	out := make(chan int, n)
	for range n {
		go func() {
			r, err := s.post(concurrencyPath, map[string]string{"x-tenant-id": tenant})
			if err != nil {
				if !broken {
					s.t.Errorf("concurrentPosts: %v", err)
				}
				out <- 0
				return
			}
			if r.status == http.StatusTooManyRequests && (r.header.Get("Retry-After") != "1" ||
				r.header.Get("RateLimit-Policy") != `"db_pool";q=5;qu="concurrent-requests"`) {
				s.t.Errorf("429 with Retry-After %q, RateLimit-Policy %q", r.header.Get("Retry-After"), r.header.Get("RateLimit-Policy"))
			}
			out <- r.status
		}()
	}
	return out
}

const inFlightSeries = `ratelimit_authz_inflight_requests{bucket="db_pool"}`

// TestConcurrencyThroughEnvoy: a tenant limited to 5 requests in flight
// sends 20 at once: 5 reach the upstream, which holds them, and the 15
// others are answered 429 while those 5 are still held; forged
// access-log entries sent to the server's gRPC port meanwhile (an unknown
// id, a held id under another tenant, another bucket) and a replayed one
// later free nothing; once they end
// (their access-log entries release the leases) new ones pass; after
// 10,000 more requests from 20 clients nothing has leaked: the upstream
// never held more than 5, and the server holds no lease and lost no
// release.
func TestConcurrencyThroughEnvoy(t *testing.T) {
	s, up := startConcurrencyStack(t, 5, time.Minute)
	up.close()
	statuses := s.concurrentPosts(20, "acme", false)
	denied := 0
	for denied < 15 {
		select {
		case st := <-statuses:
			if st != http.StatusTooManyRequests {
				t.Fatalf("status %d while the upstream holds every admitted request: only 429s can finish", st)
			}
			denied++
		case <-time.After(processLifetime(t)):
			t.Fatalf("%d 429s, want 15", denied)
		}
	}
	// An admitted request may still be on its way to the upstream when the
	// last 429 arrives.
	poll.Until(t, 10*time.Second, 5*time.Millisecond, func() error {
		if held, _ := up.holding(); held != 5 {
			return fmt.Errorf("the upstream holds %d, want 5", held)
		}
		return nil
	})
	// Forged access-log entries on the server's gRPC port free nothing:
	// an id no request has, a held request's id under another tenant's
	// key, and under a bucket that is not a concurrency bucket.
	ids := up.heldIDs()
	forge := s.accessLog(t)
	forge(leaseEntry("forged-id", "db_pool", "acme"), leaseEntry(ids[0], "db_pool", "other-tenant"), leaseEntry(ids[1], "nope", "acme"))
	poll.Until(t, 10*time.Second, 10*time.Millisecond, func() error {
		if n := s.serverMetric(`ratelimit_authz_failures_accesslog_entries_total{result="malformed"}`) + s.serverMetric(`ratelimit_authz_failures_accesslog_entries_total{result="released"}`); n < 3 {
			return fmt.Errorf("%v forged entries read, want 3", n)
		}
		return nil
	})
	if v := s.serverMetric(inFlightSeries); v != 5 {
		t.Fatalf("%v in flight after forged releases, want 5", v)
	}
	if r := s.mustPost(concurrencyPath, map[string]string{"x-tenant-id": "acme"}); r.status != http.StatusTooManyRequests {
		t.Fatalf("status %d after forged releases, want 429", r.status)
	}
	up.open()
	for range 5 {
		if st := <-statuses; st != http.StatusOK {
			t.Fatalf("an admitted request ended with %d", st)
		}
	}
	poll.Until(t, 10*time.Second, 10*time.Millisecond, func() error {
		if v := s.serverMetric(inFlightSeries); v != 0 {
			return fmt.Errorf("%v in flight after every request ended", v)
		}
		return nil
	})
	// A replayed entry of a finished request frees nothing of the next.
	forge(leaseEntry(ids[0], "db_pool", "acme"))
	// The slots are back: 5 more are held at once.
	up.close()
	statuses = s.concurrentPosts(5, "acme", false)
	poll.Until(t, 10*time.Second, 5*time.Millisecond, func() error {
		if held, _ := up.holding(); held != 5 {
			return fmt.Errorf("the upstream holds %d, want 5", held)
		}
		return nil
	})
	if v := s.serverMetric(inFlightSeries); v != 5 {
		t.Fatalf("%v in flight, want 5", v)
	}
	up.open()
	for range 5 {
		if st := <-statuses; st != http.StatusOK {
			t.Fatalf("status %d after the slots came back", st)
		}
	}

	// 10,000 more from 20 clients, the upstream open.
	ok, limited := tenantLoad(t, []*stack{s}, 20, 500)
	poll.Until(t, 10*time.Second, 10*time.Millisecond, func() error {
		if v, l := s.serverMetric(inFlightSeries), s.serverMetric("ratelimit_authz_inflight_leases"); v != 0 || l != 0 {
			return fmt.Errorf("%v in flight, %v leases after 10,000 requests ended", v, l)
		}
		return nil
	})
	_, maxHeld := up.holding()
	if maxHeld > 5 {
		t.Errorf("the upstream held %d at once, limit 5", maxHeld)
	}
	if exp := s.serverMetric("ratelimit_authz_inflight_leases_expired_total"); exp != 0 {
		t.Errorf("%v leases expired: releases were lost", exp)
	}
	// The forged ones and the replayed one named no lease: 3.
	if unknown := s.serverMetric("ratelimit_authz_inflight_releases_unknown_total"); unknown != 3 {
		t.Errorf("%v releases named no lease, want the 3 forged", unknown)
	}
	t.Logf("10,000 requests from 20 clients: %d passed, %d limited; the upstream held at most %d at once", ok, limited, maxHeld)
}

// TestConcurrencyEnvoyKilled: Envoy killed with 5 requests in flight
// sends no access-log entry for them: their slots come back when the
// leases expire, not before.
func TestConcurrencyEnvoyKilled(t *testing.T) {
	const ttl = 3 * time.Second
	s, up := startConcurrencyStack(t, 5, ttl)
	up.close()
	start := time.Now() // every lease is acquired after this
	statuses := s.concurrentPosts(5, "acme", true)
	poll.Until(t, 10*time.Second, 5*time.Millisecond, func() error {
		if held, _ := up.holding(); held != 5 {
			return fmt.Errorf("the upstream holds %d, want 5", held)
		}
		return nil
	})
	s.envoy.kill(t)
	for range 5 {
		<-statuses // the connections broke
	}
	up.open()
	s.startEnvoy()
	// Until the leases expire every request is denied; the first that
	// passes was sent at least a lease's time to live after the leases
	// were taken.
	var passedSentAt time.Time
	poll.Until(t, ttl+20*time.Second, 50*time.Millisecond, func() error {
		sent := time.Now()
		r, err := s.post(concurrencyPath, map[string]string{"x-tenant-id": "acme"})
		if err != nil {
			return err
		}
		if r.status != http.StatusOK {
			return fmt.Errorf("status %d", r.status)
		}
		passedSentAt = sent
		return nil
	})
	d := passedSentAt.Sub(start)
	if d < ttl {
		t.Fatalf("a request passed %v after the leases were taken, before their time to live %v", d, ttl)
	}
	t.Logf("the first request to pass was sent %v after the leases were taken (time to live %v)", d.Round(time.Millisecond), ttl)
	if exp := s.serverMetric("ratelimit_authz_inflight_leases_expired_total"); exp != 5 {
		t.Errorf("%v leases expired, want 5", exp)
	}
}

// TestConcurrencyClusterTwoEnvoys: three nodes behind two Envoys, each
// Envoy spreading its checks and its access log over the three nodes, so
// that a request is often admitted on one node and released on another.
// 40 clients, 20 on each Envoy, send requests of one tenant limited to 5
// in flight to an upstream that holds each for 20 ms. The upstream never
// holds more than each node's limit (3 × 5, whatever the timing; the
// figure logged is what it held at most, against the limit plus nodes − 1
// of docs/design/inflight.md), every release finds its lease (none
// expires, releases are forwarded and freed at the holder), and once the
// load stops nothing is held on any node.
func TestConcurrencyClusterTwoEnvoys(t *testing.T) {
	const limit, nodes = 5, 3
	up := startGatedUpstream(t)
	up.hold = 20 * time.Millisecond
	dir := t.TempDir()
	c := newClusterWith(t, nodes, concurrencyConfig(t, dir, limit, time.Minute), func(s *stack) { s.addrs.App = up.addr })
	// The second Envoy: the shipped bootstrap with its own admin and
	// listener addresses, the same nodes.
	second := *c.stack
	second.logs = newLogs(t)
	addrs := freeport.TestAddrs(t, 2)
	second.addrs.Admin, second.addrs.Listener = addrs[0], addrs[1]
	second.client = &http.Client{Timeout: 5 * time.Second, Transport: &http.Transport{Proxy: nil, MaxIdleConnsPerHost: 32}}
	t.Cleanup(second.client.CloseIdleConnections)
	second.startEnvoy()

	start := time.Now()
	ok, limited := tenantLoad(t, []*stack{c.stack, &second}, 40, 50)
	took := time.Since(start)
	_, maxHeld := up.holding()
	if maxHeld > nodes*limit {
		t.Errorf("the upstream held %d at once, over %d nodes × limit %d", maxHeld, nodes, limit)
	}
	if ok == 0 {
		t.Fatal("no request passed")
	}
	poll.Until(t, 20*time.Second, 20*time.Millisecond, func() error {
		if err := c.eachNode(t, inFlightSeries, 0); err != nil {
			return err
		}
		return c.eachNode(t, "ratelimit_authz_inflight_leases", 0)
	})
	var forwarded, freed, expired float64
	for _, nd := range c.nodes {
		forwarded += nd.metric(t, "ratelimit_authz_inflight_releases_forwarded_total")
		freed += nd.metric(t, "ratelimit_authz_inflight_releases_from_peers_freed_total")
		expired += nd.metric(t, "ratelimit_authz_inflight_leases_expired_total")
	}
	if expired != 0 {
		t.Errorf("%v leases expired: releases were lost", expired)
	}
	if freed == 0 || freed > forwarded {
		t.Errorf("%v releases forwarded, %v freed at the holder: want some, all forwarded", forwarded, freed)
	}
	t.Logf("2,000 requests over 2 Envoys and %d nodes in %v, limit %d in flight: %d passed, %d limited; the upstream held at most %d at once; %v releases forwarded to the holder",
		nodes, took.Round(time.Millisecond), limit, ok, limited, maxHeld, freed)
}

// leaseEntry is an access-log entry as Envoy sends it for a request that
// holds a lease of bucket under key.
func leaseEntry(requestID, bucket, key string) *accesslogv3.HTTPAccessLogEntry {
	leases := &structpb.Struct{Fields: map[string]*structpb.Value{bucket: structpb.NewStringValue(key)}}
	return &accesslogv3.HTTPAccessLogEntry{
		CommonProperties: &accesslogv3.AccessLogCommon{Metadata: &corev3.Metadata{FilterMetadata: map[string]*structpb.Struct{
			"envoy.filters.http.ext_authz": {Fields: map[string]*structpb.Value{"leases": structpb.NewStructValue(leases)}},
		}}},
		Request:  &accesslogv3.HTTPRequestProperties{RequestId: requestID},
		Response: &accesslogv3.HTTPResponseProperties{ResponseCode: wrapperspb.UInt32(200)},
	}
}

// accessLog opens an access-log stream to the server's gRPC port, as an
// attacker who reaches it would, and returns what sends entries on it.
func (s *stack) accessLog(t *testing.T) func(...*accesslogv3.HTTPAccessLogEntry) {
	t.Helper()
	conn, err := grpc.NewClient(s.addrs.Authz[0], grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	stream, err := alsv3.NewAccessLogServiceClient(conn).StreamAccessLogs(ctx)
	if err != nil {
		t.Fatal(err)
	}
	return func(es ...*accesslogv3.HTTPAccessLogEntry) {
		t.Helper()
		err := stream.Send(&alsv3.StreamAccessLogsMessage{LogEntries: &alsv3.StreamAccessLogsMessage_HttpLogs{
			HttpLogs: &alsv3.StreamAccessLogsMessage_HTTPAccessLogEntries{LogEntry: es},
		}})
		if err != nil {
			t.Fatal(err)
		}
	}
}

// tenantLoad runs clients clients of tenant acme, spread over the stacks'
// Envoys in turn, each sending perClient requests one after the other,
// and counts those that passed and those limited; any other outcome fails
// the test.
func tenantLoad(t *testing.T, stacks []*stack, clients, perClient int) (ok, limited int64) {
	t.Helper()
	return concurrentLoad(t, clients, perClient, func(client int) (*response, error) {
		return stacks[client%len(stacks)].post(concurrencyPath, map[string]string{"x-tenant-id": "acme"})
	})
}

// concurrentLoad has clients goroutines send perClient requests each, one
// after the other, and counts the answers: 200 admitted, 429 limited. An
// error or another status fails the test and ends that client.
func concurrentLoad(t *testing.T, clients, perClient int, send func(client int) (*response, error)) (ok, limited int64) {
	t.Helper()
	var nOK, nLimited atomic.Int64
	var wg sync.WaitGroup
	for i := range clients {
		wg.Go(func() {
			for range perClient {
				r, err := send(i)
				switch {
				case err != nil:
					t.Error(err)
					return
				case r.status == http.StatusOK:
					nOK.Add(1)
				case r.status == http.StatusTooManyRequests:
					nLimited.Add(1)
				default:
					t.Errorf("status %d", r.status)
					return
				}
			}
		})
	}
	wg.Wait()
	return nOK.Load(), nLimited.Load()
}
