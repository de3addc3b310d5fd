package sockio

import (
	"io"
	"net"
	"os"
	"sync"
	"syscall"
)

// Listen returns l whose accepted TCP connections are wrapped by Wrap.
func Listen(l net.Listener) net.Listener { return listener{l} }

type listener struct{ net.Listener }

func (l listener) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	if err != nil {
		return nil, err
	}
	return Wrap(c), nil
}

// Wrap returns c with Read and Write made raw system calls when c is a
// *net.TCPConn, else c. Every other method is the TCPConn's.
func Wrap(c net.Conn) net.Conn {
	tc, ok := c.(*net.TCPConn)
	if !ok {
		return c
	}
	rc, err := tc.SyscallConn()
	if err != nil {
		return c
	}
	conn := &Conn{TCPConn: tc, rc: rc}
	// Method values made once: a closure per call would be an allocation
	// per call.
	conn.rd.fn = conn.rd.read
	conn.wr.fn = conn.wr.write
	return conn
}

// Conn is a *net.TCPConn whose Read and Write are raw system calls. Safe
// for concurrent use, as a net.Conn is: reads are serialised with reads
// and writes with writes.
type Conn struct {
	*net.TCPConn
	rc syscall.RawConn
	rd op
	wr op
}

// op holds one Read's or one Write's state for its RawConn callback
// (fn), under mu.
type op struct {
	mu    sync.Mutex
	fn    func(fd uintptr) bool
	p     []byte
	n     int
	err   syscall.Errno
	short bool // write(2) wrote nothing and said nothing: as net, io.ErrUnexpectedEOF
}

// read is the RawConn callback of a Read: false asks to wait until the
// socket is readable (or the deadline passes) and be called again.
func (r *op) read(fd uintptr) bool {
	for {
		n, e := sysRead(fd, r.p)
		switch e {
		case syscall.EINTR:
			continue
		case syscall.EAGAIN:
			return false
		case 0:
			r.n = int(n)
		}
		r.err = e
		return true
	}
}

// write is the RawConn callback of a Write: it writes until p is all
// written or the socket has no room (false: wait until it has, and be
// called again).
func (w *op) write(fd uintptr) bool {
	for len(w.p) > 0 {
		n, e := sysWrite(fd, w.p)
		switch e {
		case syscall.EINTR:
			continue
		case syscall.EAGAIN:
			return false
		case 0:
			if n == 0 {
				w.short = true
				return true
			}
			w.n += int(n)
			w.p = w.p[n:]
		default:
			w.err = e
			return true
		}
	}
	return true
}

// Read reads as net.TCPConn.Read does: io.EOF once the peer has closed,
// a net.Error on a deadline or failure.
func (c *Conn) Read(p []byte) (int, error) {
	if len(p) == 0 {
		return 0, nil
	}
	r := &c.rd
	r.mu.Lock()
	defer r.mu.Unlock()
	r.p, r.n, r.err = p, 0, 0
	err := c.rc.Read(r.fn)
	r.p = nil
	switch {
	case err != nil:
		return 0, c.opError("read", err)
	case r.err != 0:
		return 0, c.opError("read", os.NewSyscallError("read", r.err))
	case r.n == 0:
		return 0, io.EOF
	}
	return r.n, nil
}

// Write writes all of p, as net.TCPConn.Write does, unless the deadline
// passes or the connection fails first: then it returns how much it wrote
// and a net.Error.
func (c *Conn) Write(p []byte) (int, error) {
	if len(p) == 0 {
		return 0, nil
	}
	w := &c.wr
	w.mu.Lock()
	defer w.mu.Unlock()
	w.p, w.n, w.err, w.short = p, 0, 0, false
	err := c.rc.Write(w.fn)
	w.p = nil
	switch {
	case err != nil:
		return w.n, c.opError("write", err)
	case w.err != 0:
		return w.n, c.opError("write", os.NewSyscallError("write", w.err))
	case w.short:
		return w.n, c.opError("write", io.ErrUnexpectedEOF)
	}
	return w.n, nil
}

// opError wraps err as net's own reads and writes do, so callers that ask
// for a net.Error (Timeout), os.ErrDeadlineExceeded or net.ErrClosed get
// the same answers.
func (c *Conn) opError(op string, err error) error {
	if oe, ok := err.(*net.OpError); ok {
		err = oe.Err // the RawConn's own, as "raw-read"
	}
	return &net.OpError{Op: op, Net: "tcp", Source: c.LocalAddr(), Addr: c.RemoteAddr(), Err: err}
}
