package checkh2

import (
	"slices"
	"strings"
	"time"

	"golang.org/x/net/http2"
	"golang.org/x/net/http2/hpack"
	"google.golang.org/grpc/codes"
	grpcstatus "google.golang.org/grpc/status"

	"github.com/ratelimit-authz/ratelimit-authz/internal/checkwire"
)

// stream is one open request. It stays in conn.streams, counted against
// MaxConcurrentStreams, until its response is wholly written: so the
// responses waiting for the peer's window are bounded too.
type stream struct {
	id       uint32
	m        method
	deadline time.Time // zero: no grpc-timeout
	endRecv  bool      // END_STREAM received
	body     []byte
	recv     int64  // bytes of our stream window the peer has used
	send     int64  // the peer's window for this stream
	out      []byte // response DATA waiting for a window: out[outAt:] is unsent
	outAt    int
	waiting  bool // out holds DATA still to send
	queued   bool // in conn.blocked
	// hold is what the decision reserved, while its answer is being
	// written: given back if the stream closes before it is.
	hold checkwire.Hold
}

// A closed stream's request and response buffers are kept for the next
// streams only if each is at most maxFreeBuffer bytes and the
// connection's free list then holds at most maxFreeBytes of them: so an
// idle connection retains little, however large its requests were.
const (
	maxFreeBuffer = 4 << 10
	maxFreeBytes  = 64 << 10
)

func (c *conn) newStream(id uint32) *stream {
	var st *stream
	if n := len(c.free); n > 0 {
		st, c.free = c.free[n-1], c.free[:n-1]
		c.freeBytes -= cap(st.body) + cap(st.out)
	} else {
		st = new(stream)
	}
	st.id, st.send = id, c.peerInitialWindow
	return st
}

// closeStream forgets st and gives its request bytes back to the
// connection window.
func (c *conn) closeStream(st *stream) {
	delete(c.streams, st.id)
	if st.hold != nil {
		st.hold.Cancel() // the answer was not wholly written
	}
	if st.queued {
		// Reset while waiting for the window: forget it there too, as the
		// struct is reused for another stream.
		for i, b := range c.blocked {
			if b == st {
				c.blocked = slices.Delete(c.blocked, i, i+1)
				break
			}
		}
	}
	c.giveBack(st.recv)
	// body is the stream's own buffer here: a view into the read buffer
	// is dropped (respond, endWithHeaders) before the stream closes.
	body, out := c.keep(st.body), c.keep(st.out)
	*st = stream{body: body, out: out}
	c.free = append(c.free, st)
}

// keep returns b emptied for the next stream if the free list may hold
// it, and nil otherwise.
func (c *conn) keep(b []byte) []byte {
	if cap(b) > maxFreeBuffer || c.freeBytes+cap(b) > maxFreeBytes {
		return nil
	}
	c.freeBytes += cap(b)
	return b[:0]
}

// resetStream sends RST_STREAM and forgets the stream if it is open.
func (c *conn) resetStream(id uint32, code http2.ErrCode) {
	c.fr.WriteRSTStream(id, code)
	c.rememberReset(id)
	if st := c.streams[id]; st != nil {
		c.closeStream(st)
	}
}

func (c *conn) onHeaders(f *http2.MetaHeadersFrame) error {
	st, err := c.openStream(f)
	if st == nil || err != nil {
		return err
	}
	if f.Truncated {
		c.trailersOnly(st, errorf(codes.ResourceExhausted, "header list larger than %d bytes", c.cfg.MaxHeaderListBytes))
		return nil
	}
	if !c.acceptRequest(st, readHeaders(f.Fields)) {
		return nil
	}
	if st.endRecv {
		return c.complete(st)
	}
	return nil
}

