package kvtier

import (
	"fmt"

	"kvtier.dev/internal/blockkey"
)

// Hasher computes the chained keys of token blocks, as internal/blockkey
// defines them: h_i = XXH3-64(h_{i-1} ‖ XXH3-64(tokens of block i, seed
// salt)), h_{-1} = 0, numbers little-endian; only full blocks have keys. It MUST NOT be used by two
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
	return hashBlocks(dst, nil, buf, blockTokens, salt, parent, tokens)
}

// appendKeysHashes is appendKeys from the first block that also appends
// each block's tokenHash to hashes.
func appendKeysHashes(dst []Key, hashes []uint32, buf []byte, blockTokens int, salt Salt, tokens []int32) ([]Key, []uint32, []byte) {
	dst, buf = hashBlocks(dst, &hashes, buf, blockTokens, salt, 0, tokens)
	return dst, hashes, buf
}

// hashBlocks is appendKeys, appending each block's tokenHash to *hashes
// too unless hashes is nil.
func hashBlocks(dst []Key, hashes *[]uint32, buf []byte, blockTokens int, salt Salt, parent Key, tokens []int32) ([]Key, []byte) {
	for len(tokens) >= blockTokens {
		var tb []byte
		tb, buf = leTokens(buf, tokens[:blockTokens])
		b := blockkey.Block(uint64(salt), tb)
		parent = Key(blockkey.Chain(uint64(parent), b))
		dst = append(dst, parent)
		if hashes != nil {
			*hashes = append(*hashes, tokenHash(b))
		}
		tokens = tokens[blockTokens:]
	}
	return dst, buf
}

// tokenHash is what the index keeps of a block's own token hash b (b_i of
// internal/blockkey: XXH3-64 of its tokens seeded with the salt, which its
// key chains): 32 bits, so that an index entry stays 16 bytes.
func tokenHash(b uint64) uint32 { return uint32(b) }

// tokenHashOf is blockTokenHash with the manager's scratch, 0 for nil
// tokens. Write lock.
func (m *Manager) tokenHashOf(salt Salt, tok []int32) uint32 {
	if tok == nil {
		return 0
	}
	var th uint32
	th, m.hashBuf = blockTokenHash(m.hashBuf, salt, tok)
	return th
}

// blockTokenHash is tokenHash of block tokens tok under salt; buf is
// leTokens' scratch, returned grown.
func blockTokenHash(buf []byte, salt Salt, tok []int32) (uint32, []byte) {
	le, buf := leTokens(buf, tok)
	return tokenHash(blockkey.Block(uint64(salt), le)), buf
}
