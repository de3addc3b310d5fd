package e2e

import (
	"fmt"
	"io"
	"net/http"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ratelimit-authz/ratelimit-authz/internal/exampleapp"
	"github.com/ratelimit-authz/ratelimit-authz/internal/poll"
)

const (
	costConfig      = "config/examples/llm-budget.yaml"
	completionsPath = "/api/llm/completions"
	batchPath       = "/api/batch"
	llmTokenBudget  = 10000 // llm_tokens per minute in costConfig
	promptBudget    = 65536 // llm_prompt_bytes per minute
)

// withCostExample adds the Envoy side of the worked example of
// docs/cost-budgets.md to the shipped bootstrap: its routes (headers
// only, as the shipped API routes) and the response header its token
// budget charges from, logged by the gRPC access log.
func withCostExample(cfg []byte) ([]byte, error) {
	s := string(cfg)
	for _, e := range []struct{ anchor, add string }{
		{"              # Login routes:", `              - name: llm_completions
                match: { path: /api/llm/completions }
                route: { cluster: app }
                typed_per_filter_config: *headers_only
              - name: batch
                match: { path: /api/batch }
                route: { cluster: app }
                typed_per_filter_config: *headers_only
`},
		{"              # A cost bucket charged from a response header", `              additional_response_headers_to_log: [ x-usage-total-tokens ]
`},
	} {
		i := strings.Index(s, e.anchor)
		if i < 0 {
			return nil, fmt.Errorf("the shipped bootstrap lacks %q", e.anchor)
		}
		s = s[:i] + e.add + s[i:]
	}
	return []byte(s), nil
}

// awayFromMinuteEdgeBy waits, when less than d is left of the current
// minute, for the next one: the budgets are per minute.
func awayFromMinuteEdgeBy(d time.Duration) {
	if left := time.Until(time.Now().Truncate(time.Minute).Add(time.Minute)); left < d {
		time.Sleep(left + 50*time.Millisecond)
	}
}

// untilDenied runs workers that each send requests back to back until one
// is not admitted (at most 100 each), and returns how many were admitted.
func untilDenied(t *testing.T, workers int, send func(worker int) (*response, error)) int {
	t.Helper()
	var ok atomic.Int64
	var wg sync.WaitGroup
	for w := range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for range 100 {
				r, err := send(w)
				if err != nil {
					t.Error(err)
					return
				}
				if r.status != http.StatusOK {
					return
				}
				ok.Add(1)
			}
		}()
	}
	wg.Wait()
	return int(ok.Load())
}

