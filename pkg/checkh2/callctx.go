package checkh2

import (
	"context"
	"sync"
	"time"
)

// callCtx is a Check call's context when its request has a grpc-timeout:
// the request's deadline, ended too by the connection's context and by
// the call's end (as a gRPC call's context ends with the call). The
// timer and channel Done needs are made only when a handler asks for
// Done, so a handler that does not wait costs one allocation and no
// timer; Err reads the clock instead.
//
// It carries no values: the connection's context has none, and a value
// looked up through it would be the connection's cancelation (what
// context.Cause reads) rather than this context's.
type callCtx struct {
	conn     context.Context
	deadline time.Time

	mu     sync.Mutex
	ended  error           // the call's end: Err from then on
	timed  context.Context // made by Done: conn with the deadline
	cancel context.CancelFunc
}

func newCallCtx(conn context.Context, deadline time.Time) *callCtx {
	return &callCtx{conn: conn, deadline: deadline}
}

func (x *callCtx) Deadline() (time.Time, bool) { return x.deadline, true }

func (x *callCtx) Value(any) any { return nil }

func (x *callCtx) Done() <-chan struct{} {
	x.mu.Lock()
	defer x.mu.Unlock()
	if x.timed == nil {
		x.timed, x.cancel = context.WithDeadline(x.conn, x.deadline)
		if x.ended != nil {
			x.cancel()
		}
	}
	return x.timed.Done()
}

func (x *callCtx) Err() error {
	x.mu.Lock()
	defer x.mu.Unlock()
	return x.errLocked()
}

// errLocked is Err under mu. Without Done's context, the first non-nil
// answer is kept in ended, so Err never changes once it is not nil and a
// later Done is closed.
func (x *callCtx) errLocked() error {
	switch {
	case x.ended != nil:
		return x.ended
	case x.timed != nil:
		return x.timed.Err()
	case x.conn.Err() != nil:
		x.ended = x.conn.Err()
	case !time.Now().Before(x.deadline):
		x.ended = context.DeadlineExceeded
	}
	return x.ended
}

// end ends the call: Err is from then on what it was, or Canceled, and
// Done's channel, if made, is closed.
func (x *callCtx) end() {
	x.mu.Lock()
	defer x.mu.Unlock()
	if x.ended = x.errLocked(); x.ended == nil {
		x.ended = context.Canceled
	}
	if x.cancel != nil {
		x.cancel()
	}
}
