package codec

import (
	"math/rand/v2"
	"testing"
)

// The Go codec on one llama-3.1-8b block (2 MiB as bf16); bytes/s count
// the bf16 side.
func BenchmarkEncode(b *testing.B) {
	r := rand.New(rand.NewPCG(37, 4))
	src := block(llama8B, func(i, head int) float32 { return float32(r.NormFloat64()) })
	dst := make([]byte, encodedBytes(FP8E4M3PerHead, llama8B))
	b.SetBytes(llama8B.BlockBytes())
	for b.Loop() {
		if err := Encode(FP8E4M3PerHead, llama8B, dst, src); err != nil {
			b.Fatal(err)
		}
	}
}

func BenchmarkDecode(b *testing.B) {
	r := rand.New(rand.NewPCG(37, 5))
	src := block(llama8B, func(i, head int) float32 { return float32(r.NormFloat64()) })
	enc := make([]byte, encodedBytes(FP8E4M3PerHead, llama8B))
	if err := Encode(FP8E4M3PerHead, llama8B, enc, src); err != nil {
		b.Fatal(err)
	}
	b.SetBytes(llama8B.BlockBytes())
	for b.Loop() {
		if err := Decode(FP8E4M3PerHead, llama8B, src, enc); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkCopy is the baseline: a plain copy of the same bytes.
func BenchmarkCopy(b *testing.B) {
	src := make([]byte, llama8B.BlockBytes())
	dst := make([]byte, llama8B.BlockBytes())
	b.SetBytes(llama8B.BlockBytes())
	for b.Loop() {
		copy(dst, src)
	}
}
