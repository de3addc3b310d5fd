// Package testclock is a settable clock for tests: they move time to fixed
// instants instead of sleeping.
package testclock

import (
	"sync/atomic"
	"time"
)

// Clock holds an instant at millisecond resolution, the resolution the
// counter's windows use. It is safe for concurrent use; the zero value
// reads as the Unix epoch.
type Clock struct{ ms atomic.Int64 }

// Now returns the clock's instant; it fits a `Now func() time.Time` option.
func (c *Clock) Now() time.Time { return time.UnixMilli(c.ms.Load()) }

// Set moves the clock to t, truncated to the millisecond.
func (c *Clock) Set(t time.Time) { c.ms.Store(t.UnixMilli()) }

// Add moves the clock by d, truncated to the millisecond.
func (c *Clock) Add(d time.Duration) { c.ms.Add(d.Milliseconds()) }
