package limits_test

import (
	"testing"

	"github.com/ratelimit-authz/ratelimit-authz/internal/counter"
	"github.com/ratelimit-authz/ratelimit-authz/internal/limits"
	"github.com/ratelimit-authz/ratelimit-authz/internal/match"
)

func TestParseWindow(t *testing.T) {
	for _, tc := range []struct {
		in   string
		ms   int64
		fail bool
	}{
		{in: "1s", ms: 1000}, {in: "s", ms: 1000}, {in: "sec", ms: 1000}, {in: "second", ms: 1000}, {in: "SECOND", ms: 1000},
		{in: "1m", ms: 60_000}, {in: "min", ms: 60_000}, {in: "minute", ms: 60_000}, {in: "1M", ms: 60_000},
		{in: "1h", ms: 3_600_000}, {in: "hour", ms: 3_600_000},
		{in: "1d", ms: 86_400_000}, {in: "d", ms: 86_400_000}, {in: "day", ms: 86_400_000},
		{in: "500ms", ms: 500}, {in: "90s", ms: 90_000}, {in: "2h", ms: 7_200_000},
		{in: "1193h2m47.295s", ms: counter.MaxScaleMS},
		{in: "1193h2m47.296s", fail: true}, // one past the longest window
		{in: "1500us", fail: true}, {in: "0s", fail: true}, {in: "-1s", fail: true},
		{in: "1 sec", fail: true}, {in: "", fail: true}, {in: "1w", fail: true}, {in: "9999999999h", fail: true},
	} {
		ms, err := limits.ParseWindow(tc.in)
		if tc.fail != (err != nil) || !tc.fail && ms != tc.ms {
			t.Errorf("ParseWindow(%q) = %d, %v; want %d (fail %v)", tc.in, ms, err, tc.ms, tc.fail)
		}
	}
}

// FuzzParseWindow: whatever the grammar accepts is a window the counter
// can hold.
func FuzzParseWindow(f *testing.F) {
	for _, s := range []string{"1s", "DAY", "500ms", "1.5h", "1193h2m47.296s", "1e9h", "0.0001ms", "-0s", "\x00", "1ns"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		ms, err := limits.ParseWindow(s)
		if err == nil && (ms < 1 || ms > counter.MaxScaleMS) {
			t.Fatalf("ParseWindow(%q) = %d ms, outside [1, %d]", s, ms, int64(counter.MaxScaleMS))
		}
	})
}

// The resolver's order: override ▸ the bucket's own limit ▸ the route
// default ▸ the built-in default; overrides only for overridable buckets
// with a limit, and only through a key.
func TestResolverOrder(t *testing.T) {
	own := counter.Limit{Limit: 3, ScaleMS: 1000}
	def := counter.Limit{Limit: 4, ScaleMS: 1000}
	bs := limits.Buckets{
		{Name: "own", Limit: own, HasLimit: true, Default: def, HasDefault: true, Overridable: true, Key: match.KeySpec{Kind: match.KeyTenant}},
		{Name: "by_default", Default: def, HasDefault: true},
		{Name: "upload"}, // a shipped name: the built-in 10/s
		{Name: "nothing", Overridable: true},
	}
	big := counter.Limit{Limit: 1000, ScaleMS: 60_000}
	over := fixedOverrides{0: big, 1: big, 3: big}
	r := limits.NewResolver(bs, over)
	for _, tc := range []struct {
		b    counter.Bucket
		key  string
		want counter.Limit
		ok   bool
	}{
		{0, "acme", big, true}, // overridable: the override
		{0, "", own, true},     // no key, no override
		{1, "acme", def, true}, // not overridable
		{2, "acme", counter.Limit{Limit: 10, ScaleMS: 1000}, true},
		{3, "acme", counter.Limit{}, false}, // no limit: no override either
		{4, "acme", counter.Limit{}, false}, // out of range
	} {
		if got, ok := r.Limit(tc.b, tc.key); got != tc.want || ok != tc.ok {
			t.Errorf("Limit(%d, %q) = %+v, %v; want %+v, %v", tc.b, tc.key, got, ok, tc.want, tc.ok)
		}
	}
	if got, ok := r.Configured(0); !ok || got != own {
		t.Errorf("Configured(0) = %+v, %v", got, ok)
	}
	if got, ok := limits.NewResolver(bs, nil).Limit(0, "acme"); !ok || got != own {
		t.Errorf("without overrides: %+v, %v", got, ok)
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
