package kvtier

import (
	"encoding/binary"
	"math/rand/v2"
	"testing"

	"github.com/cespare/xxhash/v2"
)

// TestChainKeyIsXXHash: for every block size a key chain can have, from
// a partial stripe to several stripes with a tail of words and a last
// half word, chainKey and appendKeys equal xxhash.Sum64 of the block's
// bytes (salt, parent, tokens, little-endian), for any token values.
func TestChainKeyIsXXHash(t *testing.T) {
	rng := rand.New(rand.NewPCG(36, 2))
	for bt := 1; bt <= 70; bt++ {
		for range 50 {
			tok := make([]int32, 3*bt)
			for i := range tok {
				tok[i] = int32(rng.Uint32())
			}
			salt := Salt(rng.Uint64() >> rng.IntN(64))
			buf := make([]byte, 16+4*bt)
			binary.LittleEndian.PutUint64(buf, uint64(salt))
			var want []Key
			parent := Key(0)
			for b := range 3 {
				block := tok[b*bt : (b+1)*bt]
				binary.LittleEndian.PutUint64(buf[8:], uint64(parent))
				for i, v := range block {
					binary.LittleEndian.PutUint32(buf[16+4*i:], uint32(v))
				}
				k := Key(xxhash.Sum64(buf))
				if bt >= 4 {
					if got := chainKey(salt, parent, buf[16:]); got != k {
						t.Fatalf("blockTokens %d, block %d: chainKey %#x, xxhash %#x", bt, b, got, k)
					}
				}
				parent = k
				want = append(want, k)
			}
			got, _ := appendKeys(nil, nil, bt, salt, 0, tok)
			if len(got) != 3 || got[0] != want[0] || got[1] != want[1] || got[2] != want[2] {
				t.Fatalf("blockTokens %d: appendKeys %#x, xxhash %#x", bt, got, want)
			}
		}
	}
}

// BenchmarkAppendKeys4K hashes a 4096-token prompt in blocks of 16.
func BenchmarkAppendKeys4K(b *testing.B) {
	rng := rand.New(rand.NewPCG(4, 4))
	tok := make([]int32, 4096)
	for i := range tok {
		tok[i] = rng.Int32N(128000)
	}
	keys := make([]Key, 0, 256)
	var buf []byte
	b.ReportAllocs()
	for b.Loop() {
		keys, buf = appendKeys(keys[:0], buf, 16, 3, 0, tok)
	}
}
