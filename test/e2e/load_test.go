package e2e

import (
	"fmt"
	"io"
	"net/http"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ratelimit-authz/ratelimit-authz/internal/poll"
)

// load is an open-loop generator of POST /api/activities through Envoy:
// a pacer releases requests at a fixed rate whatever the answers, for
// the tenant currently set, and every exchange is recorded. A release
// that finds every worker busy is dropped and counted, so a slow stack
// lowers the offered rate (which the reports show) instead of queueing.
type load struct {
	s       *stack
	client  *http.Client
	tenant  atomic.Pointer[string]
	dropped atomic.Int64
	busy    []atomic.Int64 // per worker: start of its request in flight (Unix ns), 0 when idle

	mu   sync.Mutex
	recs []exchange

	stopOnce sync.Once
	quit     chan struct{}
	done     sync.WaitGroup
}

// exchange is one request of the load and how it ended.
type exchange struct {
	start, end time.Time
	tenant     string
	status     int   // 0 on a transport error
	quota      int   // q of the activity_create RateLimit-Policy item; 0 when absent
	err        error // transport error
}

// failed reports whether the client saw a failure: a transport error or
// an answer other than admitted (200) or limited (429).
func (e exchange) failed() bool {
	return e.err != nil || (e.status != http.StatusOK && e.status != http.StatusTooManyRequests)
}

func (e exchange) String() string {
	if e.err != nil {
		return fmt.Sprintf("%s %s: %v", e.start.Format("15:04:05.000"), e.tenant, e.err)
	}
	return fmt.Sprintf("%s %s: %d", e.start.Format("15:04:05.000"), e.tenant, e.status)
}

const loadWorkers = 24

var quotaItem = regexp.MustCompile(`"activity_create";q=(\d+)`)

// startLoad starts perSecond requests a second for tenant, on loadWorkers
// workers over HTTP/1.1. Stop it before the processes stop (defer in the
// test), or it records their shutdown.
func (s *stack) startLoad(tenant string, perSecond int) *load {
	return s.startLoadWith(tenant, perSecond, loadWorkers,
		&http.Transport{Proxy: nil, MaxIdleConns: loadWorkers, MaxIdleConnsPerHost: loadWorkers})
}

// startLoadWith is startLoad on workers workers sending through rt.
func (s *stack) startLoadWith(tenant string, perSecond, workers int, rt http.RoundTripper) *load {
	l := &load{
		s:      s,
		client: &http.Client{Timeout: 5 * time.Second, Transport: rt},
		busy:   make([]atomic.Int64, workers),
		quit:   make(chan struct{}),
	}
	l.setTenant(tenant)
	release := make(chan struct{})
	for w := range workers {
		l.done.Go(func() {
			for range release {
				l.one(&l.busy[w])
			}
		})
	}
	l.done.Go(func() {
		defer close(release)
		const step = 5 * time.Millisecond
		start := time.Now()
		sent := 0
		tick := time.NewTicker(step)
		defer tick.Stop()
		for {
			select {
			case <-l.quit:
				return
			case now := <-tick.C:
				due := int(now.Sub(start) * time.Duration(perSecond) / time.Second)
				for ; sent < due; sent++ {
					select {
					case release <- struct{}{}:
					default:
						l.dropped.Add(1)
					}
				}
			}
		}
	})
	return l
}

func (l *load) setTenant(tenant string) { l.tenant.Store(&tenant) }

