package checkh2

import (
	"errors"
	"net"
	"os"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/ratelimit-authz/ratelimit-authz/internal/checkwire"
)

// failingListener returns errs from Accept in turn, then waits for Close.
type failingListener struct {
	mu     sync.Mutex
	errs   []error
	calls  int
	closed chan struct{}
	once   sync.Once
}

func (l *failingListener) Accept() (net.Conn, error) {
	l.mu.Lock()
	l.calls++
	if len(l.errs) > 0 {
		err := l.errs[0]
		l.errs = l.errs[1:]
		l.mu.Unlock()
		return nil, err
	}
	l.mu.Unlock()
	<-l.closed
	return nil, net.ErrClosed
}

func (l *failingListener) Close() error   { l.once.Do(func() { close(l.closed) }); return nil }
func (l *failingListener) Addr() net.Addr { return &net.TCPAddr{IP: net.IPv4(127, 0, 0, 1)} }

// Running out of descriptors (or buffers) is waited out: the listener, and
// the node it belongs to, go on serving.
func TestAcceptOutOfDescriptorsIsWaitedOut(t *testing.T) {
	accept := func(errno syscall.Errno) error {
		return &net.OpError{Op: "accept", Net: "tcp", Err: os.NewSyscallError("accept4", errno)}
	}
	l := &failingListener{closed: make(chan struct{}),
		errs: []error{accept(syscall.EMFILE), accept(syscall.ENFILE), accept(syscall.ECONNABORTED), accept(syscall.ENOBUFS)}}
	s, err := New(Config{Check: okCheck{dec: checkwire.NewDecoder(nil, false)}})
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- s.Serve(l) }()
	deadline := time.Now().Add(10 * time.Second)
	for {
		l.mu.Lock()
		calls := l.calls
		l.mu.Unlock()
		if calls > 4 {
			break
		}
		select {
		case err := <-done:
			t.Fatalf("Serve returned %v after %d accepts, want it to wait the errors out", err, calls)
		default:
		}
		if time.Now().After(deadline) {
			t.Fatalf("Serve made %d accepts in 10 s", calls)
		}
		time.Sleep(5 * time.Millisecond)
	}
	s.Close()
	select {
	case err := <-done:
		if !errors.Is(err, ErrServerClosed) {
			t.Fatalf("Serve after Close = %v, want ErrServerClosed", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("Serve did not return after Close")
	}

	// Any other accept error ends Serve with it.
	l = &failingListener{closed: make(chan struct{}), errs: []error{accept(syscall.EINVAL)}}
	s, _ = New(Config{Check: okCheck{dec: checkwire.NewDecoder(nil, false)}})
	if err := s.Serve(l); err == nil || !errors.Is(err, syscall.EINVAL) {
		t.Fatalf("Serve on EINVAL = %v, want it returned", err)
	}
}