// openStream opens the stream f begins: nil (and nil) when f is to be
// ignored or its stream was refused with RST_STREAM, or the connection
// error it is.
func (c *conn) openStream(f *http2.MetaHeadersFrame) (*stream, error) {
	id := f.StreamID
	if id%2 == 0 {
		return nil, connError{http2.ErrCodeProtocol, "HEADERS on a server stream", ""}
	}
	if id <= c.maxStreamID {
		if c.streams[id] == nil && c.wasReset(id) {
			// Trailers the peer sent before it saw our RST_STREAM: the
			// Framer decoded the block, which keeps HPACK in step, and
			// the frame is ignored (RFC 9113 §5.1).
			return nil, nil
		}
		// A client's trailers (gRPC requests have none), or a stream
		// identifier reused or lower than one already opened (RFC 9113
		// §5.1.1): grpc-go answers both GOAWAY PROTOCOL_ERROR.
		return nil, connError{http2.ErrCodeProtocol, "HEADERS on a stream already opened", ""}
	}
	c.maxStreamID = id
	if c.goAway {
		// Past the GOAWAY's last stream: the peer retries it elsewhere,
		// and what it still sends on it is ignored.
		c.rememberReset(id)
		return nil, nil
	}
	if f.HasPriority() && f.Priority.StreamDep == id {
		// A stream cannot depend on itself (RFC 9113 §5.3.1).
		c.fr.WriteRSTStream(id, http2.ErrCodeProtocol)
		c.rememberReset(id)
		return nil, nil
	}
	if len(c.streams) >= int(c.cfg.MaxConcurrentStreams) {
		c.fr.WriteRSTStream(id, http2.ErrCodeRefusedStream)
		c.rememberReset(id)
		return nil, nil
	}
	st := c.newStream(id)
	st.endRecv = f.StreamEnded()
	c.streams[id] = st
	c.idleSince = time.Time{}
	return st, nil
}

// requestHeaders are the request header fields a call reads.
type requestHeaders struct {
	path, method, ctype, timeout, encoding string
	// malformed: a connection-specific field, or te other than
	// "trailers" (RFC 9113 §8.2.2).
	malformed bool
}

func readHeaders(fields []hpack.HeaderField) (h requestHeaders) {
	for _, hf := range fields {
		switch hf.Name {
		case "connection", "keep-alive", "proxy-connection", "transfer-encoding", "upgrade":
			h.malformed = true
		case "te":
			h.malformed = h.malformed || hf.Value != "trailers"
		case ":path":
			h.path = hf.Value
		case ":method":
			h.method = hf.Value
		case "content-type":
			h.ctype = hf.Value
		case "grpc-timeout":
			h.timeout = hf.Value
		case "grpc-encoding":
			h.encoding = hf.Value
		}
	}
	return h
}

// acceptRequest checks h, st's request headers, as grpc-go does, sets
// st's method and deadline, and reports whether the call goes on; when it
// does not, st was answered.
func (c *conn) acceptRequest(st *stream, h requestHeaders) bool {
	switch {
	case h.malformed:
		// As grpc-go answers a connection header: RST_STREAM alone.
		c.resetStream(st.id, http2.ErrCodeProtocol)
		return false
	case h.method != "POST":
		c.httpError(st, "405", errorf(codes.Internal, "method %q: gRPC takes POST", h.method))
		return false
	case h.ctype != "application/grpc" && !strings.HasPrefix(h.ctype, "application/grpc+") && !strings.HasPrefix(h.ctype, "application/grpc;"):
		c.httpError(st, "415", errorf(codes.Internal, "content-type %q: not gRPC", h.ctype))
		return false
	case h.encoding != "" && h.encoding != "identity":
		c.trailersOnly(st, errorf(codes.Unimplemented, "grpc: Decompressor is not installed for grpc-encoding %q", h.encoding))
		return false
	}
	if st.m = methodOf(h.path); st.m == methodUnknown || (st.m == methodRateLimit && c.cfg.RateLimit == nil) {
		c.trailersOnly(st, errorf(codes.Unimplemented, "unknown method %s", h.path))
		return false
	}
	if h.timeout != "" {
		d, ok := parseTimeout(h.timeout)
		if !ok {
			// As grpc-go answers it: HTTP 400, INTERNAL.
			c.httpError(st, "400", errorf(codes.Internal, "malformed grpc-timeout: %q", h.timeout))
			return false
		}
		st.deadline = time.Now().Add(d)
	}
	return true
}

