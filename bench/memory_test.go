package main

import (
	"os"
	"path/filepath"
	"testing"
)

func TestGCShare(t *testing.T) {
	log := filepath.Join(t.TempDir(), "server.log")
	if share, n := gcShare(log); share != 0 || n != 0 {
		t.Errorf("gcShare of a missing log = %d%%, %d", share, n)
	}
	lines := "[proc] pid 1\n" +
		"gc 1 @0.011s 2%: 0.012+0.31+0.003 ms clock, 0.025+0.1/0.2/0+0.007 ms cpu, 3->3->0 MB, 4 MB goal, 0 MB stacks, 0 MB globals, 2 P\n" +
		"time=… level=WARN msg=x\n" +
		"gc 412 @96.627s 13%: 0.1+2+0.01 ms clock, 0.2+1/2/3+0.02 ms cpu, 86->87->62 MB, 87 MB goal, 0 MB stacks, 0 MB globals, 2 P\n"
	if err := os.WriteFile(log, []byte(lines), 0o600); err != nil {
		t.Fatal(err)
	}
	if share, n := gcShare(log); share != 13 || n != 412 {
		t.Errorf("gcShare = %d%%, %d cycles; want 13%%, 412", share, n)
	}
	if n, live, goal := lastGC(log); n != 412 || live != 62<<20 || goal != 87<<20 {
		t.Errorf("lastGC = %d, %d, %d", n, live, goal)
	}
}
