package e2e

import (
	"fmt"
	"net/http"
	"net/http/httptest"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/ratelimit-authz/ratelimit-authz/internal/poll"
)

// tokenBudget is the limit of config/rls/config/llm.yaml, and
// tokensPerRequest what the test's upstream reports for every request.
const tokenBudget, tokensPerRequest = 10000, 700

// llmUpstream is an LLM-like application: every request uses
// tokensPerRequest tokens, reported in x-usage-total-tokens; it counts
// the requests that reached it and the tokens it reported, per tenant.
type llmUpstream struct {
	addr string

	mu     sync.Mutex
	served map[string]int
}

func startLLMUpstream(t *testing.T) *llmUpstream {
	t.Helper()
	u := &llmUpstream{served: map[string]int{}}
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		u.mu.Lock()
		u.served[r.Header.Get("x-tenant-id")]++
		u.mu.Unlock()
		w.Header().Set("x-usage-total-tokens", strconv.Itoa(tokensPerRequest))
		w.Write([]byte(`{"choices":[]}`))
	}))
	t.Cleanup(srv.Close)
	u.addr = srv.Listener.Addr().String()
	return u
}

func (u *llmUpstream) count(tenant string) int {
	u.mu.Lock()
	defer u.mu.Unlock()
	return u.served[tenant]
}

// TestRLSTokenBudgetThroughEnvoy: a tenant's budget of 10,000 tokens a
// minute through Envoy's ratelimit filter, as shipped (route llm of
// envoy/ratelimit-rls.yaml, config/rls/config/llm.yaml): the tokens known
// only from the upstream's x-usage-total-tokens, charged at the end of
// each stream (apply_on_stream_done) and checked before each request
// (hits_addend 0):
// once the budget is spent, requests get 429 with Retry-After before the
// upstream; every admitted request's tokens are charged; and the tokens
// charged stay within the budget plus the in-flight bound, for one client
// and for eight concurrent ones.
func TestRLSTokenBudgetThroughEnvoy(t *testing.T) { bothPorts(t, testRLSTokenBudget) }

func testRLSTokenBudget(t *testing.T, lean bool) {
	up := startLLMUpstream(t)
	s := startRLSExamples(t, lean, up.addr)
	charges := func() float64 {
		return s.serverMetric(`ratelimit_authz_rls_descriptors_total{bucket="rls/llm/tenant",decision="charged"}`) +
			s.serverMetric(`ratelimit_authz_rls_descriptors_total{bucket="rls/llm/tenant",decision="charged_over"}`)
	}
	chat := func(tenant string) *response {
		r, err := s.get(s.addrs.Listener, "/v1/chat", map[string]string{"x-tenant-id": tenant})
		if err != nil {
			t.Error(err)
			return &response{}
		}
		return r
	}

	for _, clients := range []int{1, 8} {
		t.Run(fmt.Sprintf("%d clients", clients), func(t *testing.T) {
			before := charges()
			var tenant string
			inOneMinute(t, func(attempt int) {
				tenant = fmt.Sprintf("tenant-%d-%d", clients, attempt)
				// Each client sends until it is refused.
				var wg sync.WaitGroup
				for range clients {
					wg.Go(func() {
						for range 100 {
							if r := chat(tenant); r.status != 200 {
								if r.status != 429 {
									t.Errorf("status %d, want 200 or 429", r.status)
								}
								return
							}
						}
						t.Error("100 requests admitted")
					})
				}
				wg.Wait()
			})
			served := up.count(tenant)
			// Every admitted request's tokens are charged: one charge each,
			// the last ones arriving after their answers.
			poll.UntilTrue(t, 5*time.Second, 20*time.Millisecond, func() bool { return charges()-before >= float64(served) })
			if got := charges() - before; got != float64(served) {
				t.Errorf("%v charges for %d requests admitted", got, served)
			}
			charged := served * tokensPerRequest
			// The budget was spent before the first refusal, and overshot
			// by at most what was in flight: each client's request in
			// flight and its previous request's charge still on its way.
			bound := tokenBudget + 2*clients*tokensPerRequest
			t.Logf("%d clients: %d requests admitted, %d tokens charged of %d (overshoot %d, bound %d)",
				clients, served, charged, tokenBudget, charged-tokenBudget, bound-tokenBudget)
			if charged < tokenBudget || charged > bound {
				t.Errorf("%d tokens charged: want between %d and %d", charged, tokenBudget, bound)
			}
			// Once spent: 429 with Retry-After, before the upstream.
			for range 10 {
				r := chat(tenant)
				ra, _ := strconv.Atoi(r.header.Get("retry-after"))
				if r.status != 429 || ra < 1 || ra > 60 {
					t.Errorf("after the budget: %d, retry-after %q; want 429 and 1..60", r.status, r.header.Get("retry-after"))
				}
			}
			if got := up.count(tenant); got != served {
				t.Errorf("the upstream served %d requests after the budget was spent", got-served)
			}
		})
	}
}

// inOneMinute runs f, starting with at least 20 s left in the wall-clock
// minute (the budget's window); when f straddles a minute boundary (a slow
// machine) it runs it once more, with attempt 1, in the next minute.
func inOneMinute(t *testing.T, f func(attempt int)) {
	t.Helper()
	for attempt := range 2 {
		if left := time.Until(time.Now().Truncate(time.Minute).Add(time.Minute)); left < 20*time.Second {
			time.Sleep(left + 10*time.Millisecond)
		}
		start := time.Now()
		f(attempt)
		if time.Now().Truncate(time.Minute).Equal(start.Truncate(time.Minute)) {
			return
		}
		t.Logf("the run took %v and crossed a minute boundary; again", time.Since(start))
	}
	t.Fatal("two runs crossed a minute boundary")
}
