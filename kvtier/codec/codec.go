// Package codec is the format of compressed KV blocks and its Go reference:
// what a lower tier stores instead of the bf16 bytes the GPU holds, and the
// exact conversion both ways. A block's codec travels in tier headers as one
// byte (Codec); a block is decoded only by the codec that encoded it.
//
// A block (Shape) is, per layer, K then V (Parts 2; Parts 1 for one tensor
// per layer, as MLA), each [Tokens][Heads][HeadDim] little-endian bf16: the
// layout of transfer.BlockFirstLayout and of the server's model package.
//
// FP8E4M3PerHead stores each value as an OCP FP8 e4m3 code with one fp32
// scale per (layer, part, head). Its byte layout, its rounding and its
// handling of zeros, subnormals, infinities and NaN are fixed by this
// package (see FP8E4M3PerHead); the CUDA kernels (package cudacodec)
// produce and read the same bytes, bit for bit.
//
// Encode and Decode allocate nothing, and on bad input (unknown codec, bad
// shape, wrong buffer size, a corrupt scale) return an error that names what
// was wrong and write nothing.
package codec

import (
	"errors"
	"fmt"
)

// Codec names how a block's bytes are encoded. It is stored as one byte in
// tier headers: values are never renumbered.
type Codec uint8

const (
	// None: the block's bytes are the bf16 bytes the GPU holds.
	None Codec = 0
	// FP8E4M3PerHead: FP8 e4m3 codes with one fp32 scale per (layer,
	// part, head), about half the bytes of None.
	//
	// Layout of an encoded block (EncodedBytes):
	//
	//	scales  Layers*Parts*Heads float32, little-endian, index
	//	        (layer*Parts+part)*Heads+head, zero-padded to a multiple
	//	        of 16 bytes (ScaleBytes)
	//	codes   one e4m3 byte per value, in the source's order:
	//	        (layer*Parts+part)*Tokens*Heads*HeadDim + (token*Heads+head)*HeadDim + i
	//
	// Both sections start 16-byte aligned (HeadDim is a multiple of 16).
	//
	// Encoding a (layer, part, head) group: amax is the largest |x| over
	// its finite values. If amax < MinAmax (all zeros or subnormal dust),
	// scale = 0 and every finite value encodes as a zero of its sign.
	// Otherwise scale = amax/448 and inv = 448/amax (float32, rounded to
	// nearest even), and a value encodes as e4m3(x*inv), the product
	// rounded to float32 and then to e4m3 to nearest even, saturating at
	// ±448. ±Inf encodes as ±448 (code 0x7E/0xFE), NaN of any sign as 0x7F.
	//
	// Decoding: a code's exact value times its scale, rounded to float32,
	// then to bf16 to nearest even. Codes 0x7F and 0xFF decode to the bf16
	// NaN 0x7FC0. Decode rejects a scale that is negative, infinite or NaN.
	FP8E4M3PerHead Codec = 1
	// NumCodecs is the number of codecs.
	NumCodecs = 2
)

func (c Codec) String() string {
	switch c {
	case None:
		return "none"
	case FP8E4M3PerHead:
		return "fp8-e4m3-per-head"
	}
	return fmt.Sprintf("Codec(%d)", uint8(c))
}

// ParseCodec is String's inverse, for flags and config files.
func ParseCodec(s string) (Codec, error) {
	for c := range Codec(NumCodecs) {
		if c.String() == s {
			return c, nil
		}
	}
	return 0, fmt.Errorf("codec: %w: %q (want %q or %q)", ErrCodec, s, None, FP8E4M3PerHead)
}

// Check reports ErrCodec for a codec this build does not know, as read
// from a header.
func (c Codec) Check() error {
	if c >= NumCodecs {
		return fmt.Errorf("codec: %w: id %d (known: 0 %s, 1 %s)", ErrCodec, uint8(c), None, FP8E4M3PerHead)
	}
	return nil
}

// Sentinels; errors.Is matches every error of the class.
var (
	// ErrCodec: a codec id this build does not know.
	ErrCodec = errors.New("unknown codec")
	// ErrShape: a Shape outside the supported range.
	ErrShape = errors.New("bad block shape")
	// ErrSize: a buffer whose length is not the one the shape and codec give.
	ErrSize = errors.New("wrong buffer size")
	// ErrCorrupt: an encoded block whose contents cannot be decoded (a
	// negative, infinite or NaN scale).
	ErrCorrupt = errors.New("corrupt encoded block")
)
