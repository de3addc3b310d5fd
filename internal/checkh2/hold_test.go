package checkh2_test

import (
	"context"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	authv3 "github.com/envoyproxy/go-control-plane/envoy/service/auth/v3"
	"golang.org/x/net/http2"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/ratelimit-authz/ratelimit-authz/internal/checkh2"
	"github.com/ratelimit-authz/ratelimit-authz/internal/checkwire"
	"github.com/ratelimit-authz/ratelimit-authz/internal/poll"
)

// holding is the product's handler, every answer of which holds a
// reservation whose end it records.
type holding struct {
	checkwire.Server
	pause           time.Duration
	cancels, keeps  atomic.Int64
	stallOnce       sync.Once
	stallAt         time.Time // zero: never
	stall           time.Duration
	doubleEnds, all atomic.Int64
}

type recordedHold struct {
	h     *holding
	ended atomic.Bool
}

func (r *recordedHold) end() bool {
	if r.ended.Swap(true) {
		r.h.doubleEnds.Add(1)
		return false
	}
	return true
}
func (r *recordedHold) Cancel() {
	if r.end() {
		r.h.cancels.Add(1)
	}
}
func (r *recordedHold) Keep() {
	if r.end() {
		r.h.keeps.Add(1)
	}
}

func (h *holding) CheckWire(ctx context.Context, req *checkwire.Request) (checkwire.Response, error) {
	if !h.stallAt.IsZero() && time.Now().After(h.stallAt) {
		h.stallOnce.Do(func() { time.Sleep(h.stall) })
	}
	time.Sleep(h.pause)
	resp, err := h.Server.CheckWire(ctx, req)
	if err != nil {
		return resp, err
	}
	h.all.Add(1)
	return resp.Holding(&recordedHold{h: h}), nil
}

// ended polls until the holds given back and kept are as many as
// cancels and keeps, and checks none ended twice.
func (h *holding) ended(t *testing.T, cancels, keeps int64) {
	t.Helper()
	poll.Until(t, 5*time.Second, 5*time.Millisecond, func() error {
		if c, k := h.cancels.Load(), h.keeps.Load(); c != cancels || k != keeps {
			return errorf("%d given back and %d kept, want %d and %d", c, k, cancels, keeps)
		}
		return nil
	})
	if n := h.doubleEnds.Load(); n != 0 {
		t.Fatalf("%d holds ended twice", n)
	}
}

func errorf(format string, a ...any) error { return status.Errorf(codes.Unknown, format, a...) }

// isPing reports whether f is a PING of the server's (not an ack).
func isPing(f http2.Frame) bool {
	p, ok := f.(*http2.PingFrame)
	return ok && !p.IsAck()
}

// A reset of a stream whose answer the peer had not read (Envoy cancels
// a check whose client hung up, or whose timeout passed while the server
// was stalled) gives back what its decision reserved; the ack of the
// PING after the answer keeps it, and a later reset then changes nothing.
func TestResetBeforeTheAnswerIsReadGivesBack(t *testing.T) {
	h := &holding{Server: newAuthz(t)}
	_, addr := serve(t, checkh2.Config{Check: h})
	c := dial(t, addr)

	c.check(1)
	if _, st := c.response(1); st != "0" {
		t.Fatalf("grpc-status %q", st)
	}
	ping := c.until("the PING after the answer", isPing).(*http2.PingFrame)
	c.fr.WriteRSTStream(1, http2.ErrCodeCancel) // sent before it read the answer
	h.ended(t, 1, 0)

	c.check(3)
	c.response(3)
	// One PING is in flight at a time: its ack brings the next, after
	// the answer of stream 3.
	c.fr.WritePing(true, ping.Data)
	ping = c.until("the PING after the next answer", isPing).(*http2.PingFrame)
	c.fr.WritePing(true, ping.Data) // the answer was read
	h.ended(t, 1, 1)
	c.fr.WriteRSTStream(3, http2.ErrCodeCancel) // after it read the answer
	c.check(5)
	c.response(5)
	if n := h.cancels.Load(); n != 1 {
		t.Fatalf("a reset after the answer was read gave back: %d given back", n)
	}
}

