package trace

import (
	"encoding/binary"

	"github.com/cespare/xxhash/v2"
)

// KeyHasher derives prefix-chained block keys from token ids, for native
// trace lines that give tokens instead of keys:
//
//	h_i = xxhash64(salt ‖ h_{i-1} ‖ tokens of block i), h_{-1} = 0,
//
// each number little-endian (salt and keys 8 bytes, tokens 4), the trailing
// partial block included. Keys are equal exactly when salts and prefixes are
// (up to hash collisions, which a replay may ignore: it moves no real KV).
// The zero value is ready to use; a KeyHasher reuses its buffer and is not
// safe for concurrent use.
type KeyHasher struct {
	buf []byte
}

// AppendKeys appends the keys of tokens, cut into blocks of blockTokens
// tokens, to dst and returns it. blockTokens MUST be positive.
func (h *KeyHasher) AppendKeys(dst []uint64, salt uint64, tokens []int32, blockTokens int) []uint64 {
	var parent uint64
	for start := 0; start < len(tokens); start += blockTokens {
		block := tokens[start:min(start+blockTokens, len(tokens))]
		h.buf = binary.LittleEndian.AppendUint64(h.buf[:0], salt)
		h.buf = binary.LittleEndian.AppendUint64(h.buf, parent)
		for _, t := range block {
			h.buf = binary.LittleEndian.AppendUint32(h.buf, uint32(t))
		}
		parent = xxhash.Sum64(h.buf)
		dst = append(dst, parent)
	}
	return dst
}
