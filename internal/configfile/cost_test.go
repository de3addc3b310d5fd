package configfile_test

import (
	"math"
	"strconv"
	"strings"
	"testing"

	"github.com/ratelimit-authz/ratelimit-authz/internal/configfile"
)

func TestParseCosts(t *testing.T) {
	r, err := configfile.Parse([]byte(`
buckets:
  tokens: {limit: 10000, per: 1m, key: tenant, cost: {response_header: x-usage-total-tokens, max: 4000}}
  trailer: {limit: 100, per: 1m, key: tenant, cost: {response_trailer: grpc-tokens}}
  body_out: {limit: 1000000, per: 1m, key: tenant, cost: response_bytes}
  body_in: {limit: 1000000, per: 1m, key: tenant, cost: content_length}
  body_in_lenient: {limit: 1000000, per: 1m, key: tenant, cost: {content_length: true, max: 65536, missing: 1024}}
  declared: {limit: 1000, per: 1m, key: tenant, cost: {request_header: x-cost, max: 1000, missing: 1}}
  strict: {limit: 1000, per: 1m, key: tenant, cost: {request_header: x-cost}}
  weighted: {limit: 100, per: 1m, key: tenant}
routes:
  - {path: /llm, buckets: [tokens, trailer, body_out, body_in, body_in_lenient, declared, strict]}
  - {path: /heavy, buckets: [weighted], costs: {weighted: 10}}
  - {path: /light, buckets: [weighted]}
`), "t.yaml")
	if err != nil {
		t.Fatal(err)
	}
	want := map[string]configfile.Cost{
		"tokens":          {Source: configfile.CostResponseHeader, Header: "x-usage-total-tokens", Max: 4000},
		"trailer":         {Source: configfile.CostResponseTrailer, Header: "grpc-tokens", Max: configfile.MaxCostMax},
		"body_out":        {Source: configfile.CostResponseBytes, Max: configfile.MaxCostMax},
		"body_in":         {Source: configfile.CostContentLength, Max: configfile.MaxCostMax, Missing: configfile.RefuseMissing},
		"body_in_lenient": {Source: configfile.CostContentLength, Max: 65536, Missing: 1024},
		"declared":        {Source: configfile.CostRequestHeader, Header: "x-cost", Max: 1000, Missing: 1},
		"strict":          {Source: configfile.CostRequestHeader, Header: "x-cost", Max: configfile.MaxCostMax, Missing: configfile.RefuseMissing},
		"weighted":        {},
	}
	for _, b := range r.Buckets {
		if b.Cost != want[b.Name] {
			t.Errorf("%s: cost %+v, want %+v", b.Name, b.Cost, want[b.Name])
		}
	}
	if got := r.Routes[1].Costs[7]; got != 10 {
		t.Errorf("route costs %v, want weighted: 10", r.Routes[1].Costs)
	}
	if r.Routes[2].Costs != nil {
		t.Errorf("a route without costs has %v", r.Routes[2].Costs)
	}
	for name, after := range map[string]bool{"tokens": true, "trailer": true, "body_out": true, "body_in": false, "declared": false, "weighted": false} {
		if got := want[name].AfterResponse(); got != after {
			t.Errorf("%s: AfterResponse %v", name, got)
		}
	}
}

