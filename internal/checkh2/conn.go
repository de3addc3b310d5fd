package checkh2

import (
	"bufio"
	"bytes"
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"net"
	"sync/atomic"
	"time"

	"golang.org/x/net/http2"
	"golang.org/x/net/http2/hpack"

	"github.com/ratelimit-authz/ratelimit-authz/internal/checkwire"
)

const (
	frameHeaderLen = 9
	defaultWindow  = 65535
	maxWindow      = 1<<31 - 1
	// goAwayAll is the last stream of a GOAWAY that refuses none.
	goAwayAll           = 1<<31 - 1
	defaultMaxFrameSize = 16384
	readBufSize         = 32 << 10
	writeBufSize        = 32 << 10
	// maxResponsesPerFlush flushes a connection whose requests keep
	// arriving, so its first answers do not wait for a lull.
	maxResponsesPerFlush = 64
	// maxPingStrikes pings in a row closer than PingMinInterval are let
	// through (grpc-go's policy).
	maxPingStrikes = 2
	// maxWindowStrikes changes of SETTINGS_INITIAL_WINDOW_SIZE with
	// streams open are let through per second: each walks every open
	// stream, so a flood of them would cost MaxConcurrentStreams steps per
	// few bytes received. Responses do not reset the count (a health
	// check is a cheap response); clients change the window at start-up,
	// if ever.
	maxWindowStrikes = 2
	// maxRememberedResets streams this server reset are remembered per
	// connection, for the frames still in flight on them.
	maxRememberedResets = 1024
	// maxHeldStreams answered streams are held per connection until the
	// peer has read their answers (conn.held); past it the oldest is kept
	// as taken.
	maxHeldStreams = 4096
	// lingerTimeout bounds reading what a peer still sends after a
	// graceful close, so the close does not reset what was written.
	lingerTimeout = time.Second
	// drainAckTimeout bounds the wait for the ack of a graceful close's
	// PING, past which its final GOAWAY is sent anyway.
	drainAckTimeout = time.Second
)

// drainPing is the payload of a graceful close's PING, and heldPing of
// the PING that tells the answers of held streams read: each told from
// the peer's own pings and from the other by its ack.
var (
	drainPing = [8]byte{'c', 'h', 'e', 'c', 'k', 'h', '2', 'd'}
	heldPing  = [8]byte{'c', 'h', 'e', 'c', 'k', 'h', '2', 'h'}
)

// errDone ends a connection that has nothing left to do.
var errDone = errors.New("checkh2: connection done")

// connError is a connection error: GOAWAY with code (and debug, when
// set, as its debug data), then close.
type connError struct {
	code   http2.ErrCode
	reason string
	debug  string
}

func (e connError) Error() string {
	return fmt.Sprintf("checkh2: connection error %v: %s", e.code, e.reason)
}

