//go:build 386 || amd64 || arm || arm64 || loong64 || mips64le || mipsle || ppc64le || riscv64 || wasm

package kvtier

import "unsafe"

// inlineKeys says that tokenBytes is the tokens' memory as is, so that
// keys are hashed from the tokens where they are.
const inlineKeys = true

// tokenBytes is tokens' little-endian bytes: their memory on this machine.
func tokenBytes(tokens []int32) []byte {
	return unsafe.Slice((*byte)(unsafe.Pointer(unsafe.SliceData(tokens))), 4*len(tokens))
}

// leTokens returns tokens' little-endian bytes, and buf unchanged: here
// they are the tokens' memory.
func leTokens(buf []byte, tokens []int32) (le, scratch []byte) { return tokenBytes(tokens), buf }
