package kvtier

import (
	"encoding/binary"
	"fmt"

	"github.com/cespare/xxhash/v2"
)

// Hasher computes the chained keys of token blocks:
// h_i = xxhash64(salt, h_{i-1}, tokens of block i), h_{-1} = 0, encoded
// little-endian; only full blocks have keys. It MUST NOT be used by two
// goroutines at once.
type Hasher struct {
	blockTokens int
	buf         []byte
}

// NewHasher returns a Hasher for blocks of blockTokens tokens.
func NewHasher(blockTokens int) (*Hasher, error) {
	if blockTokens <= 0 || blockTokens > MaxBlockTokens {
		return nil, fmt.Errorf("%w: blockTokens %d is not in [1, %d]", ErrBadInput, blockTokens, MaxBlockTokens)
	}
	return &Hasher{blockTokens: blockTokens}, nil
}

// BlockTokens is the number of tokens per block.
func (h *Hasher) BlockTokens() int { return h.blockTokens }

// AppendKeys appends to dst the keys of the full blocks of tokens, chained
// from parent (0 for the first block of a request), and returns dst.
func (h *Hasher) AppendKeys(dst []Key, salt Salt, parent Key, tokens []int32) []Key {
	dst, h.buf = appendKeys(dst, h.buf, h.blockTokens, salt, parent, tokens)
	return dst
}

// appendKeys hashes tokens' full blocks into dst using buf as scratch; it
// returns both so that callers keep the grown buffers.
func appendKeys(dst []Key, buf []byte, blockTokens int, salt Salt, parent Key, tokens []int32) ([]Key, []byte) {
	if inlineKeys && blockTokens >= 4 {
		for len(tokens) >= blockTokens {
			parent = chainKey(salt, parent, tokenBytes(tokens[:blockTokens]))
			dst = append(dst, parent)
			tokens = tokens[blockTokens:]
		}
		return dst, buf
	}
	n := 16 + 4*blockTokens
	if cap(buf) < n {
		buf = make([]byte, n)
	}
	buf = buf[:n]
	binary.LittleEndian.PutUint64(buf[0:8], uint64(salt))
	for len(tokens) >= blockTokens {
		binary.LittleEndian.PutUint64(buf[8:16], uint64(parent))
		putTokens(buf[16:n], tokens[:blockTokens])
		parent = Key(xxhash.Sum64(buf))
		dst = append(dst, parent)
		tokens = tokens[blockTokens:]
	}
	return dst, buf
}
