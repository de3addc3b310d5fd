//go:build !linux

package sockio

import "net"

// Listen returns l.
func Listen(l net.Listener) net.Listener { return l }

// Wrap returns c.
func Wrap(c net.Conn) net.Conn { return c }
