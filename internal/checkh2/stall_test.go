package checkh2_test

import (
	"testing"
	"time"

	"golang.org/x/net/http2"

	"github.com/ratelimit-authz/ratelimit-authz/internal/checkh2"
)

// A client that cancels each check unanswered after its timeout (Envoy's
// ext_authz) cancels in a burst, after a stall of the server, the checks
// answered as it woke: those resets cost the server nothing and do not
// count towards the rapid-reset limit.
func TestResetsOfAnsweredStreamsAreFree(t *testing.T) {
	const limit = 50
	_, addr := serve(t, checkh2.Config{MaxResetsPerSecond: limit})
	c := dial(t, addr)
	const n = 4 * limit
	for i := range n {
		c.check(uint32(2*i + 1))
	}
	// The answers were written before the client reads them: its
	// timeouts fired during the stall, and it cancels every check.
	for i := range n {
		if err := c.fr.WriteRSTStream(uint32(2*i+1), http2.ErrCodeCancel); err != nil {
			t.Fatal(err)
		}
	}
	last := uint32(2*n + 1)
	c.check(last)
	for {
		f := c.read()
		if ga, ok := f.(*http2.GoAwayFrame); ok {
			t.Fatalf("GOAWAY %v %q after resets of answered streams", ga.ErrCode, ga.DebugData())
		}
		if h, ok := f.(*http2.MetaHeadersFrame); ok && h.StreamID == last && h.StreamEnded() {
			if st := headerValue(h, "grpc-status"); st != "0" {
				t.Fatalf("the check after the burst: grpc-status %q", st)
			}
			return
		}
	}
}

// A connection is idle from its last stream, whatever PINGs and SETTINGS
// it sends meanwhile (grpc-go's MaxConnectionIdle): one without streams
// does not hold its slot forever.
func TestIdleFromTheLastStream(t *testing.T) {
	_, addr := serve(t, checkh2.Config{IdleTimeout: 300 * time.Millisecond, PingMinInterval: time.Millisecond})
	c := dial(t, addr)
	c.check(1)
	c.response(1)
	stop := make(chan struct{})
	defer close(stop)
	go func() {
		tick := time.NewTicker(50 * time.Millisecond)
		defer tick.Stop()
		for i := byte(0); ; i++ {
			select {
			case <-stop:
				return
			case <-tick.C:
			}
			var err error
			if i%2 == 0 {
				err = c.fr.WritePing(false, [8]byte{i})
			} else {
				err = c.fr.WriteSettings()
			}
			if err != nil {
				return // closed
			}
		}
	}()
	ga := c.closed() // within the 10 s deadline dial set
	if ga == nil || ga.ErrCode != http2.ErrCodeNo || ga.LastStreamID != 1 {
		t.Fatalf("a connection without streams sending PINGs and SETTINGS: GOAWAY %+v, want NO_ERROR after stream 1", ga)
	}
}