// conn is one connection. Everything but draining is owned by the
// connection's goroutine.
type conn struct {
	s   *Server
	cfg *Config
	raw net.Conn // the accepted connection: deadlines and close
	rw  io.ReadWriter
	br  *bufio.Reader
	bw  *bufio.Writer
	fr  *http2.Framer

	henc *hpack.Encoder
	hbuf bytes.Buffer

	ctx    context.Context
	cancel context.CancelFunc

	// draining is set by Shutdown, before it interrupts a blocked read.
	draining atomic.Bool

	streams   map[uint32]*stream
	free      []*stream
	freeBytes int // buffer capacity held by free: at most maxFreeBytes
	// blocked holds, in order, the responses waiting for the connection
	// window alone: each had its stream window open when queued. A
	// response whose stream window is shut waits outside it, found by its
	// stream's WINDOW_UPDATE or SETTINGS_INITIAL_WINDOW_SIZE; so a frame
	// that opens no window it can use examines none of it.
	blocked []*stream
	// held are the answered streams whose decisions reserved something
	// (a checkwire.Hold: leases, costs), in the order their answers were
	// written, until the peer has read the answers. A RST_STREAM on one
	// gives its reservations back: the peer gave up on the stream before
	// it read the answer, so the request never goes on. The ack of a
	// PING written after an answer tells that the peer read it (frames
	// are read in order): heldPinged of held precede the PING in flight
	// (heldPingOut), and its ack keeps them.
	held        []heldStream
	heldIDs     map[uint32]struct{} // the streams in held: a reset of another looks at none
	heldPinged  int
	heldPingOut bool
	// sentResets is a ring of the streams this server last reset: the
	// peer may still have frames in flight on them, to be ignored.
	sentResets  []uint32
	nextReset   int
	maxStreamID uint32 // the highest stream the peer opened (or tried to)
	// goAwayLast is the last stream of the GOAWAY sent (2^31-1 before
	// any): a later GOAWAY never names a higher one (RFC 9113 §6.8).
	goAwayLast uint32
	goAway     bool // GOAWAY sent: no new streams; done when none are open
	// drainBy is zero until Shutdown's first GOAWAY (naming every stream)
	// and its PING are sent; then, until the final GOAWAY, the time it is
	// sent without the PING's ack.
	drainBy     time.Time
	sawSettings bool
	// idleSince is when the last stream closed (or the connection
	// started), zero while a stream is open: IdleTimeout counts from it
	// whatever other frames (PING, SETTINGS) the peer sends, as grpc-go's
	// MaxConnectionIdle does, so a connection without streams does not
	// hold its slot forever.
	idleSince time.Time

	// Send side: the peer's windows and frame size.
	connSend          int64
	peerInitialWindow int64
	peerMaxFrame      int

	// Receive side. recvHeld is what the peer has sent of our connection
	// window and not been given back by a WINDOW_UPDATE: at most
	// connWindow, which bounds the request bytes a connection holds.
	streamWindow int64
	connWindow   int64
	recvHeld     int64
	refund       int64 // given back, not yet announced

	unflushed int

	// unpaid counts the peer's resets of streams whose answer was not
	// begun, less the answers written since (never below zero), over the
	// second from resetsSince: work the peer cancels without reading
	// anything back (rapid reset) is bounded by MaxResetsPerSecond, while
	// a client that cancels, after a stall, the checks it waited for
	// too long is reading answers between its resets.
	unpaid      int
	resetsSince time.Time
	pingStrikes int
	lastPing    time.Time
	// windowStrikes counts the changes of SETTINGS_INITIAL_WINDOW_SIZE
	// with streams open since windowSince, at most a second ago.
	windowStrikes int
	windowSince   time.Time

	req   checkwire.Request
	rlReq checkwire.RateLimitRequest
	out   []byte
}

func newConn(s *Server, nc net.Conn) *conn {
	cfg := &s.cfg
	sw := int64(cfg.MaxRecvMsgBytes) + 5 + defaultMaxFrameSize
	c := &conn{
		s: s, cfg: cfg, raw: nc, rw: nc,
		streams:           map[uint32]*stream{},
		connSend:          defaultWindow,
		peerInitialWindow: defaultWindow,
		peerMaxFrame:      defaultMaxFrameSize,
		streamWindow:      sw,
		connWindow:        min(max(1<<20, 2*sw), maxWindow),
		goAwayLast:        goAwayAll,
	}
	c.ctx, c.cancel = context.WithCancel(context.Background())
	return c
}

// drain asks the connection to finish gracefully; safe from any goroutine.
func (c *conn) drain() {
	c.draining.Store(true)
	c.raw.SetReadDeadline(time.Unix(1, 0)) // wake a blocked read
}

