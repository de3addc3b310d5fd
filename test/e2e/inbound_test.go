package e2e

import (
	"net/http"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// TestInboundFloodStopsAtEnvoy: a webhook flood on one channel is refused
// at Envoy once the channel's 500 per window are spent, before the app sees
// more; another channel passes untouched in the same window. The shipped
// 1 s window is stretched to 5 s so that the flood fits in one window on a
// slow or busy machine too.
func TestInboundFloodStopsAtEnvoy(t *testing.T) {
	const (
		limit   = 500 // inbound per window per channel in config/ratelimit.yaml
		window  = 5 * time.Second
		flood   = 650
		quiet   = 50
		workers = 8
	)
	s := newStack(t)
	s.startServer(serverBinary(t), serverConfigWith(t, "  inbound:\n    limit: 500\n    per: 1s\n", "  inbound:\n    limit: 500\n    per: 5s\n"))

	var start, end time.Time
	var ok, limited, quietOK, other atomic.Int64
	for attempt := 0; attempt < 2; attempt++ {
		ok.Store(0)
		limited.Store(0)
		quietOK.Store(0)
		other.Store(0)
		s.up.reset()
		time.Sleep(time.Until(time.Now().Truncate(window).Add(window + 10*time.Millisecond)))
		start = time.Now()
		work := make(chan string)
		var wg sync.WaitGroup
		for range workers {
			wg.Go(func() {
				for path := range work {
					r, err := s.post(path, nil)
					switch {
					case err != nil:
						other.Add(1)
					case r.status == http.StatusOK && path == "/api/inbound/quiet":
						quietOK.Add(1)
					case r.status == http.StatusOK:
						ok.Add(1)
					case r.status == http.StatusTooManyRequests && path == "/api/inbound/flood":
						limited.Add(1)
					default:
						other.Add(1)
					}
				}
			})
		}
		for i := range flood + quiet {
			if i%((flood+quiet)/quiet) == 0 {
				work <- "/api/inbound/quiet"
			} else {
				work <- "/api/inbound/flood"
			}
		}
		close(work)
		wg.Wait()
		end = time.Now()
		if start.Truncate(window).Equal(end.Truncate(window)) {
			break
		}
		t.Logf("flood took %v and crossed a window boundary; retrying", end.Sub(start))
	}
	if !start.Truncate(window).Equal(end.Truncate(window)) {
		t.Fatalf("flood crossed a window boundary twice (%v); machine too slow", end.Sub(start))
	}
	t.Logf("%d requests in %v: flood %d ok, %d × 429; quiet %d ok", flood+quiet, end.Sub(start), ok.Load(), limited.Load(), quietOK.Load())
	const floodSent = flood
	if other.Load() != 0 {
		t.Errorf("%d requests failed or got another status", other.Load())
	}
	if ok.Load() != limit || limited.Load() != floodSent-limit {
		t.Errorf("flood channel: %d ok and %d × 429, want %d and %d", ok.Load(), limited.Load(), limit, floodSent-limit)
	}
	if got := s.up.count("/api/inbound/flood"); got != limit {
		t.Errorf("app saw %d flood requests, want %d", got, limit)
	}
	if quietOK.Load() != quiet || s.up.count("/api/inbound/quiet") != quiet {
		t.Errorf("quiet channel: %d ok, app saw %d, want %d", quietOK.Load(), s.up.count("/api/inbound/quiet"), quiet)
	}
}
