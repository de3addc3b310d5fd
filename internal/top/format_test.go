package top_test

import (
	"testing"

	"github.com/ratelimit-authz/ratelimit-authz/internal/top"
)

func TestRate(t *testing.T) {
	for _, tc := range []struct {
		n    uint64
		secs float64
		want string
	}{
		{0, 60, "0"}, {5, 0, "0"}, {1, 60, "0.02"}, {30, 60, "0.50"}, {600, 60, "10.0"},
		{6000, 60, "100"}, {60_000_000, 60, "1000000"}, {123456789, 1, "123456789"},
	} {
		if got := top.Rate(tc.n, tc.secs); got != tc.want {
			t.Errorf("Rate(%d, %v) = %q, want %q", tc.n, tc.secs, got, tc.want)
		}
	}
}
