package logbuf

import (
	"fmt"
	"strings"
	"sync"
	"testing"
)

// Writers on many goroutines lose no line and interleave none (run
// under -race to see that the reads are safe too).
func TestConcurrentWrites(t *testing.T) {
	var b Buffer
	var wg sync.WaitGroup
	for g := range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range 100 {
				fmt.Fprintf(&b, "g%d line %d\n", g, i)
				_ = b.String()
			}
		}()
	}
	wg.Wait()
	lines := strings.Split(strings.TrimSuffix(b.String(), "\n"), "\n")
	if len(lines) != 800 {
		t.Fatalf("%d lines, want 800", len(lines))
	}
	seen := map[string]bool{}
	for _, l := range lines {
		var g, i int
		if _, err := fmt.Sscanf(l, "g%d line %d", &g, &i); err != nil {
			t.Fatalf("torn line %q", l)
		}
		seen[l] = true
	}
	if len(seen) != 800 {
		t.Errorf("%d distinct lines, want 800", len(seen))
	}
}
