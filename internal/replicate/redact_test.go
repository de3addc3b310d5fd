package replicate

import (
	"strings"
	"testing"
)

func TestRedactURLs(t *testing.T) {
	for _, tc := range []struct{ in, want string }{
		{"nats://127.0.0.1:4222", "nats://127.0.0.1:4222"},
		{"nats://u:pw-SECRET@127.0.0.1:4222", "nats://u:xxxxx@127.0.0.1:4222"},
		{"nats://a:s1@h1:4222, nats://b:s2@h2:4222", "nats://a:xxxxx@h1:4222,nats://b:xxxxx@h2:4222"},
		{"nats://u:pw%zz@h:4222", "(unparsable URL)"},
		{"nats://token-SECRET@h:4222", "nats://xxxxx@h:4222"},
	} {
		got := redactURLs(tc.in)
		if got != tc.want {
			t.Errorf("redactURLs(%q) = %q, want %q", tc.in, got, tc.want)
		}
		if strings.Contains(got, "SECRET") {
			t.Errorf("redactURLs(%q) kept a secret", tc.in)
		}
	}
}
