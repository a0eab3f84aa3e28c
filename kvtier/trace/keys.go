package trace

import "kvtier.dev/internal/blockkey"

// KeyHasher derives prefix-chained block keys from token ids, for native
// trace lines that give tokens instead of keys, by kvtier's definition of
// a block's key (internal/blockkey), the trailing partial block included.
// Keys are equal exactly when salts and prefixes are (up to hash
// collisions, which a replay may ignore: it moves no real KV). The zero
// value is ready to use; a KeyHasher reuses its buffer and is not safe for
// concurrent use.
type KeyHasher struct {
	buf []byte
}

// AppendKeys appends the keys of tokens, cut into blocks of blockTokens
// tokens, to dst and returns it. blockTokens MUST be positive.
func (h *KeyHasher) AppendKeys(dst []uint64, salt uint64, tokens []int32, blockTokens int) []uint64 {
	var parent uint64
	for start := 0; start < len(tokens); start += blockTokens {
		h.buf = blockkey.AppendTokens(h.buf[:0], tokens[start:min(start+blockTokens, len(tokens))])
		parent = blockkey.Next(salt, parent, h.buf)
		dst = append(dst, parent)
	}
	return dst
}