func (c *conn) onData(f *http2.DataFrame) error {
	n := int64(f.Header().Length) // padding included: it counts against the windows
	if c.recvHeld+n > c.connWindow {
		return connError{http2.ErrCodeFlowControl, "DATA beyond the connection window", ""}
	}
	c.recvHeld += n
	st := c.streams[f.StreamID]
	if st == nil {
		if f.StreamID > c.maxStreamID {
			return connError{http2.ErrCodeProtocol, "DATA on an idle stream", ""}
		}
		c.giveBack(n)
		if !c.wasReset(f.StreamID) {
			// Closed after the peer's END_STREAM or RST_STREAM (RFC 9113
			// §5.1, §6.1); reset once, as it is then remembered. What the
			// peer sent before it saw a reset of ours is ignored.
			c.resetStream(f.StreamID, http2.ErrCodeStreamClosed)
		}
		return nil
	}
	if st.endRecv {
		c.giveBack(n)
		c.resetStream(st.id, http2.ErrCodeStreamClosed)
		return nil
	}
	if st.recv+n > c.streamWindow {
		c.giveBack(n)
		c.resetStream(st.id, http2.ErrCodeFlowControl)
		return nil
	}
	st.recv += n
	data := f.Data()
	if pad := n - int64(len(data)); pad > 0 {
		st.recv -= pad
		c.giveBack(pad)
		if !f.StreamEnded() {
			c.fr.WriteWindowUpdate(st.id, uint32(pad))
		}
	}
	st.endRecv = f.StreamEnded()
	maxBytes := c.cfg.MaxRecvMsgBytes
	if len(st.body)+len(data) > maxBytes+5 {
		c.trailersOnly(st, errorf(codes.ResourceExhausted, "grpc: received message larger than max (%d vs. %d)", len(st.body)+len(data)-5, maxBytes))
		return nil
	}
	if len(st.body) == 0 && st.endRecv {
		// The whole message in one frame: read it in place, as it is
		// handled before the next frame is read.
		st.body = data
		return c.complete(st)
	}
	st.body = append(st.body, data...)
	if len(st.body) >= 5 {
		if _, stt, ok := message(st.body[:5], maxBytes); !ok && stt.code == codes.ResourceExhausted {
			c.trailersOnly(st, stt)
			return nil
		}
	}
	if st.endRecv {
		return c.complete(st)
	}
	return nil
}

// complete answers a request whose every byte has arrived.
func (c *conn) complete(st *stream) error {
	msg, stt, ok := message(st.body, c.cfg.MaxRecvMsgBytes)
	if !ok {
		c.trailersOnly(st, stt)
		return nil
	}
	if !st.deadline.IsZero() && !time.Now().Before(st.deadline) {
		c.trailersOnly(st, errorf(codes.DeadlineExceeded, "context deadline exceeded"))
		return nil
	}
	switch st.m {
	case methodHealth:
		svc, err := decodeHealth(msg)
		if err != nil {
			c.trailersOnly(st, errorf(codes.Internal, "grpc: error unmarshalling request: %v", err))
			return nil
		}
		if !c.s.healthKnows(svc) {
			c.trailersOnly(st, errorf(codes.NotFound, "unknown service"))
			return nil
		}
		ans := c.s.health.notServing
		if c.cfg.Serving() {
			ans = c.s.health.serving
		}
		return c.respond(st, ans)
	case methodCheck:
		h := c.cfg.Check
		if err := c.req.Decode(h.Decoder(), msg); err != nil {
			c.req.Reset()
			c.trailersOnly(st, errorf(codes.Internal, "grpc: error unmarshalling request: %v", err))
			return nil
		}
		resp, err := h.CheckWire(c.ctx, &c.req)
		if lerr := late(st.deadline); lerr != nil {
			err = lerr
		}
		if err == nil {
			c.out, err = resp.AppendGRPC(c.out[:0])
		}
		c.req.Reset()
		return c.answer(st, resp.Hold(), err)
	case methodRateLimit:
		h := c.cfg.RateLimit
		if err := h.RateLimitDecoder().Decode(msg, &c.rlReq); err != nil {
			c.rlReq.Reset()
			c.trailersOnly(st, errorf(codes.Internal, "grpc: error unmarshalling request: %v", err))
			return nil
		}
		var (
			hold checkwire.Hold
			err  error
		)
		c.out, hold, err = h.AppendShouldRateLimit(c.ctx, &c.rlReq, c.out[:0])
		c.rlReq.Reset()
		if lerr := late(st.deadline); lerr != nil {
			err = lerr
		}
		return c.answer(st, hold, err)
	}
	c.trailersOnly(st, errorf(codes.Unimplemented, "unknown method"))
	return nil
}