func (c *conn) serve() {
	defer c.cancel()
	defer c.endHolds()
	err := c.run()
	switch {
	case err == nil || errors.Is(err, errDone):
		c.lingerClose()
	default:
		var ce connError
		if errors.As(err, &ce) && c.fr != nil {
			c.writeGoAway(ce.code, ce.debug)
			c.bw.Flush() // best effort, bounded by WriteTimeout
			c.lingerClose()
		} else {
			c.raw.Close()
		}
		c.cfg.Log.Debug("check connection closed", "remote", c.raw.RemoteAddr().String(), "err", err)
	}
}

// lingerClose closes the write side, reads for a while what the peer
// still had in flight, and closes: closing with unread input would reset
// the connection and could lose the last responses.
func (c *conn) lingerClose() {
	if c.bw != nil {
		c.bw.Flush()
	}
	type closeWriter interface{ CloseWrite() error }
	if cw, ok := c.raw.(closeWriter); ok && cw.CloseWrite() == nil {
		c.raw.SetReadDeadline(time.Now().Add(lingerTimeout))
		io.Copy(io.Discard, io.LimitReader(c.raw, 1<<20))
	}
	c.raw.Close()
}

func (c *conn) run() error {
	c.raw.SetDeadline(time.Now().Add(c.cfg.HandshakeTimeout))
	if c.draining.Load() {
		return errDone
	}
	if c.cfg.TLS != nil {
		tc := tls.Server(c.raw, c.cfg.TLS)
		if err := tc.HandshakeContext(c.ctx); err != nil {
			return fmt.Errorf("checkh2: TLS handshake: %w", err)
		}
		if p := tc.ConnectionState().NegotiatedProtocol; p != "h2" {
			return fmt.Errorf("checkh2: TLS client negotiated %q, not h2", p)
		}
		c.rw = tc
	}
	c.br = bufio.NewReaderSize(connReader{c}, readBufSize)
	c.bw = bufio.NewWriterSize(deadlineWriter{c}, writeBufSize)
	var preface [len(http2.ClientPreface)]byte
	if _, err := io.ReadFull(c.br, preface[:]); err != nil {
		return fmt.Errorf("checkh2: read the client preface: %w", err)
	}
	if string(preface[:]) != http2.ClientPreface {
		return fmt.Errorf("checkh2: not an HTTP/2 client preface: %q", preface[:])
	}
	c.raw.SetWriteDeadline(time.Time{}) // deadlineWriter sets one per write
	c.fr = http2.NewFramer(c.bw, c.br)
	c.fr.ReadMetaHeaders = hpack.NewDecoder(4096, nil)
	c.fr.MaxHeaderListSize = c.cfg.MaxHeaderListBytes
	c.fr.SetMaxReadFrameSize(defaultMaxFrameSize)
	c.fr.SetReuseFrames()
	c.henc = hpack.NewEncoder(&c.hbuf)
	if err := c.fr.WriteSettings(
		http2.Setting{ID: http2.SettingMaxConcurrentStreams, Val: c.cfg.MaxConcurrentStreams},
		http2.Setting{ID: http2.SettingInitialWindowSize, Val: uint32(c.streamWindow)},
		http2.Setting{ID: http2.SettingMaxHeaderListSize, Val: c.cfg.MaxHeaderListBytes},
	); err != nil {
		return err
	}
	if err := c.fr.WriteWindowUpdate(0, uint32(c.connWindow-defaultWindow)); err != nil {
		return err
	}
	for {
		if err := c.beforeRead(); err != nil {
			return err
		}
		f, err := c.fr.ReadFrame()
		if err != nil {
			if err := c.readError(err); err != nil {
				return err
			}
			continue
		}
		if !c.sawSettings {
			if sf, ok := f.(*http2.SettingsFrame); !ok || sf.IsAck() {
				return connError{http2.ErrCodeProtocol, "the first frame is not SETTINGS", ""}
			}
			c.sawSettings = true
		}
		if err := c.handle(f); err != nil {
			return err
		}
	}
}

