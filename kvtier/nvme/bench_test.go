package nvme

import (
	"context"
	"testing"
)

// BenchmarkStore measures one block written or read at a time from parallel
// goroutines, with allocations per block; the drive, not the code, should be
// the limit (see benchmarks/nvme for the comparison with raw O_DIRECT).
func BenchmarkStore(b *testing.B) {
	const blockBytes = 256 << 10
	cfg := Config{Dirs: []string{b.TempDir()}, SlotsPerFile: 256, BlockBytes: blockBytes, MaxTokens: 16}
	s := mustOpen(b, cfg)
	slots := make(chan Slot, 256)
	for range 256 {
		slot, err := s.Allocate()
		if err != nil {
			b.Fatal(err)
		}
		buf := alignedBuf(b, blockBytes)
		fillPayload(buf, uint64(slot))
		if err := s.Write(context.Background(), slot, metaFor(uint64(slot), 16), buf); err != nil {
			b.Fatal(err)
		}
		slots <- slot
	}
	for _, write := range []bool{false, true} {
		name := "read"
		if write {
			name = "write"
		}
		b.Run(name, func(b *testing.B) {
			b.SetBytes(blockBytes)
			b.ReportAllocs()
			b.RunParallel(func(pb *testing.PB) {
				buf := alignedBuf(b, blockBytes)
				meta := metaFor(0, 16)
				ctx := context.Background()
				for pb.Next() {
					slot := <-slots
					var err error
					if write {
						meta.Key = uint64(slot)
						err = s.Write(ctx, slot, meta, buf)
					} else {
						_, err = s.Read(ctx, slot, buf)
					}
					slots <- slot
					if err != nil {
						b.Error(err)
						return
					}
				}
			})
		})
	}
}

// BenchmarkHeaderSum is what summing one slot header of 16 tokens costs:
// under the directory's key (HMAC-SHA256, every header since format 4)
// and with XXH3 (headers before it). The payload's sum is not in it.
func BenchmarkHeaderSum(b *testing.B) {
	hdr := make([]byte, headerBytes(16))
	for i := range hdr {
		hdr[i] = byte(i)
	}
	for _, tc := range []struct {
		name string
		cs   *checksum
	}{{"xxh3", &checksum{hdr: newChecksum(nil, nil).pay}}, {"keyed", newChecksum(make([]byte, dirKeyBytes), nil)}} {
		b.Run(tc.name, func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				tc.cs.header(hdr[16:])
			}
		})
	}
}
