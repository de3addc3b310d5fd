package checkwire

// Hold is what a decision reserved for the request it admitted (a lease
// of a concurrency bucket, a cost taken at the check) and gives back if
// the caller never takes the answer: the call was cancelled (its stream
// reset) or its deadline passed before the answer reached the caller.
// The transport ends every Hold it is given with exactly one of Cancel
// or Keep, from the goroutine that got it; it is not used afterwards.
type Hold interface {
	// Cancel gives back what the decision reserved: the answer was not
	// taken, so the request it admitted never reaches the upstream.
	Cancel()
	// Keep ends the hold with its reservations in place: the answer was
	// taken, or whether it was can no longer be known.
	Keep()
}

// Reserved is the body of a Hold: items of T, whose strings are kept in
// Strs (by index). A Hold reuses one from call to call. Not safe for
// concurrent use; the zero value is empty.
type Reserved[T any] struct {
	Items []T
	Strs  Copies
}

// maxPooledReservedBytes: a Reserved whose copies grew past this (a
// request with huge keys) is left to the garbage collector.
const maxPooledReservedBytes = 4 << 10

// Reset empties r, keeping its buffers, and reports whether it is small
// enough to be reused.
func (r *Reserved[T]) Reset() bool {
	clear(r.Items)
	r.Items = r.Items[:0]
	r.Strs.Reset()
	return cap(r.Strs.buf) <= maxPooledReservedBytes
}

// Copies keeps copies of a call's strings that a Hold needs past the
// call (the request's strings are views of a buffer the transport
// reuses), in one buffer reused from hold to hold. The zero value is
// empty; not safe for concurrent use.
type Copies struct {
	buf  []byte
	ends []int
}

// Add copies s and returns its index.
func (c *Copies) Add(s string) int {
	c.buf = append(c.buf, s...)
	c.ends = append(c.ends, len(c.buf))
	return len(c.ends) - 1
}

// Get returns a string of copy i (a new allocation: a Hold gives back
// rarely, and the buffer is reused).
func (c *Copies) Get(i int) string {
	start := 0
	if i > 0 {
		start = c.ends[i-1]
	}
	return string(c.buf[start:c.ends[i]])
}

// Reset empties c, keeping its buffers.
func (c *Copies) Reset() {
	c.buf, c.ends = c.buf[:0], c.ends[:0]
}
