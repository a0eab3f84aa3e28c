//go:build !(386 || amd64 || arm || arm64 || loong64 || mips64le || mipsle || ppc64le || riscv64 || wasm)

package kvtier

import "kvtier.dev/internal/blockkey"

// inlineKeys is false: tokens' memory is big-endian here, so keys are
// hashed from a little-endian copy (leTokens' buffer).
const inlineKeys = false

// tokenBytes is never called where inlineKeys is false.
func tokenBytes([]int32) []byte { panic("kvtier: tokenBytes on a big-endian machine") }

// leTokens writes tokens into buf little-endian, so that keys are the same
// on every machine, and returns those bytes and the grown buffer.
func leTokens(buf []byte, tokens []int32) (le, scratch []byte) {
	buf = blockkey.AppendTokens(buf[:0], tokens)
	return buf, buf
}
