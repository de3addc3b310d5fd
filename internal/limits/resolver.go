package limits

import (
	"fmt"
	"strings"
	"time"

	"github.com/ratelimit-authz/ratelimit-authz/internal/counter"
	"github.com/ratelimit-authz/ratelimit-authz/internal/match"
)

// Bucket is what limit resolution and override validation need of one
// configured bucket. Its index in a Buckets is the index the matcher and
// the Resolver know it by.
type Bucket struct {
	Name string
	// ID is the bucket's id in the counter (see counter.Bucket), by which
	// the overrides cache files its overrides; IDSet false: the bucket's
	// index.
	ID    counter.Bucket
	IDSet bool
	Key   match.KeySpec
	// Overridable buckets take tenant overrides; others never do.
	Overridable bool
	// Limit is the bucket's own configured limit, when HasLimit.
	Limit    counter.Limit
	HasLimit bool
	// Default is the limit the route rules give a bucket without one of
	// its own, when HasDefault: the same on every route (the configuration
	// refuses routes that disagree), so a client cannot pick it by path.
	Default    counter.Limit
	HasDefault bool
}

// Buckets are the configured buckets, in the configuration's order.
type Buckets []Bucket

// ID returns the id in the counter of the bucket at index i: its ID when
// IDSet, else i.
func (bs Buckets) ID(i int) counter.Bucket {
	if bs[i].IDSet {
		return bs[i].ID
	}
	return counter.Bucket(i)
}

// Index returns the id of the named bucket; ok is false when none has
// that name.
func (bs Buckets) Index(name string) (b counter.Bucket, ok bool) {
	for i := range bs {
		if bs[i].Name == name {
			return counter.Bucket(i), true
		}
	}
	return 0, false
}

// Configured returns the bucket's limit without an override: its own ▸
// the route default ▸ the built-in default of a shipped bucket's name.
// ok is false when none gives one.
func (b *Bucket) Configured() (counter.Limit, bool) {
	switch {
	case b.HasLimit:
		return b.Limit, true
	case b.HasDefault:
		return b.Default, true
	}
	return builtinLimit(b.Name)
}

// builtinLimit is the last step of resolution: the defaults of the buckets
// the product ships, for a configuration that names one without a limit.
func builtinLimit(name string) (counter.Limit, bool) {
	const sec, min = 1000, 60_000
	switch name {
	case "activity_create":
		return counter.Limit{Limit: 100, ScaleMS: sec}, true
	case "upload":
		return counter.Limit{Limit: 10, ScaleMS: sec}, true
	case "inbound":
		return counter.Limit{Limit: 500, ScaleMS: sec}, true
	case "token_generate", "token_create":
		return counter.Limit{Limit: 10, ScaleMS: min}, true
	case "login_ip", "login_account":
		return counter.Limit{Limit: 5, ScaleMS: min}, true
	}
	return counter.Limit{}, false
}

// Overrides are per-tenant limits by bucket id (counter.Bucket) and the
// request's key of it (the overrides cache's OverrideFor is one). They are
// consulted on the Check path: answers come from memory, never from I/O.
type Overrides interface {
	OverrideFor(bucket counter.Bucket, key string) (counter.Limit, bool)
}

// Resolver is the one place the limit of a (bucket, key) is decided:
// tenant override ▸ the bucket's configured limit ▸ the route default ▸
// the built-in default. An override applies only to an overridable
// bucket that has a configured limit, and only through its key (see
// Overrides): nothing else a request carries can change the limit, and so
// reset the count, of a key other requests share.
//
// A Resolver is immutable and safe for concurrent use; Limit does not
// allocate. The zero Resolver resolves no bucket.
type Resolver struct {
	buckets []resolved
	over    Overrides
}

type resolved struct {
	id          counter.Bucket // in the counter, for the overrides
	lim         counter.Limit
	ok          bool
	overridable bool
}

// NewResolver returns a Resolver for the buckets. over may be nil (a node
// without a database): then only the configuration decides.
func NewResolver(bs Buckets, over Overrides) *Resolver {
	r := &Resolver{buckets: make([]resolved, len(bs)), over: over}
	for i := range bs {
		l, ok := bs[i].Configured()
		r.buckets[i] = resolved{id: bs.ID(i), lim: l, ok: ok, overridable: bs[i].Overridable}
	}
	return r
}

// Limit resolves the limit of bucket b for a request whose key of it is
// key ("" when it has none: no override). ok is false for a bucket out of
// range or without any limit (one only Envoy's context_extensions name).
func (r *Resolver) Limit(b counter.Bucket, key string) (counter.Limit, bool) {
	if int(b) >= len(r.buckets) {
		return counter.Limit{}, false
	}
	c := &r.buckets[b]
	if !c.ok {
		return counter.Limit{}, false
	}
	if c.overridable && key != "" && r.over != nil {
		if l, ok := r.over.OverrideFor(c.id, key); ok {
			return l, true
		}
	}
	return c.lim, true
}

// Configured is Limit without the override: what applies to a key no
// tenant override covers.
func (r *Resolver) Configured(b counter.Bucket) (counter.Limit, bool) {
	if int(b) >= len(r.buckets) || !r.buckets[b].ok {
		return counter.Limit{}, false
	}
	return r.buckets[b].lim, true
}

// ParseWindow is the one grammar of a window length, for the
// configuration's per and an override's WINDOW alike: a unit name, in any
// case — 1s, s, sec, second; 1m, m, min, minute; 1h, h, hour; 1d, d, day —
// or a Go duration of whole milliseconds (500ms, 90s, 2h), from 1 ms to
// counter.MaxScaleMS. Overrides narrow it further to [Scales].
func ParseWindow(s string) (ms int64, err error) {
	switch strings.ToLower(s) {
	case "1s", "s", "sec", "second":
		return 1000, nil
	case "1m", "m", "min", "minute":
		return 60_000, nil
	case "1h", "h", "hour":
		return 3_600_000, nil
	case "1d", "d", "day":
		return 86_400_000, nil
	}
	d, err := time.ParseDuration(s)
	switch {
	case err != nil:
		return 0, fmt.Errorf("%q is not a duration (like 1s, 500ms, 1m, 1h, or second, minute, hour, day)", s)
	case d <= 0 || d%time.Millisecond != 0:
		return 0, fmt.Errorf("%q must be a positive whole number of milliseconds", s)
	case d.Milliseconds() > counter.MaxScaleMS:
		return 0, fmt.Errorf("%q is longer than the longest window, %s", s, time.Duration(counter.MaxScaleMS)*time.Millisecond)
	}
	return d.Milliseconds(), nil
}
