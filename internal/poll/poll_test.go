package poll_test

import (
	"errors"
	"testing"
	"time"

	"github.com/ratelimit-authz/ratelimit-authz/internal/poll"
)

func TestUntilReturnsOnceTheConditionHolds(t *testing.T) {
	calls := 0
	poll.Until(t, 5*time.Second, time.Millisecond, func() error {
		if calls++; calls < 3 {
			return errors.New("not yet")
		}
		return nil
	})
	if calls != 3 {
		t.Errorf("fn called %d times, want 3", calls)
	}
}

// fakeT records a Fatalf instead of stopping the test.
type fakeT struct {
	testing.TB
	failed string
}

func (f *fakeT) Helper() {}
func (f *fakeT) Fatalf(format string, args ...any) {
	f.failed = format
	panic(f)
}

func TestUntilFailsAfterTheTimeout(t *testing.T) {
	ft := &fakeT{TB: t}
	func() {
		defer func() {
			if r := recover(); r != ft {
				panic(r)
			}
		}()
		poll.Until(ft, 20*time.Millisecond, time.Millisecond, func() error { return errors.New("never") })
	}()
	if ft.failed == "" {
		t.Fatal("Until returned without failing the test")
	}
}

func TestWaitReturnsTheLastError(t *testing.T) {
	calls := 0
	last := errors.New("last")
	err := poll.Wait(20*time.Millisecond, time.Millisecond, func() error {
		if calls++; calls > 1 {
			return last
		}
		return errors.New("first")
	})
	if !errors.Is(err, last) || calls < 2 {
		t.Fatalf("Wait = %v after %d calls, want the last error", err, calls)
	}
	if err := poll.Wait(0, time.Millisecond, func() error { return nil }); err != nil {
		t.Fatalf("Wait of a condition that holds: %v", err)
	}
}

func TestUntilTrue(t *testing.T) {
	calls := 0
	poll.UntilTrue(t, 5*time.Second, time.Millisecond, func() bool { calls++; return calls == 4 })
	if calls != 4 {
		t.Errorf("ok called %d times, want 4", calls)
	}
	ft := &fakeT{TB: t}
	func() {
		defer func() {
			if r := recover(); r != ft {
				panic(r)
			}
		}()
		poll.UntilTrue(ft, 20*time.Millisecond, time.Millisecond, func() bool { return false })
	}()
	if ft.failed == "" {
		t.Fatal("UntilTrue returned without failing the test")
	}
}

func TestCountAndSoon(t *testing.T) {
	calls := 0
	// True on every other call: each false pauses, so half the calls count.
	n := poll.Count(50*time.Millisecond, time.Millisecond, func() bool { calls++; return calls%2 == 0 })
	if n == 0 || n != calls/2 {
		t.Errorf("Count = %d after %d calls, want half of them", n, calls)
	}
	calls = 0
	if !poll.Soon(time.Second, time.Millisecond, func() bool { calls++; return calls == 3 }) || calls != 3 {
		t.Errorf("Soon: %d calls, want true on the third", calls)
	}
	if poll.Soon(10*time.Millisecond, time.Millisecond, func() bool { return false }) {
		t.Error("Soon reported a condition that never held")
	}
}
