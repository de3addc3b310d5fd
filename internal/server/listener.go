package server

import (
	"net"
	"sync"
	"sync/atomic"
)

// limitListener accepts at most max connections at once. A connection over
// the bound is closed as soon as it is accepted and counted, so a client
// that holds many connections open gets the others refused at once instead
// of waiting in the kernel's backlog, and the operator sees it. Safe for
// concurrent use.
type limitListener struct {
	net.Listener
	max     int64
	open    atomic.Int64
	refused atomic.Uint64
}

func newLimitListener(l net.Listener, max int) *limitListener {
	return &limitListener{Listener: l, max: int64(max)}
}

func (l *limitListener) Accept() (net.Conn, error) {
	for {
		c, err := l.Listener.Accept()
		if err != nil {
			return nil, err
		}
		if l.open.Add(1) > l.max {
			l.open.Add(-1)
			l.refused.Add(1)
			c.Close()
			continue
		}
		return &limitConn{Conn: c, l: l}, nil
	}
}

// limitConn gives its slot back on the first Close (before closing, so a
// client that sees the close can connect again at once).
type limitConn struct {
	net.Conn
	l    *limitListener
	once sync.Once
}

func (c *limitConn) Close() error {
	c.once.Do(func() { c.l.open.Add(-1) })
	return c.Conn.Close()
}
