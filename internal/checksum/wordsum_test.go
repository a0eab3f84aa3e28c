package checksum

import (
	"math/rand/v2"
	"testing"
)

func randomBytes(n int, seed uint64) []byte {
	r := rand.New(rand.NewPCG(seed, 1))
	b := make([]byte, n)
	for i := range b {
		b[i] = byte(r.Uint32())
	}
	return b
}

// TestWordSumGolden pins the sum's definition: slot headers on disk carry
// it, so a change would make every stored block fail its check.
func TestWordSumGolden(t *testing.T) {
	for _, c := range []struct {
		n    int
		want uint64
	}{{0, 0}, {1, 0xf56a57d851266a26}, {8, 0x9dbccf24f500bdc9}, {13, 0x05fb3eeb38d0a040}, {4096, 0x1296c491bc5e8d88}} {
		b := randomBytes(c.n, 7)
		if got := WordSum(b); got != c.want {
			t.Errorf("WordSum of %d bytes = %#x, want %#x", c.n, got, c.want)
		}
	}
}

// TestWordSumAnySplit: the partial sums of any split into pieces of whole
// words add up to the whole payload's, in any order.
func TestWordSumAnySplit(t *testing.T) {
	b := randomBytes(64<<10+5, 3)
	whole := WordAccumulate(b, 0)
	r := rand.New(rand.NewPCG(9, 9))
	for range 50 {
		var acc uint64
		for off := 0; off < len(b); {
			n := 8 * (1 + r.IntN(300))
			n = min(n, len(b)-off)
			acc += WordAccumulate(b[off:off+n], uint64(off/8))
			off += n
		}
		if acc != whole {
			t.Fatalf("a split's partial sums add to %#x, the whole to %#x", acc, whole)
		}
	}
}

// TestWordSumCatches: every single-bit flip, a swap of two words, a moved
// word, a zeroed word and a length change all change the sum.
func TestWordSumCatches(t *testing.T) {
	b := randomBytes(4096, 5)
	want := WordSum(b)
	for bit := range len(b) * 8 {
		b[bit/8] ^= 1 << (bit % 8)
		if WordSum(b) == want {
			t.Fatalf("flipping bit %d leaves the sum", bit)
		}
		b[bit/8] ^= 1 << (bit % 8)
	}
	c := append([]byte(nil), b...)
	copy(c[0:8], b[8:16])
	copy(c[8:16], b[0:8])
	if WordSum(c) == want {
		t.Error("swapping words 0 and 1 leaves the sum")
	}
	c = append([]byte(nil), b...)
	clear(c[800:808])
	if WordSum(c) == want {
		t.Error("zeroing word 100 leaves the sum")
	}
	if WordSum(b[:len(b)-8]) == want || WordSum(append(append([]byte(nil), b...), 0)) == want {
		t.Error("changing the length leaves the sum")
	}
	zero := make([]byte, 4096)
	if WordSum(zero) == WordSum(zero[:4088]) {
		t.Error("a zero payload's sum does not depend on its length")
	}
}

// BenchmarkSums times the unkeyed sums of 4 MiB payloads on the CPU: hot
// (one buffer, in cache) and cold (64 buffers, 256 MiB, in turn), as a
// payload is after DMA. XXH3 runs at the speed memory delivers the bytes;
// the word sum is meant for the GPU.
//
//	go test ./internal/checksum -run X -bench Sums
func BenchmarkSums(b *testing.B) {
	const n, cold = 4 << 20, 64
	bufs := make([][]byte, cold)
	for i := range bufs {
		bufs[i] = randomBytes(n, uint64(i))
	}
	plain := New(nil)
	for _, f := range []struct {
		name string
		sum  func([]byte) uint64
	}{{"xxh3", plain.Of}, {"wordsum", WordSum}} {
		for _, c := range []struct {
			name string
			bufs int
		}{{"hot", 1}, {"cold", cold}} {
			b.Run(f.name+"/"+c.name, func(b *testing.B) {
				b.SetBytes(n)
				i := 0
				for b.Loop() {
					f.sum(bufs[i%c.bufs])
					i++
				}
			})
		}
	}
}