// TestCostBudgetsThroughEnvoy runs the worked example through the real
// Envoy: an upstream that reports the tokens each completion used, Envoy's
// access log carrying them to the server, a 10,000 tokens a minute budget
// per tenant; a Postgres override; a declared batch size and a budget in
// prompt bytes taken at the check.
func TestCostBudgetsThroughEnvoy(t *testing.T) {
	c := newClusterWith(t, 1, filepath.Join(root(t), costConfig), func(s *stack) { s.envoyEdit = withCostExample })
	nd := c.nodes[0]
	// admitted is the tokens of every completion answered 200: what the
	// access log must have charged once its entries have arrived.
	var admitted atomic.Int64
	completion := func(tenant string, tokens int) (*response, error) {
		r, err := c.post(completionsPath, map[string]string{"x-tenant-id": tenant, exampleapp.TokensHeader: strconv.Itoa(tokens)})
		if err == nil && r.status == http.StatusOK {
			admitted.Add(int64(tokens))
		}
		return r, err
	}
	mustComplete := func(tenant string, tokens int) *response {
		t.Helper()
		r, err := completion(tenant, tokens)
		if err != nil {
			t.Fatal(err)
		}
		return r
	}
	// allCharged waits until the server has charged every admitted token.
	allCharged := func(t *testing.T) float64 {
		t.Helper()
		var got float64
		poll.Until(t, 5*time.Second, 10*time.Millisecond, func() error {
			if got = nd.metric(t, `ratelimit_authz_cost_charged_total{bucket="llm_tokens"}`); got != float64(admitted.Load()) {
				return fmt.Errorf("charged %v, want %d", got, admitted.Load())
			}
			return nil
		})
		return got
	}
	awayFromMinuteEdgeBy(25 * time.Second)

	t.Run("token_budget_in_flight_bound", func(t *testing.T) {
		// Rounds of `inFlight` concurrent completions of `cost` tokens,
		// each round's charges counted before the next: every request of
		// a round is checked before any of its charges arrive, the worst
		// case for that many requests in flight. The round that spends the
		// budget is let in whole; the next is denied before the upstream.
		const tenant, inFlight, cost = "acme", 4, 1500
		var ok, total int
		for round := 1; ; round++ {
			statuses := make([]int, inFlight)
			var wg sync.WaitGroup
			for i := range inFlight {
				wg.Add(1)
				go func() {
					defer wg.Done()
					r, err := completion(tenant, cost)
					if err != nil {
						t.Error(err)
						return
					}
					statuses[i] = r.status
					if r.status == http.StatusTooManyRequests {
						if ra, err := strconv.Atoi(r.header.Get("Retry-After")); err != nil || ra < 1 || ra > 60 {
							t.Errorf("429 with Retry-After %q", r.header.Get("Retry-After"))
						}
					}
				}()
			}
			wg.Wait()
			n := 0
			for _, s := range statuses {
				switch s {
				case http.StatusOK:
					n++
				case http.StatusTooManyRequests:
				default:
					t.Fatalf("round %d: status %d", round, s)
				}
			}
			ok += n
			total += n * cost
			allCharged(t)
			t.Logf("round %d: %d of %d admitted; %d tokens charged", round, n, inFlight, total)
			if n == 0 {
				break
			}
			if round > llmTokenBudget/cost+2 {
				t.Fatalf("round %d still admitted requests", round)
			}
		}
		// The bound of docs/cost-budgets.md: a check admits while the count
		// is below the limit, so the charges reach at most limit − 1 plus
		// the costs of the requests in flight when it ran out.
		if bound := llmTokenBudget - 1 + inFlight*cost; total > bound {
			t.Errorf("charged %d tokens, over the budget plus the in-flight bound %d", total, bound)
		}
		if total < llmTokenBudget {
			t.Errorf("denied with %d of %d tokens charged", total, llmTokenBudget)
		}
		if got := c.up.count(completionsPath); got != ok {
			t.Errorf("the upstream saw %d completions, %d were admitted: a denied one reached it", got, ok)
		}
		t.Logf("%d tokens charged of a %d budget (%d over) with %d requests in flight",
			total, llmTokenBudget, total-llmTokenBudget, inFlight)
	})

	t.Run("override_raises_one_tenant", func(t *testing.T) {
		if r := mustComplete("acme", 1); r.status != http.StatusTooManyRequests {
			t.Fatalf("acme before the override: %d", r.status)
		}
		start := time.Now()
		c.cli(t, "limits", "set", "acme", "llm_tokens", "50000/1m", "--actor", "e2e")
		poll.Until(t, 5*time.Second, 20*time.Millisecond, func() error {
			if r := mustComplete("acme", 1); r.status != http.StatusOK {
				return fmt.Errorf("acme: %d", r.status)
			}
			return nil
		})
		took := time.Since(start)
		t.Logf("override 50000/1m: acme admitted again %v after the command started", took.Round(time.Millisecond))
		if took > time.Second {
			t.Errorf("the override took %v to apply, want ≤ 1s", took)
		}
		if r := mustComplete("globex", 1); r.status != http.StatusOK {
			t.Errorf("another tenant: %d", r.status)
		}
	})

	t.Run("free_running_overshoot", func(t *testing.T) {
		// Workers send completions back to back until each is denied:
		// the overshoot is the tokens of the requests checked while the
		// charges that spent the budget were still on their way.
		const tenant, workers, cost = "freerun", 8, 1000
		ok := untilDenied(t, workers, func(int) (*response, error) { return completion(tenant, cost) })
		total := ok * cost
		allCharged(t)
		t.Logf("%d workers back to back: %d tokens charged of a %d budget (%d over, %d requests)",
			workers, total, llmTokenBudget, total-llmTokenBudget, (total-llmTokenBudget)/cost)
		if total < llmTokenBudget {
			t.Errorf("denied with %d of %d tokens charged", total, llmTokenBudget)
		}
	})

	t.Run("declared_batch_size", func(t *testing.T) {
		batch := func(size string) *response {
			h := map[string]string{"x-tenant-id": "batchco"}
			if size != "" {
				h["x-batch-size"] = size
			}
			return c.mustPost(batchPath, h)
		}
		for i, tc := range []struct {
			size string
			want int
		}{
			{"500", 200}, {"-5", 400}, {"501", 400}, {"1,2", 400}, {"lots", 400},
			{"499", 200}, {"2", 429}, {"", 200}, {"", 429}, {"0", 429},
		} {
			r := batch(tc.size)
			if r.status != tc.want {
				t.Errorf("step %d: x-batch-size %q: %d %s, want %d", i, tc.size, r.status, r.body, tc.want)
			}
			if r.status == http.StatusTooManyRequests && r.header.Get("Retry-After") == "" {
				t.Errorf("step %d: 429 without Retry-After", i)
			}
		}
		// A header sent twice reaches the check joined with ",": refused.
		req, err := http.NewRequest(http.MethodPost, "http://"+c.addrs.Listener+batchPath, nil)
		if err != nil {
			t.Fatal(err)
		}
		req.Header.Set("x-tenant-id", "batchco2")
		req.Header.Add("x-batch-size", "1")
		req.Header.Add("x-batch-size", "2")
		resp, err := c.client.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != http.StatusBadRequest || !strings.Contains(string(body), `"problem":"repeated"`) {
			t.Errorf("x-batch-size sent twice: %d %s, want 400 repeated", resp.StatusCode, body)
		}
		if got := c.up.count(batchPath); got != 3 {
			t.Errorf("the upstream saw %d batches, want 3", got)
		}
	})

	t.Run("content_bytes", func(t *testing.T) {
		body := `{"prompt":"` + strings.Repeat("x", 30000-13) + `"}`
		h := map[string]string{"x-tenant-id": "bytesco", exampleapp.TokensHeader: "1"}
		for i, want := range []int{200, 200, 429} {
			r, err := c.postBody(completionsPath, h, body)
			if err != nil {
				t.Fatal(err)
			}
			if r.status != want {
				t.Fatalf("prompt %d: %d %s, want %d", i+1, r.status, r.body, want)
			}
			policy := r.header.Get("RateLimit-Policy")
			if !strings.Contains(policy, `"llm_prompt_bytes";q=65536;w=60;qu="content-bytes"`) {
				t.Errorf("prompt %d: RateLimit-Policy %q", i+1, policy)
			}
			if strings.Contains(policy, "llm_tokens") {
				t.Errorf("prompt %d: a token budget in RateLimit-Policy %q", i+1, policy)
			}
			if i == 0 {
				if got := r.header.Get("RateLimit"); !strings.Contains(got, `"llm_prompt_bytes";r=35536;`) {
					t.Errorf("prompt 1: RateLimit %q", got)
				}
			}
		}
	})
}
