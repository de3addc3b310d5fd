package authz_test

import (
	"sync"
	"testing"
	"time"

	"github.com/ratelimit-authz/ratelimit-authz/config"
	"github.com/ratelimit-authz/ratelimit-authz/internal/configfile"
	"github.com/ratelimit-authz/ratelimit-authz/internal/counter"
)

// ownedOverrides resolves like the node's cache: a key is either a tenant
// (tenant-keyed buckets) or owned by one (owners), and records every
// lookup it is asked for.
type ownedOverrides struct {
	tenantKeyed map[counter.Bucket]bool
	owners      map[string]string // key → tenant
	limits      map[string]map[counter.Bucket]counter.Limit

	mu    sync.Mutex
	asked []string // keys looked up
}

func (o *ownedOverrides) OverrideFor(bucket counter.Bucket, key string) (counter.Limit, bool) {
	o.mu.Lock()
	o.asked = append(o.asked, key)
	o.mu.Unlock()
	tenant := key
	if !o.tenantKeyed[bucket] {
		tenant = o.owners[key]
	}
	l, ok := o.limits[tenant][bucket]
	return l, ok
}

// admitted sends n checks and counts the allowed ones.
func admitted(h *harness, n int, r func(i int) req) int {
	ok := 0
	for i := range n {
		if allowed(h.check(r(i))) {
			ok++
		}
	}
	return ok
}

// TestOverrideFollowsTheKeyNotTheHeader: on a channel-keyed bucket the
// request's tenant header neither picks the override nor resets the
// channel's count; only the channel's owner decides.
func TestOverrideFollowsTheKeyNotTheHeader(t *testing.T) {
	r, _ := configfile.Parse(config.Default(), "")
	inb, act := counter.Bucket(r.BucketIndex("inbound")), counter.Bucket(r.BucketIndex("activity_create"))
	over := &ownedOverrides{
		tenantKeyed: map[counter.Bucket]bool{act: true},
		owners:      map[string]string{"ch-owned": "bigco"},
		limits: map[string]map[counter.Bucket]counter.Limit{
			"bigco": {inb: {Limit: 5000, ScaleMS: 1000}, act: {Limit: 200, ScaleMS: 1000}},
			"slow":  {inb: {Limit: 50, ScaleMS: 60_000}},
		},
	}
	h := newHarnessWith(t, "", over)

	claim := func(tenant string) func(int) req {
		return func(int) req { return req{path: "/api/inbound/ch-1", headers: tenantHeader(tenant)} }
	}
	if got := admitted(h, 700, claim("bigco")); got != 500 {
		t.Errorf("700 webhooks on one channel claiming x-tenant-id bigco: %d admitted, want the configured 500", got)
	}
	for _, k := range over.asked {
		if k != "ch-1" {
			t.Fatalf("override looked up for %q, want only the channel ch-1", k)
		}
	}

	// Alternating claimed tenants whose overrides use other windows: the
	// channel's count is not reset.
	h.clock.Add(time.Second)
	alternate := func(i int) req {
		return req{path: "/api/inbound/ch-2", headers: tenantHeader([]string{"bigco", "slow", ""}[i%3])}
	}
	if got := admitted(h, 700, alternate); got != 500 {
		t.Errorf("alternating tenant headers on one channel: %d admitted, want 500", got)
	}

	// The channel's recorded owner decides, with or without a header.
	h.clock.Add(time.Second)
	owned := func(i int) req {
		return req{path: "/api/inbound/ch-owned", headers: tenantHeader([]string{"", "slow"}[i%2])}
	}
	if got := admitted(h, 700, owned); got != 700 {
		t.Errorf("700 webhooks on a channel owned by bigco: %d admitted, want 700", got)
	}

	// A tenant-keyed bucket follows its own key.
	if got := admitted(h, 250, func(int) req { return req{path: "/api/activities", headers: tenantHeader("bigco")} }); got != 200 {
		t.Errorf("bigco activities: %d admitted, want its override 200", got)
	}
}

func tenantHeader(id string) map[string]string {
	if id == "" {
		return nil
	}
	return tenant(id)
}