func TestParseCostProblems(t *testing.T) {
	tests := []struct {
		name, yaml string
		want       []string
	}{
		{"two sources", `
buckets:
  b: {limit: 5, per: 1s, key: tenant, cost: {request_header: x-a, response_header: x-b}}
routes: [{path: /x, buckets: [b]}]`, []string{"buckets.b.cost: give exactly one of", ":3:"}},
		{"no source", `
buckets:
  b: {limit: 5, per: 1s, key: tenant, cost: {max: 5}}
routes: [{path: /x, buckets: [b]}]`, []string{"give exactly one of"}},
		{"unknown scalar", `
buckets:
  b: {limit: 5, per: 1s, key: tenant, cost: tokens}
routes: [{path: /x, buckets: [b]}]`, []string{"buckets.b.cost must be one of content_length, response_bytes"}},
		{"bad header", `
buckets:
  b: {limit: 5, per: 1s, key: tenant, cost: {request_header: X-Cost}}
routes: [{path: /x, buckets: [b]}]`, []string{`buckets.b.cost.request_header: "X-Cost" is not a lowercase header name`}},
		{"pseudo header", `
buckets:
  b: {limit: 5, per: 1s, key: tenant, cost: {request_header: ":path"}}
routes: [{path: /x, buckets: [b]}]`, []string{`":path" is not a lowercase header name`}},
		{"zero max", `
buckets:
  b: {limit: 5, per: 1s, key: tenant, cost: {request_header: x-cost, max: 0}}
routes: [{path: /x, buckets: [b]}]`, []string{"buckets.b.cost.max must be between 1 and 2147483647"}},
		{"huge max", `
buckets:
  b: {limit: 5, per: 1s, key: tenant, cost: {request_header: x-cost, max: 99999999999}}
routes: [{path: /x, buckets: [b]}]`, []string{"buckets.b.cost.max must be between 1 and 2147483647"}},
		{"missing above max", `
buckets:
  b: {limit: 5, per: 1s, key: tenant, cost: {request_header: x-cost, max: 5, missing: 6}}
routes: [{path: /x, buckets: [b]}]`, []string{"buckets.b.cost.missing 6 is above max 5"}},
		{"negative missing", `
buckets:
  b: {limit: 5, per: 1s, key: tenant, cost: {request_header: x-cost, missing: -1}}
routes: [{path: /x, buckets: [b]}]`, []string{"buckets.b.cost.missing must be between 0 and"}},
		{"false source", `
buckets:
  b: {limit: 5, per: 1s, key: tenant, cost: {content_length: false}}
routes: [{path: /x, buckets: [b]}]`, []string{"buckets.b.cost.content_length: give true"}},
		{"cost with failures", `
buckets:
  b: {limit: 5, per: 1s, key: ip, count: failures, cost: response_bytes}
routes: [{path: /x, buckets: [b]}]`, []string{"buckets.b: count: failures charges 1 per failure"}},
		{"route cost of a cost bucket", `
buckets:
  b: {limit: 5, per: 1s, key: tenant, cost: content_length}
routes: [{path: /x, buckets: [b], costs: {b: 2}}]`, []string{`routes[0].costs: bucket "b" costs content_length, not a constant`}},
		{"route cost of a failure bucket", `
buckets:
  b: {limit: 5, per: 1s, key: ip, count: failures}
routes: [{path: /x, buckets: [b], costs: {b: 2}}]`, []string{`bucket "b" costs failures`}},
		{"route cost of another route's bucket", `
buckets:
  a: {limit: 5, per: 1s, key: tenant}
  b: {limit: 5, per: 1s, key: tenant}
routes: [{path: /x, buckets: [a], costs: {b: 2}}]`, []string{`routes[0].costs: bucket "b" is not in this route's buckets`}},
		{"route cost zero", `
buckets:
  b: {limit: 5, per: 1s, key: tenant}
routes: [{path: /x, buckets: [b], costs: {b: 0}}]`, []string{"routes[0].costs.b must be between 1 and"}},
		{"route cost unknown bucket", `
buckets:
  b: {limit: 5, per: 1s, key: tenant}
routes: [{path: /x, buckets: [b], costs: {c: 1}}]`, []string{`routes[0].costs: unknown bucket "c"`}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := configfile.Parse([]byte(tt.yaml), "c.yaml")
			if err == nil {
				t.Fatal("no problem reported")
			}
			for _, w := range tt.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("problems lack %q:\n%v", w, err)
				}
			}
		})
	}
}

