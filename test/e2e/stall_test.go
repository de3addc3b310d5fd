package e2e

import (
	"context"
	"crypto/tls"
	"fmt"
	"net"
	"strings"
	"syscall"
	"testing"
	"time"

	"golang.org/x/net/http2"

	"github.com/ratelimit-authz/ratelimit-authz/internal/poll"
)

const (
	// stallRate is the checks a second sent through Envoy: enough that
	// over a thousand checks are cancelled during a stall (those waiting
	// longer than checkTimeout), read by the server in one burst as it
	// wakes, and few enough that the ones in flight at once stay below
	// the check cluster's default max_requests (1024: rate ×
	// checkTimeout).
	stallRate = 2500
	// stallWorkers is more than the requests in flight at once while the
	// server is stopped (stallRate × checkTimeout).
	stallWorkers = 1500
	// stall is how long the server is stopped: longer than checkTimeout,
	// as a long GC pause, CPU starvation or VM steal.
	stall = 700 * time.Millisecond
	// checkTimeout is the ext_authz timeout of the shipped bootstrap.
	checkTimeout = 250 * time.Millisecond
	// wakeMargin is what a check started just before the end of the stall
	// may still lose: the server's catching up with what arrived during
	// the stall, and Envoy's timer.
	wakeMargin = 100 * time.Millisecond
)

// TestLeanListenerSurvivesStallThroughEnvoy: under load through the real
// Envoy, the server stopped (SIGSTOP) for longer than the ext_authz
// timeout and continued. Envoy cancels every check that waited past its
// timeout, and the server, as it wakes, answers them and then reads the
// cancellations in a burst. The lean listener keeps Envoy's connection
// (no GOAWAY, no connection of the check cluster closed), and no check
// fails but those whose timeout passed during the stall.
func TestLeanListenerSurvivesStallThroughEnvoy(t *testing.T) {
	if raceBuild {
		t.Skip("the race detector slows the load below stallRate; make test runs this without it")
	}
	serverBin := serverBinary(t)
	config := serverConfigPath(t)
	s := prepareStack(t, 1)
	s.startEnvoy()
	server := s.startServer(serverBin, config)
	t.Cleanup(func() { syscall.Kill(server.PID(), syscall.SIGCONT) }) // never left stopped
	poll.Until(t, 20*time.Second, 100*time.Millisecond, func() error {
		if h := s.checkHealth(t)[s.check[0]]; h != "healthy" {
			return fmt.Errorf("ext_authz cluster endpoint %s: health %q", s.check[0], h)
		}
		return nil
	})

	// One cleartext HTTP/2 connection to Envoy, and workers enough for
	// every request held up by the stall.
	l := s.startLoadWith("stall", stallRate, stallWorkers, &http2.Transport{
		AllowHTTP: true,
		DialTLSContext: func(ctx context.Context, network, addr string, _ *tls.Config) (net.Conn, error) {
			return (&net.Dialer{}).DialContext(ctx, network, addr)
		},
	})
	defer l.stop()
	time.Sleep(time.Second) // load established on one connection
	before := s.envoyStats(`cluster\.ratelimit_authz_check\.upstream_(cx_destroy.*|cx_close_notify|cx_total|rq_timeout|rq_tx_reset|rq_pending_overflow)$`)
	stopAt := time.Now()
	if err := syscall.Kill(server.PID(), syscall.SIGSTOP); err != nil {
		t.Fatalf("SIGSTOP the server (pid %d): %v", server.PID(), err)
	}
	time.Sleep(stall)
	contAt := time.Now()
	if err := syscall.Kill(server.PID(), syscall.SIGCONT); err != nil {
		t.Fatalf("SIGCONT the server (pid %d): %v", server.PID(), err)
	}
	time.Sleep(1500 * time.Millisecond)
	l.stop()
	after := s.envoyStats(`cluster\.ratelimit_authz_check\.upstream_(cx_destroy.*|cx_close_notify|cx_total|rq_timeout|rq_tx_reset|rq_pending_overflow)$`)
	delta := map[string]int64{}
	for k, v := range after {
		delta[strings.TrimPrefix(k, checkClusterStats)] = v - before[k]
	}
	t.Logf("check cluster over the stall: %v", delta)

	// The stall was real: over a thousand checks were cancelled.
	if delta["upstream_rq_timeout"] <= 1000 {
		t.Fatalf("%d checks timed out during the stall, want more than 1000: the load did not reach %d/s", delta["upstream_rq_timeout"], stallRate)
	}
	// The server's GOAWAY (upstream_cx_close_notify) or its close ends a
	// connection, which Envoy counts as closed by either side depending
	// on who is first.
	if n, m := delta["upstream_cx_close_notify"], delta["upstream_cx_destroy"]; n != 0 || m != 0 {
		t.Errorf("Envoy's connections to the lean listener: %d ended by GOAWAY, %d closed; want none", n, m)
	}
	if n := delta["upstream_rq_pending_overflow"]; n != 0 {
		t.Errorf("%d checks overflowed the check cluster's circuit breaker: the load is above what this test is for", n)
	}

	// A check may fail only if its timeout passed while the server was
	// stopped (or as it woke).
	var lost, timedOut []exchange
	all := l.between(time.Time{}, time.Now())
	for _, e := range all {
		if !e.failed() {
			continue
		}
		if deadline := e.start.Add(checkTimeout); !deadline.Before(stopAt) && deadline.Before(contAt.Add(wakeMargin)) {
			timedOut = append(timedOut, e)
			continue
		}
		lost = append(lost, e)
	}
	t.Logf("%d requests at %d/s (%d not sent: every worker busy); stalled %v from %s; %d failed within the stall, %d outside it",
		len(all), stallRate, l.dropped.Load(), stall, stopAt.Format("15:04:05.000"), len(timedOut), len(lost))
	if len(lost) > 0 {
		t.Errorf("%d checks failed that had not timed out during the stall; first ones: %v", len(lost), lost[:min(len(lost), 10)])
	}
}
