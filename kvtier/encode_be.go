//go:build !(386 || amd64 || arm || arm64 || loong64 || mips64le || mipsle || ppc64le || riscv64 || wasm)

package kvtier

import "encoding/binary"

// putTokens writes tokens into dst little-endian, so that keys are the same
// on every machine.
func putTokens(dst []byte, tokens []int32) {
	for i, tok := range tokens {
		binary.LittleEndian.PutUint32(dst[4*i:], uint32(tok))
	}
}

// inlineKeys is false: tokens' memory is big-endian here, so keys are
// hashed from a little-endian copy (appendKeys' buffer).
const inlineKeys = false

// tokenBytes is never called where inlineKeys is false.
func tokenBytes([]int32) []byte { panic("kvtier: tokenBytes on a big-endian machine") }