func TestParseCost(t *testing.T) {
	big := strconv.FormatUint(math.MaxUint64, 10)
	tests := []struct {
		in   string
		max  int64
		n    int64
		prob configfile.CostProblem
	}{
		{"0", 10, 0, configfile.CostOK},
		{"7", 10, 7, configfile.CostOK},
		{"10", 10, 10, configfile.CostOK},
		{"0010", 10, 10, configfile.CostOK},
		{"11", 10, 0, configfile.CostOverMax},
		{"2147483647", configfile.MaxCostMax, configfile.MaxCostMax, configfile.CostOK},
		{"2147483648", configfile.MaxCostMax, 0, configfile.CostOverMax},
		{"9223372036854775808", configfile.MaxCostMax, 0, configfile.CostOverMax},
		{big + big, configfile.MaxCostMax, 0, configfile.CostOverMax},
		{"", 10, 0, configfile.CostMissing},
		{"-1", 10, 0, configfile.CostInvalid},
		{"+1", 10, 0, configfile.CostInvalid},
		{" 1", 10, 0, configfile.CostInvalid},
		{"1.5", 10, 0, configfile.CostInvalid},
		{"1e3", 10, 0, configfile.CostInvalid},
		{"0x10", 10, 0, configfile.CostInvalid},
		{"ten", 10, 0, configfile.CostInvalid},
		{"1,2", 10, 0, configfile.CostRepeated},
		{"1, 2", 10, 0, configfile.CostRepeated},
		{"\u0661", 10, 0, configfile.CostInvalid}, // an Arabic-Indic one
	}
	for _, tt := range tests {
		n, p := configfile.ParseCost(tt.in, tt.max)
		if n != tt.n || p != tt.prob {
			t.Errorf("ParseCost(%q, %d) = %d, %v; want %d, %v", tt.in, tt.max, n, p, tt.n, tt.prob)
		}
	}
}

// TestCostHostileValues is the documented outcome of every hostile value:
// a request-time cost refuses what is not a number within max (or absent
// without missing); a response-time cost charges min(value, max), the
// largest of repeated values, and missing for what is absent or invalid —
// never a negative charge.
func TestCostHostileValues(t *testing.T) {
	strict := configfile.Cost{Source: configfile.CostRequestHeader, Header: "x-cost", Max: 1000, Missing: configfile.RefuseMissing}
	lenient := strict
	lenient.Missing = 1
	resp := configfile.Cost{Source: configfile.CostResponseHeader, Header: "x-tokens", Max: 1000, Missing: 3}
	tests := []struct {
		v       string
		present bool
		// request: cost or refused; response: charge and reason
		strictN, lenientN int64
		strictP, lenientP configfile.CostProblem
		respN             int64
		respP             configfile.CostProblem
	}{
		{"5", true, 5, 5, configfile.CostOK, configfile.CostOK, 5, configfile.CostOK},
		{"0", true, 0, 0, configfile.CostOK, configfile.CostOK, 0, configfile.CostOK},
		{"", false, 0, 1, configfile.CostMissing, configfile.CostOK, 3, configfile.CostMissing},
		{"", true, 0, 1, configfile.CostMissing, configfile.CostOK, 3, configfile.CostMissing},
		{"-5", true, 0, 0, configfile.CostInvalid, configfile.CostInvalid, 3, configfile.CostInvalid},
		{"abc", true, 0, 0, configfile.CostInvalid, configfile.CostInvalid, 3, configfile.CostInvalid},
		{"1001", true, 0, 0, configfile.CostOverMax, configfile.CostOverMax, 1000, configfile.CostOverMax},
		{"99999999999999999999999", true, 0, 0, configfile.CostOverMax, configfile.CostOverMax, 1000, configfile.CostOverMax},
		{"5,7", true, 0, 0, configfile.CostRepeated, configfile.CostRepeated, 7, configfile.CostRepeated},
		{"5, 99999999999999999999", true, 0, 0, configfile.CostRepeated, configfile.CostRepeated, 1000, configfile.CostRepeated},
		{"5,-7", true, 0, 0, configfile.CostRepeated, configfile.CostRepeated, 3, configfile.CostInvalid},
		{"5,", true, 0, 0, configfile.CostRepeated, configfile.CostRepeated, 3, configfile.CostInvalid},
		{"200,abc", true, 0, 0, configfile.CostRepeated, configfile.CostRepeated, 3, configfile.CostInvalid}, // counted invalid, as configuration.md says
	}
	for _, tt := range tests {
		if n, p := strict.Request(tt.v, tt.present); p != tt.strictP || (p == configfile.CostOK && n != tt.strictN) {
			t.Errorf("strict Request(%q, %v) = %d, %v; want %d, %v", tt.v, tt.present, n, p, tt.strictN, tt.strictP)
		}
		if n, p := lenient.Request(tt.v, tt.present); p != tt.lenientP || (p == configfile.CostOK && n != tt.lenientN) {
			t.Errorf("lenient Request(%q, %v) = %d, %v; want %d, %v", tt.v, tt.present, n, p, tt.lenientN, tt.lenientP)
		}
		if n, p := resp.Response(tt.v, tt.present); n != tt.respN || p != tt.respP {
			t.Errorf("Response(%q, %v) = %d, %v; want %d, %v", tt.v, tt.present, n, p, tt.respN, tt.respP)
		}
	}
}

