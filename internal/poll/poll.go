// Package poll waits in tests for a condition, never with a bare sleep:
// it checks, and checks again every step, until the condition holds or a
// deadline passes.
package poll

import (
	"testing"
	"time"
)

// Until calls fn every step until it returns nil, and fails the test with
// fn's last error once timeout has passed. fn runs on the test goroutine,
// so it may itself call t.Fatal to stop early.
func Until(t testing.TB, timeout, step time.Duration, fn func() error) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for {
		err := fn()
		if err == nil {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("still failing after %v: %v", timeout, err)
		}
		time.Sleep(step)
	}
}