// beforeRead flushes and sets the read deadline when the next frame is
// not fully received (the read may wait), starts a graceful close asked
// for by Shutdown, and ends the connection once it is going away with no
// stream left.
func (c *conn) beforeRead() error {
	c.advanceDrain()
	if c.goAway && len(c.streams) == 0 {
		return errDone
	}
	if c.frameBuffered() && c.unflushed < maxResponsesPerFlush {
		return nil
	}
	if err := c.flush(); err != nil {
		return err
	}
	c.setReadDeadline()
	// Shutdown sets draining before its deadline: either the read below
	// sees its deadline, or this sees draining.
	if c.draining.Load() && !c.goAway && c.drainBy.IsZero() {
		c.advanceDrain()
		c.setReadDeadline()
		return c.flush()
	}
	return nil
}

// setReadDeadline bounds the next read: by the end of the wait for a
// graceful close's PING ack, the handshake, IdleTimeout after the last
// stream closed, or ReadTimeout with streams open.
func (c *conn) setReadDeadline() {
	switch {
	case !c.drainBy.IsZero() && !c.goAway:
		c.raw.SetReadDeadline(c.drainBy)
	case !c.sawSettings: // the handshake deadline stands
	case len(c.streams) == 0:
		if c.idleSince.IsZero() {
			c.idleSince = time.Now()
		}
		c.raw.SetReadDeadline(c.idleSince.Add(c.cfg.IdleTimeout))
	default:
		c.raw.SetReadDeadline(time.Now().Add(c.cfg.ReadTimeout))
	}
}

// advanceDrain moves on a graceful close asked for by Shutdown, in two
// steps as a peer may have sent streams it has not yet learnt are
// refused. First GOAWAY naming every stream, and a PING; the streams
// that arrive meanwhile are served. Then, on the PING's ack (onPing), or
// drainAckTimeout after the PING, GOAWAY naming the last stream
// received: what the peer sent before it reads that, it learns was not
// processed, and retries elsewhere.
func (c *conn) advanceDrain() {
	if !c.draining.Load() || c.goAway {
		return
	}
	if c.drainBy.IsZero() {
		c.fr.WriteGoAway(goAwayAll, http2.ErrCodeNo, nil)
		c.fr.WritePing(false, drainPing)
		c.drainBy = time.Now().Add(drainAckTimeout)
		return
	}
	if !time.Now().Before(c.drainBy) {
		c.sendGoAway()
	}
}

func (c *conn) flush() error {
	c.unflushed = 0
	c.pingHeld()
	if c.bw.Buffered() == 0 {
		return nil
	}
	if err := c.bw.Flush(); err != nil {
		return fmt.Errorf("checkh2: write: %w", err)
	}
	return nil
}

// frameBuffered reports whether the next frame is wholly in the read
// buffer, so reading it will not wait: a header block's HEADERS (or
// PUSH_PROMISE) together with every CONTINUATION up to END_HEADERS, as
// the Framer reads them as one.
func (c *conn) frameBuffered() bool {
	b, _ := c.br.Peek(c.br.Buffered())
	for {
		if len(b) < frameHeaderLen {
			return false
		}
		end := frameHeaderLen + (int(b[0])<<16 | int(b[1])<<8 | int(b[2]))
		if len(b) < end {
			return false
		}
		switch http2.FrameType(b[3]) {
		case http2.FrameHeaders, http2.FramePushPromise, http2.FrameContinuation:
			if http2.Flags(b[4]).Has(http2.FlagHeadersEndHeaders) {
				return true
			}
			b = b[end:] // the block goes on in the next frame
		default:
			return true
		}
	}
}

func (c *conn) sendGoAway() {
	c.goAway = true
	c.writeGoAway(http2.ErrCodeNo, "")
}

// writeGoAway writes GOAWAY naming the last stream the peer opened, or
// the one a GOAWAY already sent named if that is lower.
func (c *conn) writeGoAway(code http2.ErrCode, debug string) {
	c.goAwayLast = min(c.goAwayLast, c.maxStreamID)
	var d []byte
	if debug != "" {
		d = []byte(debug)
	}
	c.fr.WriteGoAway(c.goAwayLast, code, d)
}

