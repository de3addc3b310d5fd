package configfile

import (
	"strings"

	"go.yaml.in/yaml/v3"

	"github.com/ratelimit-authz/ratelimit-authz/internal/counter"
	"github.com/ratelimit-authz/ratelimit-authz/internal/match"
)

// CostSource says where the cost of a bucket's hit comes from.
type CostSource uint8

const (
	// CostRequests: every admitted request costs 1, or its route's
	// constant (Route.Costs), taken at the check: the default.
	CostRequests CostSource = iota
	// CostRequestHeader: a request header's integer value, taken at the
	// check.
	CostRequestHeader
	// CostContentLength: the request's content-length, taken at the check
	// (the IETF draft's content-bytes).
	CostContentLength
	// CostFailures: 1 per response whose status is a failure code
	// (count: failures), charged from the access log.
	CostFailures
	// CostResponseHeader: a response header's integer value, charged from
	// the access log.
	CostResponseHeader
	// CostResponseTrailer: a response trailer's integer value, charged
	// from the access log.
	CostResponseTrailer
	// CostResponseBytes: the response body's bytes, charged from the
	// access log.
	CostResponseBytes
)

// costSourceNames are the sources' names in the configuration, one for
// every source: the parser reads them, and tests enumerate the sources by
// them (a source without a name cannot be configured).
var costSourceNames = [...]string{
	CostRequests:        "requests",
	CostRequestHeader:   "request_header",
	CostContentLength:   "content_length",
	CostFailures:        "failures",
	CostResponseHeader:  "response_header",
	CostResponseTrailer: "response_trailer",
	CostResponseBytes:   "response_bytes",
}

// CostSources lists every source, in order.
func CostSources() []CostSource {
	out := make([]CostSource, len(costSourceNames))
	for i := range out {
		out[i] = CostSource(i)
	}
	return out
}

func (s CostSource) String() string {
	if int(s) < len(costSourceNames) {
		return costSourceNames[s]
	}
	return "unknown"
}

// costSource is the source a configuration names, or false.
func costSource(name string) (CostSource, bool) {
	for i, n := range costSourceNames {
		if n == name {
			return CostSource(i), true
		}
	}
	return 0, false
}

// Cost says what one hit of a bucket costs.
type Cost struct {
	Source CostSource
	// Header names the request header, response header or trailer.
	Header string
	// Max is the largest cost one hit takes or charges (sources other
	// than CostRequests and CostFailures).
	Max int64
	// Missing is the cost of a hit whose value is absent; RefuseMissing:
	// a request without it is refused (request sources only).
	Missing int64
}

// RefuseMissing is Cost.Missing of a request-time cost with no missing
// given: a request without the value is refused, never let through free.
const RefuseMissing = -1

// AfterResponse reports whether the cost is known only from the response:
// the check then only peeks and the access log charges.
func (c Cost) AfterResponse() bool {
	switch c.Source {
	case CostFailures, CostResponseHeader, CostResponseTrailer, CostResponseBytes:
		return true
	}
	return false
}

// RequestHeader is the request header a check reads the cost from, or ""
// when the cost is not a request header's value.
func (c Cost) RequestHeader() string {
	switch c.Source {
	case CostRequestHeader:
		return c.Header
	case CostContentLength:
		return "content-length"
	}
	return ""
}

// Metadata is the field of the Check's dynamic metadata that names the
// bucket's key for the access log: failure buckets under "failures",
// response-charged ones under "charges", so that Envoy's access-log
// filter sends failures only when the status is one and charges always.
func (c Cost) Metadata() string {
	if c.Source == CostFailures {
		return "failures"
	}
	return "charges"
}

// QuotaUnit is the IETF draft's quota unit of a budget in this cost, for
// RateLimit-Policy: "requests" for a count of requests, "content-bytes"
// for bytes; "" for a unit the draft registers no name for (tokens, any
// integer an application reports), whose budgets the header fields leave
// out rather than call requests.
func (c Cost) QuotaUnit() string {
	switch c.Source {
	case CostContentLength, CostResponseBytes:
		return "content-bytes"
	case CostRequests, CostFailures:
		return "requests"
	}
	return ""
}

func (c Cost) String() string {
	if c.Header != "" {
		return c.Source.String() + " " + c.Header
	}
	return c.Source.String()
}

// CostProblem says why a value was not a cost as is.
type CostProblem uint8

const (
	CostOK       CostProblem = iota
	CostMissing              // absent or empty
	CostInvalid              // not a decimal integer (a sign, a space, a letter), or negative
	CostRepeated             // several values joined with "," (a repeated header)
	CostOverMax              // a number above Max (beyond int64 included)
	numCostProblems
)

// CostProblemNames name the problems in metrics ("ok" is none).
var CostProblemNames = [numCostProblems]string{"ok", "missing", "invalid", "repeated", "over_max"}

func (p CostProblem) String() string { return CostProblemNames[p] }

