package filewatch

import (
	"fmt"
	"path/filepath"
	"testing"
)

// BenchmarkScan is the cost of one poll (and of one re-arm after a
// burst): a ConfigMap of ten keys, and a directory at the default entry
// bound.
func BenchmarkScan(b *testing.B) {
	lim := limits{maxDepth: DefaultMaxDepth, maxDirs: DefaultMaxDirs, maxEntries: DefaultMaxEntries}
	b.Run("configmap-10", func(b *testing.B) {
		files := map[string]string{}
		for i := range 10 {
			files[fmt.Sprintf("key%d.yaml", i)] = "domain: x\n"
		}
		dir := filepath.Join(b.TempDir(), "cm")
		newConfigMap(b, dir, files)
		b.ReportAllocs()
		for b.Loop() {
			scan([]string{dir}, lim)
		}
	})
	b.Run("entries-10000", func(b *testing.B) {
		dir := fifoDir(b, DefaultMaxEntries)
		b.ReportAllocs()
		for b.Loop() {
			scan([]string{dir}, lim)
		}
	})
}