// answer writes c.out, the encoded response, or err as the call's status:
// grpc-go's mapping, a status, or a context's error as its code, or
// UNKNOWN. What the decision reserved (hold, nil: nothing) is given back
// with an error, and otherwise held until the peer has read the answer.
func (c *conn) answer(st *stream, hold checkwire.Hold, err error) error {
	if err != nil {
		if hold != nil {
			hold.Cancel()
		}
		s, ok := grpcstatus.FromError(err)
		if !ok {
			s = grpcstatus.FromContextError(err)
		}
		c.trailersOnly(st, grpcStatus{code: s.Code(), msg: s.Message()})
		return nil
	}
	st.hold = hold
	return c.respond(st, c.out)
}

// late is errDeadline once a request's deadline (zero: none) has passed
// when its handler returned: the client has stopped waiting, and this is
// answered in place of what the handler returned. A handler
// never waits (a decision waits on no I/O), so its context is the
// connection's and carries no deadline: one made per request would cost
// an allocation on every call Envoy sends, for nothing the handler would
// read.
func late(deadline time.Time) error {
	if !deadline.IsZero() && !time.Now().Before(deadline) {
		return errDeadline
	}
	return nil
}

// errDeadline answers a request whose grpc-timeout passed before its
// answer was written.
var errDeadline = grpcstatus.Error(codes.DeadlineExceeded, "context deadline exceeded")

// respond writes the response HEADERS, as much of msg as the windows
// allow, and the trailers once all of it is written; what the windows
// hold back is copied into st.out to wait for them.
func (c *conn) respond(st *stream, msg []byte) error {
	st.body = nil // may be a view into the read buffer
	c.answering()
	c.hbuf.Reset()
	c.henc.WriteField(hpack.HeaderField{Name: ":status", Value: "200"})
	c.henc.WriteField(hpack.HeaderField{Name: "content-type", Value: "application/grpc"})
	if err := c.writeHeaders(st.id, false); err != nil {
		return err
	}
	rest, err := c.sendData(st, msg)
	if err != nil {
		return err
	}
	if len(rest) == 0 {
		return c.finish(st)
	}
	st.out, st.outAt, st.waiting = append(st.out[:0], rest...), 0, true
	if st.send > 0 {
		c.queue(st) // the connection window ran out
	}
	return nil
}

// queue puts st, whose stream window is open, in line for the connection
// window.
func (c *conn) queue(st *stream) {
	st.queued = true
	c.blocked = append(c.blocked, st)
}

// sendData writes DATA frames of msg within the windows and the peer's
// frame size, and returns what is left.
func (c *conn) sendData(st *stream, msg []byte) ([]byte, error) {
	for len(msg) > 0 {
		n := int(min(int64(len(msg)), int64(c.peerMaxFrame), c.connSend, st.send))
		if n <= 0 {
			break
		}
		if err := c.fr.WriteData(st.id, false, msg[:n]); err != nil {
			return nil, err
		}
		c.connSend -= int64(n)
		st.send -= int64(n)
		msg = msg[n:]
	}
	return msg, nil
}

// finish writes the OK trailers and closes st, holding what its decision
// reserved until the peer has read the answer.
func (c *conn) finish(st *stream) error {
	c.hbuf.Reset()
	c.henc.WriteField(hpack.HeaderField{Name: "grpc-status", Value: "0"})
	err := c.writeHeaders(st.id, true)
	if err == nil && st.hold != nil {
		c.holdAnswered(st.id, st.hold)
		st.hold = nil
	}
	c.closeStream(st) // a hold left (the trailers not written) is given back
	return err
}

// answering notes an answer begun: it is flushed in turn, it pays for a
// reset of a stream the peer cancelled unanswered (conn.unpaid), and the
// peer's pings are not strikes while it is sent answers.
func (c *conn) answering() {
	c.unflushed++
	c.pingStrikes = 0
	if c.unpaid > 0 {
		c.unpaid--
	}
}

