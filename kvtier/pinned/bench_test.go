package pinned

import (
	"context"
	"testing"
)

// BenchmarkAlloc measures the whole pipeline with mlock registration at a
// size CI can afford; benchmarks/alloc measures against the driver.
func BenchmarkAlloc(b *testing.B) {
	const size = 256 * MiB
	for _, pages := range []PageMode{Pages4K, PagesTHP} {
		b.Run(pages.String(), func(b *testing.B) {
			b.SetBytes(size)
			for b.Loop() {
				r, err := Alloc(context.Background(), size, Options{Pages: pages, ChunkBytes: 32 * MiB})
				if err != nil {
					b.Fatal(err)
				}
				st := r.Stats()
				if err := r.Close(); err != nil {
					b.Fatal(err)
				}
				b.ReportMetric(st.TouchGiBPerSec(), "touch-GiB/s")
				b.ReportMetric(st.RegisterGiBPerSec(), "register-GiB/s")
			}
		})
	}
}