// readError handles what ReadFrame returned: a stream error resets the
// stream and the connection goes on; an idle timeout ends it gracefully;
// a read timeout with streams open ends it with GOAWAY NO_ERROR and the
// debug data "read timeout", so the peer learns why its streams end;
// anything else ends it.
func (c *conn) readError(err error) error {
	var se http2.StreamError
	if errors.As(err, &se) {
		if se.StreamID > c.maxStreamID && se.StreamID%2 == 1 {
			c.maxStreamID = se.StreamID
		}
		c.resetStream(se.StreamID, se.Code)
		return nil
	}
	var ce http2.ConnectionError
	if errors.As(err, &ce) {
		return connError{http2.ErrCode(ce), fmt.Sprintf("reading a frame: %v", c.fr.ErrorDetail()), ""}
	}
	if errors.Is(err, http2.ErrFrameTooLarge) {
		return connError{http2.ErrCodeFrameSize, "a frame larger than advertised", ""}
	}
	var ne net.Error
	if errors.As(err, &ne) && ne.Timeout() && c.sawSettings {
		if len(c.streams) == 0 {
			c.sendGoAway()
			return errDone
		}
		return connError{http2.ErrCodeNo, fmt.Sprintf("no frame for %v with %d streams open", c.cfg.ReadTimeout, len(c.streams)), "read timeout"}
	}
	return fmt.Errorf("checkh2: read a frame: %w", err)
}

func (c *conn) handle(f http2.Frame) error {
	switch f := f.(type) {
	case *http2.MetaHeadersFrame:
		return c.onHeaders(f)
	case *http2.DataFrame:
		return c.onData(f)
	case *http2.SettingsFrame:
		return c.onSettings(f)
	case *http2.WindowUpdateFrame:
		return c.onWindowUpdate(f)
	case *http2.PingFrame:
		return c.onPing(f)
	case *http2.RSTStreamFrame:
		return c.onReset(f)
	case *http2.GoAwayFrame:
		// A client's GOAWAY refuses streams the server would open (it
		// opens none); it may still open its own (RFC 9113 §6.8), so they
		// are served until it closes the connection.
		return nil
	case *http2.PriorityFrame:
		if f.StreamDep == f.StreamID {
			// A stream cannot depend on itself (RFC 9113 §5.3.1).
			c.resetStream(f.StreamID, http2.ErrCodeProtocol)
		}
		return nil // priorities are not followed: every check is answered at once
	case *http2.PushPromiseFrame:
		return connError{http2.ErrCodeProtocol, "PUSH_PROMISE from a client", ""}
	}
	return nil // unknown frames
}

func (c *conn) onSettings(f *http2.SettingsFrame) error {
	if f.IsAck() {
		return nil
	}
	// Each setting is applied in turn (RFC 9113 §6.5.3), a
	// SETTINGS_INITIAL_WINDOW_SIZE change with streams open counted
	// against maxWindowStrikes however many one frame holds.
	err := f.ForeachSetting(func(s http2.Setting) error {
		if err := s.Valid(); err != nil {
			return err
		}
		switch s.ID {
		case http2.SettingInitialWindowSize:
			delta := int64(s.Val) - c.peerInitialWindow
			if delta == 0 {
				return nil
			}
			if len(c.streams) > 0 {
				if now := time.Now(); now.Sub(c.windowSince) >= time.Second {
					c.windowSince, c.windowStrikes = now, 0
				}
				if c.windowStrikes++; c.windowStrikes > maxWindowStrikes {
					return connError{http2.ErrCodeEnhanceYourCalm, "too many SETTINGS_INITIAL_WINDOW_SIZE changes", ""}
				}
			}
			// At most MaxConcurrentStreams steps, allocating nothing once
			// blocked has grown to the streams waiting.
			for _, st := range c.streams {
				if st.send+delta > maxWindow {
					return connError{http2.ErrCodeFlowControl, "SETTINGS_INITIAL_WINDOW_SIZE overflows a stream window", ""}
				}
				shut := st.send <= 0
				st.send += delta
				if shut && st.send > 0 && st.waiting && !st.queued {
					c.queue(st)
				}
			}
			c.peerInitialWindow = int64(s.Val)
		case http2.SettingMaxFrameSize:
			c.peerMaxFrame = int(s.Val)
		case http2.SettingHeaderTableSize:
			c.henc.SetMaxDynamicTableSizeLimit(s.Val)
		}
		return nil
	})
	if err != nil {
		var ce http2.ConnectionError
		if errors.As(err, &ce) {
			return connError{http2.ErrCode(ce), "an invalid setting", ""}
		}
		return err
	}
	if err := c.fr.WriteSettingsAck(); err != nil {
		return err
	}
	return c.unblock() // for the streams a larger initial window opened
}

