package e2e

import (
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ratelimit-authz/ratelimit-authz/internal/envoyconf"
	"github.com/ratelimit-authz/ratelimit-authz/internal/exampleapp"
	"github.com/ratelimit-authz/ratelimit-authz/internal/freeport"
	"github.com/ratelimit-authz/ratelimit-authz/internal/poll"
)

// TestTokenBudgetAcrossNodes: three nodes on one nats-server and two
// Envoys — A checking on every node, B on node-3 alone, each access log
// charging the node its stream reached — hold one 10,000 tokens a minute
// budget: every admitted token is charged once, on the nodes the two
// access logs reached, and once the charges replicate every node denies,
// those no access log reached included.
// The overshoot (the requests admitted before every node saw the charges
// that spent the budget) is logged: docs/cost-budgets.md reports it.
func TestTokenBudgetAcrossNodes(t *testing.T) {
	c := newClusterWith(t, 3, filepath.Join(root(t), costConfig), func(s *stack) { s.envoyEdit = withCostExample })
	more := freeport.TestAddrs(t, 2)
	shipped, err := os.ReadFile(filepath.Join(root(t), envoyconf.Path))
	if err != nil {
		t.Fatal(err)
	}
	third := c.nodes[2]
	cfgB, err := envoyconf.Render(shipped, envoyconf.Addrs{Admin: more[0], Listener: more[1], App: c.addrs.App,
		Authz: []string{third.grpcAddr}, Check: []string{third.checkAddr}})
	if err == nil {
		cfgB, err = withCostExample(cfgB)
	}
	if err != nil {
		t.Fatal(err)
	}
	c.startEnvoyConfig(t, "envoy-b", more[0], cfgB)
	listeners := []string{c.addrs.Listener, more[1]}

	const tenant, workersPerEnvoy, cost = "spread", 4, 1000
	var (
		admittedTokens atomic.Int64
		burst          timeline
	)
	post := func(listener string, tokens int) (*response, error) {
		req, err := http.NewRequest(http.MethodPost, "http://"+listener+completionsPath, nil)
		if err != nil {
			return nil, err
		}
		req.Header.Set("x-tenant-id", tenant)
		req.Header.Set(exampleapp.TokensHeader, strconv.Itoa(tokens))
		req.ContentLength = 0
		start := time.Now()
		resp, err := c.client.Do(req)
		if err != nil {
			return nil, err
		}
		resp.Body.Close()
		if resp.StatusCode == http.StatusOK {
			admittedTokens.Add(int64(tokens))
		}
		burst.add(start, time.Now(), resp.StatusCode == http.StatusOK && tokens > 0)
		return &response{status: resp.StatusCode, header: resp.Header}, nil
	}
	awayFromMinuteEdgeBy(25 * time.Second)

	untilDenied(t, 2*workersPerEnvoy, func(w int) (*response, error) { return post(listeners[w%2], cost) })
	inFlight, late := burst.spent(llmTokenBudget / cost)
	// Every admitted token is charged, on whichever node an access log
	// reached; the sum over the nodes is the cluster's.
	var perNode []float64
	poll.Until(t, 5*time.Second, 10*time.Millisecond, func() error {
		perNode = perNode[:0]
		var sum float64
		for _, nd := range c.nodes {
			v := nd.metric(t, `ratelimit_authz_cost_charged_total{bucket="llm_tokens"}`)
			perNode = append(perNode, v)
			sum += v
		}
		if sum != float64(admittedTokens.Load()) {
			return fmt.Errorf("charged %v over the nodes, %d tokens admitted", sum, admittedTokens.Load())
		}
		return nil
	})
	total := int(admittedTokens.Load())
	t.Logf("%d clients through two Envoys on three nodes: %d tokens charged of a %d budget (%d over), per node %v; "+
		"when it ran out %d requests were in flight, %d sent later were admitted",
		2*workersPerEnvoy, total, llmTokenBudget, total-llmTokenBudget, perNode, inFlight, late)
	if total < llmTokenBudget {
		t.Errorf("denied with %d of %d tokens charged", total, llmTokenBudget)
	}
	// Two access-log streams, three nodes: at least one node was charged
	// nothing, and must deny all the same.
	if !slices.Contains(perNode, 0) {
		t.Fatalf("every node was charged (%v): two access logs reach at most two", perNode)
	}
	// One budget, not one per node: once the charges replicate every node
	// denies, those no access log charged included. Probes through A
	// reach all three nodes in turn (round robin), through B node-3; a
	// probe that costs 0 charges nothing.
	poll.Until(t, 5*time.Second, 20*time.Millisecond, func() error {
		for i := range 9 {
			r, err := post(listeners[i%2], 0)
			if err != nil {
				return err
			}
			if r.status != http.StatusTooManyRequests {
				return fmt.Errorf("probe %d through envoy %d: %d", i, i%2, r.status)
			}
		}
		return nil
	})
}

// timeline records, from the client's side, when each request of a burst
// was sent and answered, and whether it was admitted.
type timeline struct {
	mu   sync.Mutex
	reqs []sentRequest
}

type sentRequest struct {
	start, end time.Time
	admitted   bool
}

func (tl *timeline) add(start, end time.Time, admitted bool) {
	tl.mu.Lock()
	defer tl.mu.Unlock()
	tl.reqs = append(tl.reqs, sentRequest{start, end, admitted})
}

// spent finds when the budget ran out as the client saw it, the answer
// to the admitted request that completed a budget of n requests, and
// counts the admitted requests then in flight (sent before, answered
// after) and those sent later (checked on a node that had not heard of
// the charges yet). 0, 0 when fewer than n were admitted.
func (tl *timeline) spent(n int) (inFlight, late int) {
	tl.mu.Lock()
	defer tl.mu.Unlock()
	var ends []time.Time
	for _, r := range tl.reqs {
		if r.admitted {
			ends = append(ends, r.end)
		}
	}
	if len(ends) < n {
		return 0, 0
	}
	slices.SortFunc(ends, time.Time.Compare)
	out := ends[n-1]
	for _, r := range tl.reqs {
		switch {
		case !r.admitted:
		case r.start.Before(out) && r.end.After(out):
			inFlight++
		case !r.start.Before(out):
			late++
		}
	}
	return inFlight, late
}