func TestParseCostAllocs(t *testing.T) {
	c := configfile.Cost{Source: configfile.CostRequestHeader, Max: 1000}
	if n := testing.AllocsPerRun(100, func() { c.Request("123", true) }); n != 0 {
		t.Errorf("Request allocates %v times", n)
	}
}

// FuzzCost: no value makes a cost negative or above max, or panics; a
// value that parses is its digits.
func FuzzCost(f *testing.F) {
	for _, s := range []string{"0", "1", "1000", "1001", "-1", "1,2", "1, 2,3", "", " ", "abc", "99999999999999999999999", "0x10", "1e9", "\xff"} {
		f.Add(s, int64(1000))
	}
	f.Fuzz(func(t *testing.T, v string, max int64) {
		if max < 1 || max > configfile.MaxCostMax {
			max = configfile.MaxCostMax
		}
		n, p := configfile.ParseCost(v, max)
		if p == configfile.CostOK {
			if n < 0 || n > max {
				t.Fatalf("ParseCost(%q, %d) = %d", v, max, n)
			}
			if want, err := strconv.ParseInt(v, 10, 64); err != nil || want != n {
				t.Fatalf("ParseCost(%q) = %d, strconv says %d, %v", v, n, want, err)
			}
		} else if n != 0 {
			t.Fatalf("ParseCost(%q) = %d with problem %v", v, n, p)
		}
		c := configfile.Cost{Source: configfile.CostResponseHeader, Max: max, Missing: min(max, 3)}
		if n, _ := c.Response(v, true); n < 0 || n > max {
			t.Fatalf("Response(%q) charges %d of max %d", v, n, max)
		}
		r := configfile.Cost{Source: configfile.CostRequestHeader, Max: max, Missing: configfile.RefuseMissing}
		if n, p := r.Request(v, true); p == configfile.CostOK && (n < 0 || n > max) {
			t.Fatalf("Request(%q) takes %d of max %d", v, n, max)
		}
	})
}

// The worked example of docs/cost-budgets.md is valid and says what the
// document says.
func TestLLMBudgetExample(t *testing.T) {
	r, err := configfile.LoadFile("../../config/examples/llm-budget.yaml")
	if err != nil {
		t.Fatal(err)
	}
	tokens := r.Buckets[r.BucketIndex("llm_tokens")]
	if tokens.Cost.Source != configfile.CostResponseHeader || tokens.Cost.Header != "x-usage-total-tokens" || tokens.Limit.Limit != 10000 || !tokens.Overridable {
		t.Errorf("llm_tokens: %+v", tokens)
	}
	if got := r.Routes[2].Costs[r.BucketIndex("api_calls")]; got != 10 {
		t.Errorf("embeddings cost %d, want 10", got)
	}
}
