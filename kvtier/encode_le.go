//go:build 386 || amd64 || arm || arm64 || loong64 || mips64le || mipsle || ppc64le || riscv64 || wasm

package kvtier

import "unsafe"

// putTokens writes tokens into dst little-endian. On little-endian machines
// that is their memory as is: one copy instead of a store per token.
func putTokens(dst []byte, tokens []int32) {
	if len(tokens) == 0 {
		return
	}
	copy(dst, unsafe.Slice((*byte)(unsafe.Pointer(unsafe.SliceData(tokens))), 4*len(tokens)))
}

// inlineKeys says that tokenBytes is the tokens' memory as is, so that
// chainKey reads their words in place.
const inlineKeys = true

// tokenBytes is tokens' little-endian bytes: their memory on this machine.
func tokenBytes(tokens []int32) []byte {
	return unsafe.Slice((*byte)(unsafe.Pointer(unsafe.SliceData(tokens))), 4*len(tokens))
}
