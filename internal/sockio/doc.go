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
// What sysmon does besides (preempting a goroutine that runs for over
// 10 ms, retaking a P from a blocking system call, waking the scavenger)
// goes on at its next wakeup: the next timer, the next system call the
// scheduler hears of, at most a minute. Nothing here blocks, so nothing
// here needs it sooner.
//
// Under the race detector the calls go through the syscall package, so
// the detector sees what one goroutine's write to a socket tells another's
// read of it; `make test` also runs this package without the detector.
//
// On other systems than Linux, Wrap and Listen return what they are given.
package sockio
