package testclock

import (
	"sync"
	"testing"
	"time"
)

func TestClock(t *testing.T) {
	var c Clock
	if !c.Now().Equal(time.UnixMilli(0)) {
		t.Errorf("zero clock reads %v", c.Now())
	}
	t0 := time.Date(2026, 11, 30, 10, 0, 0, 999_999, time.UTC)
	c.Set(t0)
	if want := time.Date(2026, 11, 30, 10, 0, 0, 0, time.UTC); !c.Now().Equal(want) {
		t.Errorf("Set(%v) reads %v, want %v", t0, c.Now(), want)
	}
	var wg sync.WaitGroup
	for range 10 {
		wg.Add(1)
		go func() { defer wg.Done(); c.Add(1500 * time.Microsecond); _ = c.Now() }()
	}
	wg.Wait()
	if got := c.Now().Sub(time.Date(2026, 11, 30, 10, 0, 0, 0, time.UTC)); got != 10*time.Millisecond {
		t.Errorf("10 × Add(1.5ms) moved the clock %v, want 10ms", got)
	}
}
