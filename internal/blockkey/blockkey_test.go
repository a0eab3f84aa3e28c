package blockkey

import (
	"encoding/binary"
	"testing"

	"github.com/zeebo/xxh3"
)

// TestDefinition holds Next to the package doc's formula, computed here
// from the bytes it names, for blocks of 0 to 70 tokens.
func TestDefinition(t *testing.T) {
	parent := uint64(0)
	for n := range 71 {
		tok := make([]int32, n)
		for i := range tok {
			tok[i] = int32(uint32(i*2654435761) ^ uint32(n))
		}
		salt := uint64(n) * 0x9e3779b97f4a7c15
		raw := make([]byte, 4*n)
		for i, v := range tok {
			binary.LittleEndian.PutUint32(raw[4*i:], uint32(v))
		}
		pair := make([]byte, 16)
		binary.LittleEndian.PutUint64(pair, parent)
		binary.LittleEndian.PutUint64(pair[8:], xxh3.HashSeed(raw, salt))
		want := xxh3.Hash(pair)
		if got := Next(salt, parent, AppendTokens(nil, tok)); got != want {
			t.Fatalf("%d tokens: Next %#x, the definition %#x", n, got, want)
		}
		parent = want
	}
}

// TestKeysSeparate: the salt, the parent and every token change the key.
func TestKeysSeparate(t *testing.T) {
	tok := AppendTokens(nil, []int32{1, 2, 3, 4, 5, 6, 7, 8})
	k := Next(1, 2, tok)
	if Next(3, 2, tok) == k || Next(1, 4, tok) == k {
		t.Fatal("the salt or the parent does not change the key")
	}
	for i := range tok {
		c := append([]byte(nil), tok...)
		c[i] ^= 1
		if Next(1, 2, c) == k {
			t.Fatalf("flipping byte %d does not change the key", i)
		}
	}
	if Chain(5, 6) == Chain(6, 5) {
		t.Fatal("Chain is symmetric in its arguments")
	}
}

func TestNoAllocations(t *testing.T) {
	tok := AppendTokens(nil, make([]int32, 16))
	if n := testing.AllocsPerRun(100, func() { _ = Next(1, 2, tok) }); n != 0 {
		t.Fatalf("%v allocations per key", n)
	}
}
