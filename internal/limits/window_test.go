package limits_test

import (
	"testing"

	"github.com/ratelimit-authz/ratelimit-authz/internal/counter"
	"github.com/ratelimit-authz/ratelimit-authz/internal/limits"
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

// FormatWindow writes what ParseWindow reads back, in the largest whole
// unit.
func TestFormatWindow(t *testing.T) {
	for ms, want := range map[int64]string{1000: "1s", 60000: "1m", 90000: "90s", 3_600_000: "1h", 86_400_000: "1d", 604_800_000: "168h", 172_800_000: "48h", 250: "250ms", 1500: "1.5s"} {
		got := limits.FormatWindow(ms)
		if got != want {
			t.Errorf("FormatWindow(%d) = %q, want %q", ms, got, want)
		}
		if back, err := limits.ParseWindow(got); err != nil || back != ms {
			t.Errorf("ParseWindow(%q) = %d, %v; want %d", got, back, err, ms)
		}
	}
}
