// Package sockio gives TCP connections whose reads and writes are system
// calls the Go scheduler does not hear about.
//
// A Go program whose every goroutine is parked puts its system monitor
// thread (sysmon) into a deep sleep, and the first system call made
// through the syscall package after that wakes it again: on a server that
// goes idle between requests, as one answering a few thousand checks a
// second does, that is a futex wake, a short sleep and a second wakeup of
// another thread for every request, on top of the request's own. Reads
// and writes of a non-blocking socket never block, so they need none of
// what the scheduler does around a system call (handing the P to another
// thread when the call takes long): here they are raw system calls, made
// through the connection's syscall.RawConn, which still waits in the
// runtime's network poller when the socket has nothing to read or no room
// to write, and still honours the connection's deadlines.
//
// On other systems than Linux, Wrap and Listen return what they are given.
package sockio