func (c *conn) onWindowUpdate(f *http2.WindowUpdateFrame) error {
	inc := int64(f.Increment)
	if f.StreamID == 0 {
		if c.connSend+inc > maxWindow {
			return connError{http2.ErrCodeFlowControl, "connection window above 2^31-1", ""}
		}
		c.connSend += inc
		return c.unblock()
	}
	st := c.streams[f.StreamID]
	if st == nil {
		if f.StreamID > c.maxStreamID {
			return connError{http2.ErrCodeProtocol, "WINDOW_UPDATE on an idle stream", ""}
		}
		return nil // a stream already closed
	}
	if st.send+inc > maxWindow {
		c.resetStream(st.id, http2.ErrCodeFlowControl)
		return nil
	}
	st.send += inc
	return c.windowOpened(st)
}

func (c *conn) onPing(f *http2.PingFrame) error {
	if f.IsAck() {
		switch {
		case f.Data == drainPing && !c.drainBy.IsZero() && !c.goAway:
			// The peer has read the first GOAWAY of a graceful close.
			c.sendGoAway()
		case f.Data == heldPing && c.heldPingOut:
			c.keepHeld()
		}
		return nil
	}
	now := time.Now()
	if !c.lastPing.IsZero() && now.Sub(c.lastPing) < c.cfg.PingMinInterval {
		if c.pingStrikes++; c.pingStrikes > maxPingStrikes {
			return connError{http2.ErrCodeEnhanceYourCalm, "too many pings", ""}
		}
	}
	c.lastPing = now
	return c.fr.WritePing(true, f.Data)
}

func (c *conn) onReset(f *http2.RSTStreamFrame) error {
	if f.StreamID > c.maxStreamID {
		return connError{http2.ErrCodeProtocol, "RST_STREAM on an idle stream", ""}
	}
	st := c.streams[f.StreamID]
	if st == nil {
		// A stream already answered, refused or reset: a client cancels
		// what it waited for too long, and after a stall of the server
		// cancels in a burst what was answered as it woke. Such a reset
		// costs nothing but giving back what its decision reserved.
		c.cancelHeld(f.StreamID)
		return nil
	}
	if !st.waiting {
		// No answer begun: the peer cancels work it will read nothing of.
		now := time.Now()
		if now.Sub(c.resetsSince) >= time.Second {
			c.resetsSince, c.unpaid = now, 0
		}
		if c.unpaid++; c.unpaid > c.cfg.MaxResetsPerSecond {
			return connError{http2.ErrCodeEnhanceYourCalm, "too many stream resets", ""}
		}
	}
	c.closeStream(st)
	return nil
}

// heldStream is an answered stream whose decision reserved something.
type heldStream struct {
	id   uint32
	hold checkwire.Hold
}

