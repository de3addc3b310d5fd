package counter_test

import (
	"fmt"
	"time"

	"github.com/ratelimit-authz/ratelimit-authz/internal/counter"
)

func ExampleStore_Take() {
	s, err := counter.New(counter.Config{})
	if err != nil {
		panic(err)
	}
	const tokenCreate = 4 // the caller's index of the bucket
	lim := counter.Limit{Limit: 2, ScaleMS: 1000}
	now := time.Date(2025, 6, 2, 10, 0, 0, 250_000_000, time.UTC)
	for range 3 {
		r := s.Take(tokenCreate, "203.0.113.45", lim, now)
		fmt.Printf("allowed=%v count=%d remaining=%d reset=%dms retry=%dms\n",
			r.Allowed, r.Count, r.Remaining, r.ResetMS, r.RetryAfterMS)
	}
	// The next window starts at the next whole second, not 1 s after the
	// first hit.
	r := s.Take(tokenCreate, "203.0.113.45", lim, now.Add(750*time.Millisecond))
	fmt.Println("next window:", r.Allowed, r.Count)
	// Output:
	// allowed=true count=1 remaining=1 reset=750ms retry=0ms
	// allowed=true count=2 remaining=0 reset=750ms retry=0ms
	// allowed=false count=2 remaining=0 reset=750ms retry=750ms
	// next window: true 1
}

func ExampleStore_Take_sliding() {
	s, _ := counter.New(counter.Config{})
	lim := counter.Limit{Limit: 10, ScaleMS: 1000, Algorithm: counter.Sliding}
	start := time.Date(2025, 6, 2, 10, 0, 0, 0, time.UTC)
	s.Incr(0, "tenant-a", lim, 10, start) // a full previous window
	// A quarter into the next window the previous one still weighs 7.5.
	r := s.Take(0, "tenant-a", lim, start.Add(1250*time.Millisecond))
	fmt.Println(r.Allowed, r.Count, r.RetryAfterMS)
	// Output: true 9 0
}

func ExampleStore_Peek() {
	// Login lockout: the check only peeks; failures are counted with Incr.
	s, _ := counter.New(counter.Config{})
	const loginIP = 5
	lim := counter.Limit{Limit: 5, ScaleMS: 60_000}
	now := time.Date(2025, 6, 2, 10, 0, 20, 0, time.UTC)
	fmt.Println(s.Peek(loginIP, "198.51.100.7", lim, now).Allowed)
	for range 5 {
		s.Incr(loginIP, "198.51.100.7", lim, 1, now) // a 401 came back
	}
	r := s.Peek(loginIP, "198.51.100.7", lim, now)
	fmt.Println(r.Allowed, r.Count, r.RetryAfterMS)
	// Output:
	// true
	// false 5 40000
}

func ExampleStore_Release() {
	s, _ := counter.New(counter.Config{})
	tenant := counter.Limit{Limit: 100, ScaleMS: 1000}
	upload := counter.Limit{Limit: 1, ScaleMS: 1000}
	now := time.Date(2025, 6, 2, 10, 0, 0, 0, time.UTC)
	s.Take(1, "tenant-a", upload, now)
	// A request needs both buckets; the second denies, so the first is
	// rolled back.
	r := s.Take(0, "tenant-a", tenant, now)
	if !s.Take(1, "tenant-a", upload, now).Allowed {
		s.Release(0, "tenant-a", tenant, r.Window)
	}
	fmt.Println(s.Peek(0, "tenant-a", tenant, now).Count)
	// Output: 0
}

func ExampleStore_Merge() {
	// Two nodes; each reports its own running count, and the other keeps
	// the highest report per peer.
	a, _ := counter.New(counter.Config{Track: true})
	b, _ := counter.New(counter.Config{Track: true})
	const nodeA counter.PeerID = 1 // b's name for a
	lim := counter.Limit{Limit: 100, ScaleMS: 1000}
	now := time.Date(2025, 6, 2, 10, 0, 0, 0, time.UTC)
	for range 3 {
		a.Take(0, "tenant-a", lim, now)
	}
	changes, _ := a.Changes(nil, now)
	fmt.Println(changes[0].Key, changes[0].Count)
	fmt.Println(b.Merge(nodeA, changes[0], now))
	fmt.Println(b.Merge(nodeA, changes[0], now)) // a duplicate
	a.Take(0, "tenant-a", lim, now)
	a.Take(0, "tenant-a", lim, now)
	changes, _ = a.Changes(changes[:0], now) // the previous report was lost? This one repairs it.
	fmt.Println(b.Merge(nodeA, changes[0], now))
	fmt.Println(b.Peek(0, "tenant-a", lim, now).Count)
	// Output:
	// tenant-a 3
	// merged
	// unchanged
	// merged
	// 5
}
