package limits

import "time"

// Concurrency buckets, of the rules file and of envoyproxy/ratelimit's
// descriptor files alike: their limit is requests in flight, without a
// window. ConcurrencyScaleMS is the nominal window their limits carry, so
// that a limit, a tenant override and its resolution work as for any
// bucket (an override's window is ignored).
const (
	ConcurrencyScaleMS = 1000
	// DefaultLeaseTTL is a concurrency bucket's lease_ttl by default:
	// longer than any request should take; set it to the route's timeout
	// plus a margin.
	DefaultLeaseTTL = time.Minute
	// MaxLeaseTTL bounds lease_ttl.
	MaxLeaseTTL = 24 * time.Hour
)
