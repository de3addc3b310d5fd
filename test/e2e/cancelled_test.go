package e2e

import (
	"fmt"
	"net"
	"net/http"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/ratelimit-authz/ratelimit-authz/internal/poll"
)

// Calls Envoy cancels hold no slot. A tenant limited to 5 requests in
// flight: 5 requests whose clients hang up at once after writing; 5 whose
// clients hang up while their calls are in flight (the node stopped
// meanwhile: Envoy resets the 5 calls); 5 whose calls time out while the
// node is stopped (SIGSTOP for longer than the bootstraps' 0.25 s
// timeout). After each, 5 requests of the tenant sent at once reach the
// upstream: on the lean listener within a second, its leases living a
// minute (no lease of a cancelled call is left); on the gRPC port, which
// sees a reset only while the call is decided (grpc-go drops the reset of
// a stream it has answered), within the leases' time to live of 3 s.
// Through the ext_authz filter (Check) and the ratelimit filter
// (ShouldRateLimit).

// leanWithin is how soon after the cancelled calls the tenant's slots
// must be free again on the lean listener: well under the leases' time
// to live; grpcTTL the leases' time to live on the gRPC port.
const (
	leanWithin = time.Second
	grpcTTL    = 3 * time.Second
)

// within and ttl are how soon the slots must be free again, and the
// leases' time to live, on the lean listener or the gRPC port.
func within(lean bool) (time.Duration, time.Duration) {
	if lean {
		return leanWithin, time.Minute
	}
	return grpcTTL + time.Second, grpcTTL // a sweep every 250 ms, and margin
}

// cancelCase is one filter's stack for the test.
type cancelCase struct {
	s      *stack
	server *process
	up     *gatedUpstream
	// cluster is the stats prefix of the cluster Envoy's calls go to.
	cluster string
	// request is one request of the tenant as raw HTTP/1.1.
	request string
	// send sends one request of the tenant and returns its status.
	send func() (int, error)
	// inFlight and cancelled are the server's series of the bucket's
	// leases held and reservations given back.
	inFlight, cancelled string
	// stallStatus is what a request whose call timed out gets: 503 from
	// ext_authz (status_on_error), 200 from the ratelimit filter
	// (failure_mode_deny: false lets it through).
	stallStatus int
	// within is how soon the slots must be free after cancelled calls;
	// lean: no lease may expire meanwhile.
	within time.Duration
	lean   bool
}

func TestCancelledChecksHoldNoSlot(t *testing.T) {
	bothPorts(t, func(t *testing.T, lean bool) {
		s := prepareStack(t, 1)
		if !lean {
			s.check = nil // the same cluster, its endpoint the gRPC port
		}
		up := startGatedUpstream(t)
		s.addrs.App = up.addr
		s.startEnvoy()
		w, ttl := within(lean)
		c := &cancelCase{s: s, up: up, cluster: checkClusterStats, within: w, lean: lean,
			request: fmt.Sprintf("POST %s HTTP/1.1\r\nHost: api.example\r\nx-tenant-id: acme\r\nContent-Type: application/json\r\nContent-Length: 2\r\n\r\n{}", concurrencyPath),
			send: func() (int, error) {
				r, err := s.post(concurrencyPath, map[string]string{"x-tenant-id": "acme"})
				if err != nil {
					return 0, err
				}
				return r.status, nil
			},
			inFlight:    inFlightSeries,
			cancelled:   `ratelimit_authz_reservations_cancelled_total{bucket="db_pool"}`,
			stallStatus: http.StatusServiceUnavailable,
		}
		c.server = s.startServer(serverBinary(t), concurrencyConfig(t, s.logs.dir, 5, ttl))
		c.run(t)
	})
}

func TestCancelledRateLimitCallsHoldNoSlot(t *testing.T) {
	bothPorts(t, func(t *testing.T, lean bool) {
		up := startGatedUpstream(t)
		w, ttl := within(lean)
		files := rlsExamples(t)
		files["inflight.yaml"] = strings.Replace(files["inflight.yaml"], "lease_ttl: 60s", fmt.Sprintf("lease_ttl: %ds", int(ttl.Seconds())), 1)
		s := startRLSFiles(t, lean, up.addr, files)
		c := &cancelCase{s: s, server: s.server, up: up, cluster: "cluster.ratelimit.", within: w, lean: lean,
			request: fmt.Sprintf("GET %s HTTP/1.1\r\nHost: api.example\r\nx-tenant-id: acme\r\n\r\n", rlsInflightPath),
			send: func() (int, error) {
				r, err := s.get(s.addrs.Listener, rlsInflightPath, map[string]string{"x-tenant-id": "acme"})
				if err != nil {
					return 0, err
				}
				return r.status, nil
			},
			inFlight:    rlsInflightSeries("ratelimit_authz_inflight_requests", ""),
			cancelled:   rlsInflightSeries("ratelimit_authz_rls_descriptors_total", "cancelled"),
			stallStatus: http.StatusOK,
		}
		c.run(t)
	})
}

