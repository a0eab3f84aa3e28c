package model

import "math"

// BF16 is a bfloat16 value's bits: a float32's upper half.
type BF16 uint16

// ToBF16 rounds f to the nearest bf16, ties to even (NaN stays NaN).
func ToBF16(f float32) BF16 {
	b := math.Float32bits(f)
	if b&0x7fffffff > 0x7f800000 {
		return BF16(b>>16 | 0x40)
	}
	b += 0x7fff + (b>>16)&1
	return BF16(b >> 16)
}

// Float32 widens h exactly.
func (h BF16) Float32() float32 { return math.Float32frombits(uint32(h) << 16) }

// roundBF16 is f rounded to bf16 and widened back.
func roundBF16(f float32) float32 { return ToBF16(f).Float32() }
