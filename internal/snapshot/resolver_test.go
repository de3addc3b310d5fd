package snapshot_test

import (
	"testing"

	"github.com/ratelimit-authz/ratelimit-authz/internal/counter"
	"github.com/ratelimit-authz/ratelimit-authz/internal/snapshot"
)

// The resolver's order: override ▸ the bucket's own limit ▸ the route
// default ▸ the built-in default; overrides only for overridable buckets
// with a limit, and only through a key.
func TestResolverOrder(t *testing.T) {
	s := compile(t, parse(t, `keys: {tenant_header: x-tenant-id}
buckets:
  own: {limit: 3, per: 1s, key: tenant, overridable: true}
  by_default: {key: tenant}
  upload: {key: tenant}
  nothing: {key: tenant, overridable: true}
routes:
  - {method: POST, path: /a, buckets: [own, by_default, upload], defaults: {by_default: {limit: 4, per: 1s}}}
`))
	own := counter.Limit{Limit: 3, ScaleMS: 1000}
	def := counter.Limit{Limit: 4, ScaleMS: 1000}
	big := counter.Limit{Limit: 1000, ScaleMS: 60_000}
	over := fixedOverrides{}
	for _, b := range s.Buckets {
		over[b.ID] = big // asked only where an override may apply
	}
	r := snapshot.NewResolver(s, over)
	for _, tc := range []struct {
		i    int
		key  string
		want counter.Limit
		ok   bool
	}{
		{0, "acme", big, true}, // overridable: the override
		{0, "", own, true},     // no key, no override
		{1, "acme", def, true}, // not overridable
		{2, "acme", counter.Limit{Limit: 10, ScaleMS: 1000}, true}, // a shipped name: the built-in 10/s
		{3, "acme", counter.Limit{}, false},                        // no limit: no override either
		{4, "acme", counter.Limit{}, false},                        // out of range
		{-1, "acme", counter.Limit{}, false},
	} {
		if got, ok := r.Limit(tc.i, tc.key); got != tc.want || ok != tc.ok {
			t.Errorf("Limit(%d, %q) = %+v, %v; want %+v, %v", tc.i, tc.key, got, ok, tc.want, tc.ok)
		}
	}
	if got, ok := snapshot.NewResolver(s, nil).Limit(0, "acme"); !ok || got != own {
		t.Errorf("without overrides: %+v, %v", got, ok)
	}
	if got, ok := (&snapshot.Resolver{}).Limit(0, "acme"); ok {
		t.Errorf("the zero Resolver resolved %+v", got)
	}
	if n := testing.AllocsPerRun(1000, func() { r.Limit(0, "acme") }); n != 0 {
		t.Errorf("Limit allocates %v times", n)
	}
}

type fixedOverrides map[counter.Bucket]counter.Limit

func (o fixedOverrides) OverrideFor(b counter.Bucket, _ string) (counter.Limit, bool) {
	l, ok := o[b]
	return l, ok
}
