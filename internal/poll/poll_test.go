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