func (l *load) one(busy *atomic.Int64) {
	e := exchange{tenant: *l.tenant.Load(), start: time.Now()}
	busy.Store(e.start.UnixNano())
	defer busy.Store(0)
	req, err := http.NewRequest(http.MethodPost, "http://"+l.s.addrs.Listener+activitiesPath, strings.NewReader(`{}`))
	if err != nil {
		panic(err) // a constant, valid URL
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("x-tenant-id", e.tenant)
	resp, err := l.client.Do(req)
	if err == nil {
		_, err = readAllClose(resp)
		e.status = resp.StatusCode
		if m := quotaItem.FindStringSubmatch(resp.Header.Get("ratelimit-policy")); m != nil {
			e.quota, _ = strconv.Atoi(m[1])
		}
	}
	e.err, e.end = err, time.Now()
	l.mu.Lock()
	l.recs = append(l.recs, e)
	l.mu.Unlock()
}

// stop ends the load and waits for the requests in flight.
func (l *load) stop() {
	l.stopOnce.Do(func() {
		close(l.quit)
		l.done.Wait()
		l.client.CloseIdleConnections()
	})
}

// settled returns nil once no request started before t is in flight:
// whatever of them the app was to see, it has seen.
func (l *load) settled(t time.Time) error {
	for i := range l.busy {
		if b := l.busy[i].Load(); b != 0 && b < t.UnixNano() {
			return fmt.Errorf("a request started %v before %s is still in flight", t.Sub(time.Unix(0, b)), t.Format("15:04:05"))
		}
	}
	return nil
}

// between returns the exchanges started in [from, to), in start order.
func (l *load) between(from, to time.Time) []exchange {
	l.mu.Lock()
	var out []exchange
	for _, e := range l.recs {
		if !e.start.Before(from) && e.start.Before(to) {
			out = append(out, e)
		}
	}
	l.mu.Unlock()
	slices.SortFunc(out, func(a, b exchange) int { return a.start.Compare(b.start) })
	return out
}

// offered counts the requests of tenant sent per window of ws.
func (l *load) offered(tenant string, ws []window) []int {
	out := make([]int, len(ws))
	if len(ws) == 0 {
		return out
	}
	for _, e := range l.between(ws[0].start, ws[len(ws)-1].start.Add(time.Second)) {
		if e.tenant == tenant {
			out[int(e.start.Sub(ws[0].start)/time.Second)]++
		}
	}
	return out
}

// checkNoFailures fails t when a request started in [from, to) failed.
func (l *load) checkNoFailures(t *testing.T, what string, from, to time.Time) {
	t.Helper()
	recs := l.between(from, to)
	var failed []exchange
	for _, e := range recs {
		if e.failed() {
			failed = append(failed, e)
		}
	}
	if len(failed) > 0 {
		t.Errorf("%s: %d of %d requests failed; first ones: %v", what, len(failed), len(recs), failed[:min(len(failed), 10)])
		return
	}
	t.Logf("%s: %d requests, none failed (all 200 or 429)", what, len(recs))
}

// propagation waits until every answer for tenant carries quota q (30
// answers in a row, so that under round-robin every node has answered
// several times) and returns how long after changed the first request
// answered with q started, and the first request from which on every
// answer carried q: by then every node had applied q (give or take the
// few milliseconds between a request's start and its Check).
func (l *load) propagation(t *testing.T, tenant string, changed time.Time, q int) (first, all time.Duration) {
	t.Helper()
	poll.Until(t, 3*time.Second, 10*time.Millisecond, func() error {
		var firstNew, allNew *exchange
		newInARow := 0
		for _, e := range l.between(changed, time.Now()) {
			switch {
			case e.tenant != tenant || e.failed():
				continue
			case e.quota == q:
				if firstNew == nil {
					firstNew = &e
				}
				if allNew == nil {
					allNew = &e
				}
				newInARow++
			default:
				allNew, newInARow = nil, 0
			}
		}
		if newInARow < 30 {
			return fmt.Errorf("%d answers in a row with q=%d since the change, want 30", newInARow, q)
		}
		first, all = firstNew.start.Sub(changed), allNew.start.Sub(changed)
		return nil
	})
	return first, all
}

func readAllClose(resp *http.Response) (int64, error) {
	defer resp.Body.Close()
	return io.Copy(io.Discard, resp.Body)
}

// windowsLine formats admitted (and offered) counts per window for a log.
func windowsLine(ws []window, offered []int) string {
	var b strings.Builder
	for i, w := range ws {
		if i > 0 {
			b.WriteString(" ")
		}
		fmt.Fprintf(&b, "%s=%d", w.start.Format("05"), w.admitted)
		if offered != nil {
			fmt.Fprintf(&b, "/%d", offered[i])
		}
	}
	return b.String()
}

// distribution is "min/median/max" of the admitted counts.
func distribution(ws []window) string {
	if len(ws) == 0 {
		return "-"
	}
	n := make([]int, len(ws))
	for i, w := range ws {
		n[i] = w.admitted
	}
	slices.Sort(n)
	return fmt.Sprintf("min %d, median %d, max %d", n[0], n[len(n)/2], n[len(n)-1])
}
