package checksum

import (
	"encoding/binary"
)

// The word sum: a checksum a GPU computes at the speed of its memory, in
// any order, and the CPU reproduces bit for bit. A payload is read as
// little-endian 64-bit words w_0, w_1, ... (the last one zero-padded), each
// word is mixed with its index,
//
//	mix(w, i) = fmix64(w ^ (i·WordSumIndexMul + WordSumIndexAdd))
//
// (fmix64 is MurmurHash3's 64-bit finaliser, a bijection), and the mixes
// are added modulo 2^64. Since addition commutes, any split of the payload
// into pieces gives the same total: a kernel's thread blocks each add up
// their own words (WordAccumulate), and the partial sums are added in any
// order. The sum is then finished with the payload's length:
//
//	WordSum(b) = fmix64(acc ^ len(b)·WordSumLengthMul)
//
// What it catches: any change to one word changes that word's mix (fmix64
// is a bijection) and so the total; words swapped or moved change their
// indices' mixes; a truncated or extended payload changes the length. Two
// or more changed words escape only if their mixes' changes cancel, about
// 2^-64 for unrelated data. It is not a MAC: a forger who can write the
// payload can compute it (use a keyed Sum against those).
//
// cudastream's kernel kvtier_wordsum (cudastream/kernels/sum.cu) computes
// WordAccumulate on the device; the constants below are its constants.
const (
	WordSumIndexMul  = 0x9e3779b97f4a7c15
	WordSumIndexAdd  = 0x6a09e667f3bcc908
	WordSumLengthMul = 0xbb67ae8584caa73b
)

// fmix64 is MurmurHash3's 64-bit finaliser.
func fmix64(x uint64) uint64 {
	x ^= x >> 33
	x *= 0xff51afd7ed558ccd
	x ^= x >> 33
	x *= 0xc4ceb9fe1a85ec53
	x ^= x >> 33
	return x
}

// WordAccumulate returns the sum of the mixes of b's words, b starting at
// word index first of its payload. len(b) must be a multiple of 8 except
// for a payload's last piece, whose last word is zero-padded.
func WordAccumulate(b []byte, first uint64) uint64 {
	// Four independent chains, so that fmix64's multiplies overlap. On the
	// CPU it runs at about 4 GB/s (BenchmarkSums, the development VM); the GPU is where
	// it is meant to run.
	var a0, a1, a2, a3 uint64
	x := first*WordSumIndexMul + WordSumIndexAdd // the index term of word i
	var step uint64 = WordSumIndexMul
	le := binary.LittleEndian
	for len(b) >= 32 {
		a0 += fmix64(le.Uint64(b) ^ x)
		a1 += fmix64(le.Uint64(b[8:]) ^ (x + step))
		a2 += fmix64(le.Uint64(b[16:]) ^ (x + 2*step))
		a3 += fmix64(le.Uint64(b[24:]) ^ (x + 3*step))
		b, x = b[32:], x+4*step
	}
	for len(b) >= 8 {
		a0 += fmix64(le.Uint64(b) ^ x)
		b, x = b[8:], x+step
	}
	if len(b) > 0 {
		var w [8]byte
		copy(w[:], b)
		a1 += fmix64(le.Uint64(w[:]) ^ x)
	}
	return a0 + a1 + a2 + a3
}

// WordSumFinish finishes an accumulated sum of a payload of n bytes.
func WordSumFinish(acc uint64, n int) uint64 {
	return fmix64(acc ^ uint64(n)*WordSumLengthMul)
}

// WordSum returns the word sum of b.
func WordSum(b []byte) uint64 { return WordSumFinish(WordAccumulate(b, 0), len(b)) }