// ParseCost reads one cost value, decimal digits only, at most max: it
// returns the value and CostOK, or 0 and what is wrong with it. A value
// of more digits than any int64 is CostOverMax, never an overflow; a
// value with a "," is CostRepeated (Envoy joins a repeated header's
// values with ","); leading zeros are allowed. It never allocates.
func ParseCost(v string, max int64) (int64, CostProblem) {
	if v == "" {
		return 0, CostMissing
	}
	var n int64
	over := false
	for i := 0; i < len(v); i++ {
		c := v[i]
		if c == ',' {
			return 0, CostRepeated
		}
		if c < '0' || c > '9' {
			return 0, CostInvalid
		}
		if !over {
			n = n*10 + int64(c-'0')
			over = n > max // max ≤ MaxCostMax: n*10+9 cannot overflow before this
		}
	}
	if over {
		return 0, CostOverMax
	}
	return n, CostOK
}

// MaxCostMax bounds cost.max: the largest limit, so that one hit can
// always be told whether it fits.
const MaxCostMax = counter.MaxLimit

// Request is the cost of a request-time hit from the value v (present or
// not): the cost and CostOK, or the problem, when the request is refused.
// A problem is never priced: a refused value is refused, so no value a
// client sends can make a hit free or overflow a count.
func (c Cost) Request(v string, present bool) (int64, CostProblem) {
	if !present || v == "" {
		if c.Missing == RefuseMissing {
			return 0, CostMissing
		}
		return c.Missing, CostOK
	}
	return ParseCost(v, c.Max)
}

// Response is what a response-time hit charges for the reported value v
// (present or not), never less than 0 and never more than Max: a number
// above Max charges Max; a repeated value charges the largest of its
// parts (never less than any one reported); absent or invalid charges
// Missing. The problem says which rule applied (CostOK: the value as is).
func (c Cost) Response(v string, present bool) (int64, CostProblem) {
	if !present || v == "" {
		return c.Missing, CostMissing
	}
	n, p := ParseCost(v, c.Max)
	switch p {
	case CostOK:
		return n, CostOK
	case CostOverMax:
		return c.Max, CostOverMax
	case CostRepeated:
		best := int64(-1)
		for part := range strings.SplitSeq(v, ",") {
			x, q := ParseCost(strings.TrimSpace(part), c.Max)
			switch q {
			case CostOverMax:
				x = c.Max
			case CostOK:
			default:
				return c.Missing, CostInvalid
			}
			best = max(best, x)
		}
		return best, CostRepeated
	}
	return c.Missing, CostInvalid
}

// parseCost reads a bucket's cost field:
//
//	cost = content_length | response_bytes
//	     | { request_header: name | response_header: name | response_trailer: name
//	         | content_length: true | response_bytes: true,
//	         max: 1 … 2^31−1 (2^31−1),
//	         missing: 0 … max (request: none = refuse; response: 0) }
func (p *parser) parseCost(n *yaml.Node, what string) (Cost, bool) {
	var c Cost
	hasMax, hasMissing, sources := false, false, 0
	if n.Kind == yaml.ScalarNode {
		if _, ok := p.enum(n, what, "content_length", "response_bytes"); !ok {
			return c, false
		}
		c.Source, _ = costSource(n.Value)
	} else {
		before := len(p.problems)
		p.eachKey(n, what, []string{"request_header", "response_header", "response_trailer", "content_length", "response_bytes", "max", "missing"}, func(k string, _, v *yaml.Node) {
			switch k {
			case "request_header", "response_header", "response_trailer":
				sources++
				s, ok := p.str(v, what+"."+k)
				if !ok {
					return
				}
				if prob := match.HeaderNameProblem(s); prob != "" || s == "" || strings.HasPrefix(s, ":") {
					p.errorf(v, "%s.%s: %q is not a lowercase header name", what, k, s)
					return
				}
				c.Header = s
				c.Source, _ = costSource(k)
			case "content_length", "response_bytes":
				sources++
				if b, ok := p.boolean(v, what+"."+k); ok && !b {
					p.errorf(v, "%s.%s: give true, or leave it out", what, k)
				}
				c.Source, _ = costSource(k)
			case "max":
				if x, ok := p.integer(v, what+".max", 1, MaxCostMax); ok {
					c.Max, hasMax = x, true
				}
			case "missing":
				if x, ok := p.integer(v, what+".missing", 0, MaxCostMax); ok {
					c.Missing, hasMissing = x, true
				}
			}
		})
		if sources != 1 && n.Kind == yaml.MappingNode {
			p.errorf(n, "%s: give exactly one of request_header, response_header, response_trailer, content_length, response_bytes", what)
		}
		if len(p.problems) > before {
			return c, false
		}
	}
	if !hasMax {
		c.Max = MaxCostMax
	}
	if hasMissing && c.Missing > c.Max {
		p.errorf(n, "%s.missing %d is above max %d", what, c.Missing, c.Max)
		return c, false
	}
	if !hasMissing && !c.AfterResponse() {
		c.Missing = RefuseMissing
	}
	return c, true
}