// unblock writes, in order, what the connection window allows of the
// queued responses. Each one it examines is finished, or leaves the queue
// as its stream window shut (a smaller SETTINGS_INITIAL_WINDOW_SIZE), or
// is where the connection window ran out: so its work is bounded by the
// bytes it writes, and nothing when the connection window is shut.
func (c *conn) unblock() error {
	n := 0
	var err error
	for _, st := range c.blocked {
		if c.connSend <= 0 {
			break
		}
		if st.send > 0 {
			rest, werr := c.sendData(st, st.out[st.outAt:])
			if werr != nil {
				err = werr
				break
			}
			st.outAt = len(st.out) - len(rest)
			if len(rest) > 0 && st.send > 0 {
				break // the connection window ran out: st stays first
			}
		}
		n++
		st.queued = false
		if st.outAt == len(st.out) {
			st.waiting = false
			if err = c.finish(st); err != nil {
				break
			}
		}
	}
	if n == len(c.blocked) {
		clear(c.blocked)
		c.blocked = c.blocked[:0]
	} else {
		clear(c.blocked[:n])
		c.blocked = c.blocked[n:]
	}
	return err
}

// windowOpened queues st's waiting response once its stream window opens,
// and writes what the connection window allows.
func (c *conn) windowOpened(st *stream) error {
	if !st.waiting || st.queued || st.send <= 0 {
		return nil
	}
	c.queue(st)
	return c.unblock()
}

// rememberReset notes that this server reset stream id (or refused or
// ignored it), so the frames the peer still had in flight on it are
// ignored; the oldest of maxRememberedResets are forgotten.
func (c *conn) rememberReset(id uint32) {
	if c.sentResets == nil {
		c.sentResets = make([]uint32, maxRememberedResets)
	}
	c.sentResets[c.nextReset] = id
	c.nextReset = (c.nextReset + 1) % len(c.sentResets)
}

func (c *conn) wasReset(id uint32) bool {
	for _, r := range c.sentResets {
		if r == id {
			return true
		}
	}
	return false
}

// trailersOnly answers st with status alone, resets it with NO_ERROR when
// the peer is still sending (so it stops), and closes it.
func (c *conn) trailersOnly(st *stream, s grpcStatus) {
	c.hbuf.Reset()
	c.henc.WriteField(hpack.HeaderField{Name: ":status", Value: "200"})
	c.henc.WriteField(hpack.HeaderField{Name: "content-type", Value: "application/grpc"})
	c.statusFields(s)
	c.endWithHeaders(st)
}

// httpError answers st with an HTTP status that is not 200, for a request
// that is not gRPC.
func (c *conn) httpError(st *stream, httpStatus string, s grpcStatus) {
	c.hbuf.Reset()
	c.henc.WriteField(hpack.HeaderField{Name: ":status", Value: httpStatus})
	c.henc.WriteField(hpack.HeaderField{Name: "content-type", Value: "application/grpc"})
	c.statusFields(s)
	c.endWithHeaders(st)
}

func (c *conn) statusFields(s grpcStatus) {
	c.henc.WriteField(hpack.HeaderField{Name: "grpc-status", Value: codeText(s.code)})
	if s.msg != "" {
		// Never indexed: messages vary, and would churn the table.
		c.henc.WriteField(hpack.HeaderField{Name: "grpc-message", Value: string(appendPercentEncoded(nil, s.msg)), Sensitive: true})
	}
}

func (c *conn) endWithHeaders(st *stream) {
	st.body = nil
	c.answering()
	c.writeHeaders(st.id, true) // a write error surfaces at the flush
	if !st.endRecv {
		c.fr.WriteRSTStream(st.id, http2.ErrCodeNo)
		c.rememberReset(st.id)
	}
	c.closeStream(st)
}

// writeHeaders writes the block in c.hbuf as one HEADERS frame: the blocks
// written are a few fields and a bounded message, within the smallest
// frame size a peer may set.
func (c *conn) writeHeaders(id uint32, end bool) error {
	return c.fr.WriteHeaders(http2.HeadersFrameParam{StreamID: id, BlockFragment: c.hbuf.Bytes(), EndHeaders: true, EndStream: end})
}