// An answer held back by the peer's window, its stream then reset, gives
// back; one written whole, its connection then closed, is kept (whether
// it was read cannot be known).
func TestAnswerNotWrittenGivesBackConnectionCloseKeeps(t *testing.T) {
	h := &holding{Server: newAuthz(t)}
	_, addr := serve(t, checkh2.Config{Check: h})
	c := dial(t, addr, http2.Setting{ID: http2.SettingInitialWindowSize, Val: 0})
	c.check(1)
	c.until("the answer's HEADERS", func(f http2.Frame) bool { return f.Header().StreamID == 1 })
	c.fr.WriteRSTStream(1, http2.ErrCodeCancel)
	h.ended(t, 1, 0)

	c2 := dial(t, addr)
	c2.check(1)
	c2.response(1)
	c2.conn.Close()
	h.ended(t, 1, 1)
}

// A peer that never acks the PINGs holds at most maxHeldStreams answers;
// the oldest beyond are kept as taken.
func TestHeldAnswersBounded(t *testing.T) {
	h := &holding{Server: newAuthz(t)}
	_, addr := serve(t, checkh2.Config{Check: h})
	c := dial(t, addr)
	const n, bound = 4100, 4096
	for i := range n {
		id := uint32(2*i + 1)
		c.check(id)
		data, _ := c.response(id)
		c.fr.WriteWindowUpdate(0, uint32(len(data)))
	}
	h.ended(t, 0, n-bound)
}

// A client that cancels each check it waited for longer than its timeout
// (Envoy's ext_authz: 250 ms), at 4,000 checks a second on one
// connection, through a stall of the server longer than the timeout:
// the server reads, as it wakes, the checks and the resets of the ones
// cancelled meanwhile in one burst. It keeps the connection (no GOAWAY:
// the resets were of checks the client had waited for, between answers
// it reads), and a reset of a check it answered gives back what the
// answer reserved.
func TestStallAtEnvoyRateKeepsTheConnection(t *testing.T) {
	if checkh2.RaceBuild {
		t.Skip("the race detector slows the load below the rate; make test runs this without it")
	}
	const (
		rate    = 4000
		run     = 3 * time.Second
		timeout = 250 * time.Millisecond
		stall   = 700 * time.Millisecond
	)
	h := &holding{Server: newAuthz(t), stallAt: time.Now().Add(time.Second), stall: stall}
	_, addr := serve(t, checkh2.Config{Check: h})
	cl := authv3.NewAuthorizationClient(dialGRPC(t, addr))
	var ok, deadline, dropped, other atomic.Int64
	var firstDrop atomic.Value // the first dropped call's error, for the report
	var wg sync.WaitGroup
	req := upload("stall")
	start := time.Now()
	sent := 0
	for time.Since(start) < run {
		for ; sent < int(time.Since(start).Seconds()*rate); sent++ {
			wg.Add(1)
			go func() {
				defer wg.Done()
				ctx, cancel := context.WithTimeout(context.Background(), timeout)
				defer cancel()
				_, err := cl.Check(ctx, req)
				switch status.Code(err) {
				case codes.OK:
					ok.Add(1)
				case codes.DeadlineExceeded:
					deadline.Add(1)
				case codes.Unavailable:
					dropped.Add(1) // the connection ended under the call
					firstDrop.CompareAndSwap(nil, err.Error())
				default:
					other.Add(1)
				}
			}()
		}
		time.Sleep(time.Millisecond)
	}
	wg.Wait()
	t.Logf("sent %d in %v: %d answered, %d past their deadline, %d on a dropped connection, %d other; holds: %d given back, %d kept of %d",
		sent, run, ok.Load(), deadline.Load(), dropped.Load(), other.Load(), h.cancels.Load(), h.keeps.Load(), h.all.Load())
	if sent < rate*int(run/time.Second)*9/10 {
		t.Fatalf("sent %d checks in %v, want about %d a second", sent, run, rate)
	}
	if deadline.Load() <= 1000 {
		t.Fatalf("%d checks timed out, want more than 1000: the stall was not felt", deadline.Load())
	}
	if n := dropped.Load() + other.Load(); n != 0 {
		t.Fatalf("%d checks failed otherwise than by their timeout: the connection was dropped (%v)", n, firstDrop.Load())
	}
	if h.cancels.Load() == 0 {
		t.Fatal("no reservation given back: the resets of checks answered as the server woke were not seen")
	}
}
