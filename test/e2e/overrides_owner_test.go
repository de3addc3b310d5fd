package e2e

import (
	"fmt"
	"net/http"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ratelimit-authz/ratelimit-authz/internal/poll"
)

// burstOnChannel sends n webhooks to path through Envoy within one
// wall-clock second, header(i) giving the i-th request's headers, and
// returns how many were admitted (200) and refused (429). A burst that
// crosses a second boundary is sent again in a fresh second; the app's
// counts are reset before each attempt.
func burstOnChannel(t *testing.T, s *stack, path string, n int, header func(i int) map[string]string) (ok, limited int) {
	t.Helper()
	const workers = 8
	for attempt := 0; attempt < 3; attempt++ {
		var okN, limN, other atomic.Int64
		s.up.reset() // the app's counts are of the last attempt only
		time.Sleep(time.Until(time.Now().Truncate(time.Second).Add(time.Second + 10*time.Millisecond)))
		start := time.Now()
		work := make(chan int)
		var wg sync.WaitGroup
		for range workers {
			wg.Go(func() {
				for i := range work {
					r, err := s.post(path, header(i))
					switch {
					case err != nil:
						other.Add(1)
					case r.status == http.StatusOK:
						okN.Add(1)
					case r.status == http.StatusTooManyRequests:
						limN.Add(1)
					default:
						other.Add(1)
					}
				}
			})
		}
		for i := range n {
			work <- i
		}
		close(work)
		wg.Wait()
		if other.Load() != 0 {
			t.Fatalf("%s: %d requests failed or got another status", path, other.Load())
		}
		if start.Truncate(time.Second).Equal(time.Now().Truncate(time.Second)) {
			t.Logf("%s: %d webhooks in %v: %d admitted, %d × 429", path, n, time.Since(start).Round(time.Millisecond), okN.Load(), limN.Load())
			return int(okN.Load()), int(limN.Load())
		}
		t.Logf("%s: burst crossed a second boundary (%v); again", path, time.Since(start))
	}
	t.Fatalf("%s: every burst crossed a second boundary; machine too slow", path)
	return 0, 0
}

// TestTenantHeaderDoesNotPickAChannelsOverride: through the real Envoy,
// with `limits set bigco inbound 5000/1s`, a client claiming x-tenant-id:
// bigco on a channel gets the channel's configured 500/s, alternating
// claimed tenants does not reset the channel's count, and only a channel
// recorded as bigco's (`limits owner set channel … bigco`) gets 5000/s.
func TestTenantHeaderDoesNotPickAChannelsOverride(t *testing.T) {
	const (
		configured = 500 // inbound per channel per second, config/ratelimit.yaml
		webhooks   = 700
	)
	c := newCluster(t, 1)
	nd := c.nodes[0]
	c.cli(t, "limits", "set", "bigco", "inbound", "5000/1s", "--actor", "e2e")
	c.cli(t, "limits", "set", "slowco", "inbound", "50/1m", "--actor", "e2e")
	poll.Until(t, 5*time.Second, 20*time.Millisecond, func() error {
		if got := nd.metric(t, "ratelimit_authz_overrides_loaded"); got != 2 {
			return fmt.Errorf("overrides loaded %v, want 2", got)
		}
		return nil
	})

	ok, limited := burstOnChannel(t, c.stack, "/api/inbound/ch-claimed", webhooks, func(int) map[string]string {
		return map[string]string{"x-tenant-id": "bigco"}
	})
	if ok != configured || limited != webhooks-configured {
		t.Errorf("claiming x-tenant-id bigco: %d admitted and %d × 429, want the channel's configured %d and %d", ok, limited, configured, webhooks-configured)
	}

	tenants := []string{"bigco", "slowco", ""}
	ok, _ = burstOnChannel(t, c.stack, "/api/inbound/ch-alternating", webhooks, func(i int) map[string]string {
		if tn := tenants[i%len(tenants)]; tn != "" {
			return map[string]string{"x-tenant-id": tn}
		}
		return nil
	})
	if ok != configured {
		t.Errorf("alternating tenant headers with other windows: %d admitted, want %d (no reset)", ok, configured)
	}

	c.cli(t, "limits", "owner", "set", "channel", "ch-owned", "bigco", "--actor", "e2e")
	poll.Until(t, 5*time.Second, 20*time.Millisecond, func() error {
		if got := nd.metric(t, "ratelimit_authz_overrides_key_owners"); got != 1 {
			return fmt.Errorf("key owners %v, want 1", got)
		}
		return nil
	})
	ok, limited = burstOnChannel(t, c.stack, "/api/inbound/ch-owned", webhooks, func(i int) map[string]string {
		if i%2 == 0 {
			return map[string]string{"x-tenant-id": "slowco"} // a claim changes nothing here either
		}
		return nil
	})
	if ok != webhooks || limited != 0 {
		t.Errorf("channel owned by bigco: %d admitted and %d × 429, want all %d", ok, limited, webhooks)
	}
	if got := c.up.count("/api/inbound/ch-owned"); got != webhooks {
		t.Errorf("app saw %d webhooks on the owned channel, want %d", got, webhooks)
	}
}