func (c *cancelCase) run(t *testing.T) {
	s := c.s
	t.Cleanup(func() { syscall.Kill(c.server.PID(), syscall.SIGCONT) }) // never left stopped
	calls := func() map[string]int64 {
		return s.envoyStats(`^` + c.cluster + `upstream_rq_(total|tx_reset|timeout|active)$`)
	}
	delta := func(before map[string]int64, name string) int64 {
		return calls()[c.cluster+name] - before[c.cluster+name]
	}
	signal := func(sig syscall.Signal) {
		t.Helper()
		if err := syscall.Kill(c.server.PID(), sig); err != nil {
			t.Fatalf("%v the server: %v", sig, err)
		}
	}
	// concurrent sends n requests at once and returns their statuses.
	concurrent := func(n int) <-chan int {
		out := make(chan int, n)
		for range n {
			go func() {
				st, err := c.send()
				if err != nil {
					t.Error(err)
				}
				out <- st
			}()
		}
		return out
	}
	// slotsFree sends 5 requests at once and requires the upstream to
	// hold all 5 within cancelledWithin.
	slotsFree := func(what string) {
		t.Helper()
		// No lease left within c.within of the cancelled calls' end.
		start := time.Now()
		poll.Until(t, 10*time.Second+c.within, 10*time.Millisecond, func() error {
			if v := s.serverMetric(c.inFlight); v != 0 {
				return fmt.Errorf("after %s %v leases are held", what, v)
			}
			return nil
		})
		if d := time.Since(start); d > c.within {
			t.Errorf("after %s the leases were gone %v later, want within %v", what, d.Round(time.Millisecond), c.within)
		}
		// And the 5 slots take 5 requests sent at once.
		c.up.close()
		statuses := concurrent(5)
		poll.Until(t, 10*time.Second, 5*time.Millisecond, func() error {
			if held, _ := c.up.holding(); held != 5 {
				return fmt.Errorf("after %s the upstream holds %d of 5 requests sent at once", what, held)
			}
			return nil
		})
		c.up.open()
		for range 5 {
			if st := <-statuses; st != http.StatusOK {
				t.Fatalf("after %s: status %d", what, st)
			}
		}
		poll.Until(t, 10*time.Second, 10*time.Millisecond, func() error {
			if v := s.serverMetric(c.inFlight); v != 0 {
				return fmt.Errorf("%v in flight after the requests ended", v)
			}
			return nil
		})
		t.Logf("after %s: %v reservations given back in all", what, s.serverMetric(c.cancelled))
	}
	// raw writes 5 requests on connections of their own.
	raw := func() []net.Conn {
		t.Helper()
		var cs []net.Conn
		for range 5 {
			conn, err := net.Dial("tcp", s.addrs.Listener)
			if err != nil {
				t.Fatal(err)
			}
			if _, err := conn.Write([]byte(c.request)); err != nil {
				t.Fatal(err)
			}
			cs = append(cs, conn)
		}
		return cs
	}

	// 1. Clients that hang up straight after writing: Envoy sends the
	// calls of some (it may read the hang-up first) and resets them.
	before := calls()
	for _, conn := range raw() {
		conn.Close()
	}
	time.Sleep(200 * time.Millisecond)
	poll.Until(t, 10*time.Second, 10*time.Millisecond, func() error {
		if n := calls()[c.cluster+"upstream_rq_active"]; n != 0 {
			return fmt.Errorf("%d calls active", n)
		}
		return nil
	})
	t.Logf("5 clients hung up at once: Envoy sent %d calls and reset %d", delta(before, "upstream_rq_total"), delta(before, "upstream_rq_tx_reset"))
	slotsFree("5 clients hung up at once")

	// 2. Clients that hang up while their calls are in flight (held up by
	// stopping the node): Envoy resets the 5 calls.
	before = calls()
	signal(syscall.SIGSTOP)
	cs := raw()
	poll.Until(t, 10*time.Second, 5*time.Millisecond, func() error {
		if n := calls()[c.cluster+"upstream_rq_active"]; n != 5 {
			return fmt.Errorf("%d calls in flight, want 5", n)
		}
		return nil
	})
	for _, conn := range cs {
		conn.Close()
	}
	poll.Until(t, 10*time.Second, 5*time.Millisecond, func() error {
		if n := delta(before, "upstream_rq_tx_reset"); n != 5 {
			return fmt.Errorf("Envoy reset %d calls, want 5", n)
		}
		return nil
	})
	signal(syscall.SIGCONT)
	slotsFree("5 clients hung up during their calls")

	// 3. Calls that time out while the node is stopped.
	before = calls()
	signal(syscall.SIGSTOP)
	statuses := concurrent(5)
	for range 5 {
		if st := <-statuses; st != c.stallStatus {
			t.Errorf("a call timed out in the stall: status %d, want %d", st, c.stallStatus)
		}
	}
	time.Sleep(100 * time.Millisecond) // stopped 0.35 s or more past the timeout
	signal(syscall.SIGCONT)
	if n := delta(before, "upstream_rq_timeout"); n != 5 {
		t.Fatalf("%d calls timed out in the stall, want 5", n)
	}
	slotsFree("5 calls timed out in a stall")
	exp := s.serverMetric("ratelimit_authz_inflight_leases_expired_total")
	if c.lean && exp != 0 {
		t.Errorf("%v leases expired: a cancelled call's lease waited for its time to live", exp)
	}
	t.Logf("%v leases of cancelled calls expired (their resets came after the answers)", exp)
}
