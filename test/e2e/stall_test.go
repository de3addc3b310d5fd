package e2e

import (
	"context"
	"crypto/tls"
	"fmt"
	"net"
	"net/http"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"golang.org/x/net/http2"

	"github.com/ratelimit-authz/ratelimit-authz/internal/poll"
)

const (
	// stallRate is the checks a second sent through Envoy: enough that
	// the checks cancelled during a stall (those waiting longer than
	// checkTimeout) outnumber the lean listener's reset bound, 1000 a
	// second, and few enough that the ones in flight at once stay below
	// the check cluster's default max_requests (1024: rate ×
	// checkTimeout).
	stallRate = 3000
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
// (no connection of the check cluster is closed by the server), and no
// check fails but those whose timeout passed during the stall.
func TestLeanListenerSurvivesStallThroughEnvoy(t *testing.T) {
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

	g := newH2Load(s)
	defer g.stop()
	time.Sleep(time.Second) // load established on one connection
	before := s.envoyStats(`cluster\.ratelimit_authz_check\.upstream_(cx_destroy.*|cx_total|rq_timeout|rq_tx_reset|rq_pending_overflow)$`)
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
	g.stop()
	after := s.envoyStats(`cluster\.ratelimit_authz_check\.upstream_(cx_destroy.*|cx_total|rq_timeout|rq_tx_reset|rq_pending_overflow)$`)
	delta := map[string]int64{}
	for k, v := range after {
		delta[strings.TrimPrefix(k, checkClusterStats)] = v - before[k]
	}
	t.Logf("check cluster over the stall: %v", delta)

	// The stall was real: more checks were cancelled than the reset bound
	// lets through in a second.
	if delta["upstream_rq_timeout"] <= 1000 {
		t.Fatalf("%d checks timed out during the stall, want more than 1000 (the lean listener's reset bound): the load did not reach %d/s", delta["upstream_rq_timeout"], stallRate)
	}
	if n := delta["upstream_cx_destroy_remote"]; n != 0 {
		t.Errorf("the server closed %d of Envoy's connections to the lean listener, want none", n)
	}
	if n := delta["upstream_rq_pending_overflow"]; n != 0 {
		t.Errorf("%d checks overflowed the check cluster's circuit breaker: the load is above what this test is for", n)
	}

	// A check may fail only if its timeout passed while the server was
	// stopped (or as it woke).
	var lost, timedOut []h2Exchange
	all := g.results()
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
	t.Logf("%d requests at %d/s; stalled %v from %s; %d failed within the stall, %d outside it",
		len(all), stallRate, stall, stopAt.Format("15:04:05.000"), len(timedOut), len(lost))
	if len(lost) > 0 {
		t.Errorf("%d checks failed that had not timed out during the stall; first ones: %v", len(lost), lost[:min(len(lost), 10)])
	}
}

// h2Load sends stallRate requests a second through Envoy's listener over
// one cleartext HTTP/2 connection, each on a goroutine of its own, so
// requests held up by a stall do not slow the rate.
type h2Load struct {
	s      *stack
	client *http.Client
	quit   chan struct{}
	once   sync.Once
	wg     sync.WaitGroup

	mu   sync.Mutex
	recs []h2Exchange
}

// h2Exchange is one request and how it ended.
type h2Exchange struct {
	start  time.Time
	status int // 0 on a transport error
	err    error
}

// failed reports a transport error or an answer other than admitted (200)
// or limited (429): ext_authz's errors are 503 (status_on_error) and 403.
func (e h2Exchange) failed() bool {
	return e.err != nil || (e.status != http.StatusOK && e.status != http.StatusTooManyRequests)
}

func (e h2Exchange) String() string {
	if e.err != nil {
		return fmt.Sprintf("%s: %v", e.start.Format("15:04:05.000"), e.err)
	}
	return fmt.Sprintf("%s: %d", e.start.Format("15:04:05.000"), e.status)
}

func newH2Load(s *stack) *h2Load {
	g := &h2Load{
		s: s,
		client: &http.Client{
			Timeout: 5 * time.Second,
			Transport: &http2.Transport{
				AllowHTTP: true,
				DialTLSContext: func(ctx context.Context, network, addr string, _ *tls.Config) (net.Conn, error) {
					return (&net.Dialer{}).DialContext(ctx, network, addr)
				},
			},
		},
		quit: make(chan struct{}),
	}
	g.wg.Go(func() {
		const step = 2 * time.Millisecond
		start := time.Now()
		sent := 0
		tick := time.NewTicker(step)
		defer tick.Stop()
		for {
			select {
			case <-g.quit:
				return
			case now := <-tick.C:
				for due := int(now.Sub(start) * stallRate / time.Second); sent < due; sent++ {
					g.wg.Go(g.one)
				}
			}
		}
	})
	return g
}

func (g *h2Load) one() {
	e := h2Exchange{start: time.Now()}
	req, err := http.NewRequest(http.MethodPost, "http://"+g.s.addrs.Listener+activitiesPath, strings.NewReader(`{}`))
	if err != nil {
		panic(err) // a constant, valid URL
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("x-tenant-id", "stall")
	resp, err := g.client.Do(req)
	if err == nil {
		_, err = readAllClose(resp)
		e.status = resp.StatusCode
	}
	e.err = err
	g.mu.Lock()
	g.recs = append(g.recs, e)
	g.mu.Unlock()
}

// stop ends the load and waits for the requests in flight.
func (g *h2Load) stop() {
	g.once.Do(func() {
		close(g.quit)
		g.wg.Wait()
		g.client.CloseIdleConnections()
	})
}

func (g *h2Load) results() []h2Exchange {
	g.mu.Lock()
	defer g.mu.Unlock()
	return append([]h2Exchange(nil), g.recs...)
}
