package kvtier

import (
	"math/rand/v2"
	"slices"
	"testing"

	"kvtier.dev/internal/blockkey"
)

// TestKeysAreBlockkeys: for block sizes from 1 to 70 tokens and any token
// values, appendKeys, Hasher and the cache query's own hashing (through
// CachedPrefixKeys) give the keys internal/blockkey defines.
func TestKeysAreBlockkeys(t *testing.T) {
	rng := rand.New(rand.NewPCG(36, 2))
	for bt := 1; bt <= 70; bt++ {
		for range 20 {
			tok := make([]int32, 3*bt+rng.IntN(bt))
			for i := range tok {
				tok[i] = int32(rng.Uint32())
			}
			salt := Salt(rng.Uint64() >> rng.IntN(64))
			var want []Key
			parent := uint64(0)
			for b := range 3 {
				parent = blockkey.Next(uint64(salt), parent, blockkey.AppendTokens(nil, tok[b*bt:(b+1)*bt]))
				want = append(want, Key(parent))
			}
			got, _ := appendKeys(nil, nil, bt, salt, 0, tok)
			if !slices.Equal(got, want) {
				t.Fatalf("blockTokens %d: appendKeys %#x, blockkey %#x", bt, got, want)
			}
			h, err := NewHasher(bt)
			if err != nil {
				t.Fatal(err)
			}
			if got := h.AppendKeys(nil, salt, 0, tok); !slices.Equal(got, want) {
				t.Fatalf("blockTokens %d: Hasher %#x, blockkey %#x", bt, got, want)
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
