package limits_test

import (
	"errors"
	"strings"
	"testing"

	"github.com/ratelimit-authz/ratelimit-authz/internal/counter"
	"github.com/ratelimit-authz/ratelimit-authz/internal/limits"
)

func TestParseRate(t *testing.T) {
	for _, tc := range []struct {
		in           string
		limit, scale int64
		err          string
	}{
		{in: "200/1s", limit: 200, scale: 1000},
		{in: "10/1m", limit: 10, scale: 60_000},
		{in: "5/hour", limit: 5, scale: 3_600_000},
		{in: "1000/1d", limit: 1000, scale: 86_400_000},
		{in: "7/60s", limit: 7, scale: 60_000},
		{in: "2147483647/s", limit: counter.MaxLimit, scale: 1000},
		{in: "200", err: "is not LIMIT/WINDOW"},
		{in: "0/1s", err: "from 1 to 2147483647"},
		{in: "-3/1s", err: "from 1 to 2147483647"},
		{in: "2147483648/1s", err: "from 1 to 2147483647"},
		{in: "1.5/1s", err: "from 1 to 2147483647"},
		{in: "/1s", err: "from 1 to 2147483647"},
		{in: "10/10s", err: "must be one of 1s, 1m, 1h, 1d"},
		{in: "10/500ms", err: "must be one of 1s, 1m, 1h, 1d"},
		{in: "10/", err: "must be one of"},
	} {
		l, s, err := limits.ParseRate(tc.in)
		if tc.err != "" {
			if err == nil || !strings.Contains(err.Error(), tc.err) || !errors.Is(err, limits.ErrInvalid) {
				t.Errorf("ParseRate(%q) = %d, %d, %v; want error with %q", tc.in, l, s, err, tc.err)
			}
			continue
		}
		if err != nil || l != tc.limit || s != tc.scale {
			t.Errorf("ParseRate(%q) = %d, %d, %v; want %d, %d", tc.in, l, s, err, tc.limit, tc.scale)
		}
		if got := limits.FormatRate(l, s); tc.in == "200/1s" && got != "200/1s" {
			t.Errorf("FormatRate: %q", got)
		}
	}
}

func TestValidateTenant(t *testing.T) {
	for _, bad := range []string{"", strings.Repeat("x", 257), "a\nb", "\xff"} {
		if err := limits.ValidateTenant(bad); !errors.Is(err, limits.ErrInvalid) {
			t.Errorf("tenant %q: %v", bad, err)
		}
	}
	if err := limits.ValidateTenant("acme-ü"); err != nil {
		t.Error(err)
	}
}