// holdAnswered holds h, the reservations of stream id whose answer is
// wholly written, until the peer has read it; the oldest beyond
// maxHeldStreams is kept as taken.
func (c *conn) holdAnswered(id uint32, h checkwire.Hold) {
	if len(c.held) >= maxHeldStreams {
		c.held[0].hold.Keep()
		c.held = c.dropHeld(0)
	}
	if c.heldIDs == nil {
		c.heldIDs = map[uint32]struct{}{}
	}
	c.heldIDs[id] = struct{}{}
	c.held = append(c.held, heldStream{id, h})
}

// dropHeld removes held[i], keeping the order.
func (c *conn) dropHeld(i int) []heldStream {
	delete(c.heldIDs, c.held[i].id)
	if i < c.heldPinged {
		c.heldPinged--
	}
	n := copy(c.held[i:], c.held[i+1:])
	c.held[i+n] = heldStream{}
	return c.held[:i+n]
}

// cancelHeld gives back the reservations of stream id, if held.
func (c *conn) cancelHeld(id uint32) {
	if _, ok := c.heldIDs[id]; !ok {
		return
	}
	for i := range c.held {
		if c.held[i].id == id {
			c.held[i].hold.Cancel()
			c.held = c.dropHeld(i)
			return
		}
	}
}

// pingHeld writes a PING after the answers of the streams held since the
// last one, unless one is in flight: its ack tells they were read.
func (c *conn) pingHeld() {
	if c.heldPingOut || len(c.held) == c.heldPinged {
		return
	}
	c.fr.WritePing(false, heldPing)
	c.heldPinged, c.heldPingOut = len(c.held), true
}

// keepHeld ends, as taken, the holds of the streams whose answers
// preceded the PING just acked.
func (c *conn) keepHeld() {
	for i := range c.heldPinged {
		c.held[i].hold.Keep()
		delete(c.heldIDs, c.held[i].id)
	}
	n := copy(c.held, c.held[c.heldPinged:])
	clear(c.held[n:])
	c.held, c.heldPinged, c.heldPingOut = c.held[:n], 0, false
}

// endHolds ends what the connection holds as it closes: the held streams
// as taken (their answers went out; whether they were read cannot be
// known), the responses not wholly written as not taken.
func (c *conn) endHolds() {
	for _, h := range c.held {
		h.hold.Keep()
	}
	c.held, c.heldIDs = nil, nil
	for _, st := range c.streams {
		if st.hold != nil {
			st.hold.Cancel()
			st.hold = nil
		}
	}
}

// giveBack returns n received bytes to the peer's connection window,
// announcing them once a quarter of the window is due.
func (c *conn) giveBack(n int64) {
	c.refund += n
	if c.refund >= c.connWindow/4 {
		c.fr.WriteWindowUpdate(0, uint32(c.refund))
		c.recvHeld -= c.refund
		c.refund = 0
	}
}

// connReader is what the read buffer reads: the connection, where a wait
// interrupted by Shutdown, or ended by the bound on a graceful close's
// PING ack, moves the close on (advanceDrain) and waits on for the open
// streams. The write buffer is empty whenever this waits (beforeRead
// flushed), so what advanceDrain writes is flushed here.
type connReader struct{ c *conn }

func (r connReader) Read(p []byte) (int, error) {
	c := r.c
	for {
		n, err := c.rw.Read(p)
		var ne net.Error
		if n > 0 || err == nil || !c.draining.Load() || c.goAway || c.fr == nil || !errors.As(err, &ne) || !ne.Timeout() {
			return n, err
		}
		c.advanceDrain()
		if err := c.bw.Flush(); err != nil {
			return 0, err
		}
		if c.goAway && len(c.streams) == 0 {
			return 0, errDone
		}
		c.setReadDeadline()
	}
}

// deadlineWriter bounds each write to the connection by WriteTimeout.
type deadlineWriter struct{ c *conn }

func (w deadlineWriter) Write(p []byte) (int, error) {
	w.c.raw.SetWriteDeadline(time.Now().Add(w.c.cfg.WriteTimeout))
	return w.c.rw.Write(p)
}
