package kvtier

import (
	"encoding/binary"
	"math/bits"
	"unsafe"
)

// chainKey is xxhash64 (seed 0) of salt, parent and the block's tokens
// laid out as appendKeys lays them out (little-endian, 16+len(tok) bytes),
// computed from the words themselves instead of a copy in a buffer. tok is
// the tokens' little-endian bytes (tokenBytes); it MUST hold at least 4
// tokens, so that the input fills xxhash's first 32-byte stripe: salt and
// parent are then lanes 1 and 2 of that stripe, and only lane 2 depends on
// the previous block. The other lanes, the tail words' rounds and their
// merges do not, so a CPU works on the next block's while this one's parent
// chain finishes (a key chain is otherwise serial).
// TestChainKeyIsXXHash holds it to xxhash.Sum64 of the buffer.
func chainKey(salt Salt, parent Key, tok []byte) Key {
	const (
		p1 uint64 = 11400714785074694791
		p2 uint64 = 14029467366897019727
		p3 uint64 = 1609587929392839161
		p4 uint64 = 9650029242287828579
		// the lanes' seeds (seed 0): p1+p2 and -p1, modulo 2^64
		seed1 uint64 = 6983438078262162902
		seed4 uint64 = 7046029288634856825
	)
	round := func(acc, in uint64) uint64 {
		return bits.RotateLeft64(acc+in*p2, 31) * p1
	}
	le := binary.LittleEndian
	first := tok[:16:16]
	v1 := round(seed1, uint64(salt))
	v2 := round(p2, uint64(parent))
	v3 := round(0, le.Uint64(first[0:]))
	v4 := round(seed4, le.Uint64(first[8:]))
	b := tok[16:]
	for len(b) >= 32 {
		s := b[:32:32]
		v1 = round(v1, le.Uint64(s[0:]))
		v2 = round(v2, le.Uint64(s[8:]))
		v3 = round(v3, le.Uint64(s[16:]))
		v4 = round(v4, le.Uint64(s[24:]))
		b = b[32:]
	}
	h := bits.RotateLeft64(v1, 1) + bits.RotateLeft64(v2, 7) +
		bits.RotateLeft64(v3, 12) + bits.RotateLeft64(v4, 18)
	for _, v := range [...]uint64{v1, v2, v3, v4} {
		h = (h^round(0, v))*p1 + p4
	}
	h += uint64(16 + len(tok))
	for ; len(b) >= 8; b = b[8:] { // the tail's 8-byte words
		h = bits.RotateLeft64(h^round(0, le.Uint64(b)), 27)*p1 + p4
	}
	if len(b) >= 4 { // and its last 4 bytes (tokens come in 4)
		h = bits.RotateLeft64(h^uint64(le.Uint32(b))*p1, 23)*p2 + p3
	}
	h ^= h >> 33
	h *= p2
	h ^= h >> 29
	h *= p3
	h ^= h >> 32
	return Key(h)
}

// tokensEqual is slices.Equal for token blocks, as one memory compare
// (vector loads) instead of a loop over the tokens.
func tokensEqual(a, b []int32) bool {
	if len(a) != len(b) {
		return false
	}
	if len(a) == 0 {
		return true
	}
	sa := unsafe.String((*byte)(unsafe.Pointer(unsafe.SliceData(a))), 4*len(a))
	sb := unsafe.String((*byte)(unsafe.Pointer(unsafe.SliceData(b))), 4*len(b))
	return sa == sb
}
