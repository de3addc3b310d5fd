// Package poll waits in tests for a condition, never with a bare sleep:
// it checks, and checks again every step, until the condition holds or a
// deadline passes.
package poll

import (
	"errors"
	"fmt"
	"testing"
	"time"
)

// Wait calls fn every step until it returns nil, and returns fn's last
// error, wrapped with the time waited, once timeout has passed. fn is
// called at least once. It suits a test that reports a failed wait with
// t.Errorf and goes on.
func Wait(timeout, step time.Duration, fn func() error) error {
	deadline := time.Now().Add(timeout)
	for {
		err := fn()
		if err == nil {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("still failing after %v: %w", timeout, err)
		}
		time.Sleep(step)
	}
}

// Until calls fn every step until it returns nil, and fails the test with
// fn's last error once timeout has passed. fn runs on the test goroutine,
// so it may itself call t.Fatal to stop early.
func Until(t testing.TB, timeout, step time.Duration, fn func() error) {
	t.Helper()
	if err := Wait(timeout, step, fn); err != nil {
		t.Fatalf("%v", err)
	}
}

// errNotYet is what UntilTrue reports of a condition that never held.
var errNotYet = errors.New("condition not met")

// UntilTrue is Until for a condition with nothing to say when it fails.
func UntilTrue(t testing.TB, timeout, step time.Duration, ok func() bool) {
	t.Helper()
	Until(t, timeout, step, func() error {
		if ok() {
			return nil
		}
		return errNotYet
	})
}

// Count calls try for d, pausing step after each false, and returns how
// many times it returned true: what a cluster node admits of a budget
// within d, its denials by share (until its report reaches its peers)
// retried.
func Count(d, step time.Duration, try func() bool) (n int) {
	for end := time.Now().Add(d); time.Now().Before(end); {
		if try() {
			n++
		} else {
			time.Sleep(step)
		}
	}
	return n
}

// Soon calls try every step until it returns true, for at most timeout,
// and reports whether it did.
func Soon(timeout, step time.Duration, try func() bool) bool {
	return Wait(timeout, step, func() error {
		if try() {
			return nil
		}
		return errNotYet
	}) == nil
}
