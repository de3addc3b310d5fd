package checkh2

import (
	"context"
	"errors"
	"testing"
	"time"
)

// A call's context ends at its deadline (Err at once, Done's channel when
// asked for), with its connection's, and with the call; context.Cause
// reads its own error.
func TestCallCtx(t *testing.T) {
	t.Run("deadline", func(t *testing.T) {
		dl := time.Now().Add(30 * time.Millisecond)
		x := newCallCtx(context.Background(), dl)
		if got, ok := x.Deadline(); !ok || !got.Equal(dl) {
			t.Fatalf("Deadline %v %v, want %v", got, ok, dl)
		}
		if x.Err() != nil {
			t.Fatalf("Err %v before the deadline", x.Err())
		}
		select {
		case <-x.Done():
		case <-time.After(10 * time.Second):
			t.Fatal("Done not closed at the deadline")
		}
		if !errors.Is(x.Err(), context.DeadlineExceeded) || !errors.Is(context.Cause(x), context.DeadlineExceeded) {
			t.Fatalf("Err %v Cause %v, want DeadlineExceeded", x.Err(), context.Cause(x))
		}
		x.end()
		if !errors.Is(x.Err(), context.DeadlineExceeded) {
			t.Fatalf("Err %v after the call, want DeadlineExceeded still", x.Err())
		}
	})
	t.Run("past deadline without Done", func(t *testing.T) {
		x := newCallCtx(context.Background(), time.Now().Add(-time.Second))
		if !errors.Is(x.Err(), context.DeadlineExceeded) {
			t.Fatalf("Err %v, want DeadlineExceeded", x.Err())
		}
	})
	t.Run("call ends", func(t *testing.T) {
		x := newCallCtx(context.Background(), time.Now().Add(time.Hour))
		x.end()
		if !errors.Is(x.Err(), context.Canceled) {
			t.Fatalf("Err %v after the call, want Canceled", x.Err())
		}
		select {
		case <-x.Done():
		default:
			t.Fatal("Done open after the call")
		}
	})
	t.Run("connection ends", func(t *testing.T) {
		conn, cancel := context.WithCancel(context.Background())
		x := newCallCtx(conn, time.Now().Add(time.Hour))
		done := x.Done()
		child, stop := context.WithCancel(x)
		defer stop()
		cancel()
		select {
		case <-done:
		case <-time.After(10 * time.Second):
			t.Fatal("Done not closed with the connection's context")
		}
		select {
		case <-child.Done():
		case <-time.After(10 * time.Second):
			t.Fatal("a context derived from the call's not ended with it")
		}
		if !errors.Is(x.Err(), context.Canceled) {
			t.Fatalf("Err %v, want Canceled", x.Err())
		}
	})
	t.Run("Err is kept once not nil", func(t *testing.T) {
		conn, cancel := context.WithCancel(context.Background())
		defer cancel()
		x := newCallCtx(conn, time.Now().Add(-time.Second))
		if err := x.Err(); err != context.DeadlineExceeded {
			t.Fatalf("Err past the deadline = %v, want DeadlineExceeded", err)
		}
		cancel()
		if err := x.Err(); err != context.DeadlineExceeded {
			t.Fatalf("Err after the connection ended = %v, want DeadlineExceeded still", err)
		}
		select {
		case <-x.Done():
		case <-time.After(10 * time.Second):
			t.Fatal("Done not closed although Err is not nil")
		}
		x.end()
		if err := x.Err(); err != context.DeadlineExceeded {
			t.Fatalf("Err after the call ended = %v, want DeadlineExceeded still", err)
		}
	})
}

// A call's context costs one allocation and no timer while Done is not
// asked for.
func TestCallCtxAllocations(t *testing.T) {
	conn, cancel := context.WithCancel(context.Background())
	defer cancel()
	dl := time.Now().Add(time.Hour)
	allocs := testing.AllocsPerRun(100, func() {
		x := newCallCtx(conn, dl)
		if x.Err() != nil {
			t.Fatal(x.Err())
		}
		x.end()
	})
	if allocs > 1 {
		t.Fatalf("%v allocations per call, want at most 1", allocs)
	}
}
