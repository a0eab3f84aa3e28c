package codec

import "math"

// OCP FP8 e4m3 ("E4M3FN"): 1 sign bit, 4 exponent bits of bias 7, 3
// mantissa bits; no infinities, and S.1111.111 is NaN. The largest finite
// value is 448 (0x7E), the smallest normal 2^-6, the smallest subnormal 2^-9.
const (
	e4m3Max     = 448
	e4m3MaxCode = 0x7E
	e4m3NaN     = 0x7F
	// bf16NaN is what Decode writes for a NaN code.
	bf16NaN = 0x7FC0
	// f32Bits448 is math.Float32bits(448): a magnitude at or above it
	// saturates.
	f32Bits448 = 0x43E00000
)

// MinAmax is the smallest group amax that gets a scale: below it (all
// zeros, or values of at most 2^-100) the group is stored as zeros with
// scale 0. It keeps 448/amax and amax/448 finite normal float32 values, so
// the Go reference and the kernels compute them alike.
const MinAmax = 0x1p-100

// e4m3Values holds every code's value as float32 (NaN for 0x7F and 0xFF).
var e4m3Values = func() (t [256]float32) {
	for c := range 256 {
		t[c] = e4m3Value(uint8(c))
	}
	return t
}()

// e4m3Value is code c's exact value.
func e4m3Value(c uint8) float32 {
	e, m := int(c>>3)&15, int(c&7)
	var v float32
	switch {
	case e == 15 && m == 7:
		return float32(math.NaN())
	case e == 0:
		v = float32(m) * 0x1p-9
	default:
		v = math.Float32frombits(uint32(e+120)<<23 | uint32(m)<<20)
	}
	if c&0x80 != 0 {
		v = -v
	}
	return v
}

// e4m3FromFloat32 rounds f to the nearest e4m3 code, ties to even,
// saturating at ±448 (±Inf too); NaN of any sign gives 0x7F. It is what
// PTX's cvt.rn.satfinite.e4m3x2.f32 does for non-NaN inputs.
func e4m3FromFloat32(f float32) uint8 {
	b := math.Float32bits(f)
	sign := uint8(b>>24) & 0x80
	a := b & 0x7FFFFFFF
	switch {
	case a > 0x7F800000:
		return e4m3NaN
	case a >= f32Bits448:
		return sign | e4m3MaxCode
	case a < 0x3C800000: // below 2^-6: a subnormal code (or 2^-6 itself after rounding)
		// |f|·2^9 is exact; rounding it to an integer to even gives the
		// mantissa, and 8 carries into code 0x08 = 2^-6.
		q := math.RoundToEven(float64(math.Float32frombits(a)) * 0x1p9)
		return sign | uint8(q)
	}
	// Normal: rebias the exponent (127 -> 7) and round the 23-bit mantissa
	// to 3 bits, to nearest even; a carry moves into the exponent, and
	// a < 448 keeps the result at most 0x7E.
	r := a - (120 << 23)
	r += 0x7FFFF + (r>>20)&1
	return sign | uint8(r>>20)
}

// bf16ToFloat32 widens a bf16 (exact).
func bf16ToFloat32(h uint16) float32 { return math.Float32frombits(uint32(h) << 16) }

// float32ToBF16 rounds f to bf16, to nearest even; NaN gives bf16NaN. It
// is what the decode kernel does.
func float32ToBF16(f float32) uint16 {
	b := math.Float32bits(f)
	if b&0x7FFFFFFF > 0x7F800000 {
		return bf16NaN
	}
	return uint16((b + 0x7FFF + (b>>16)&1) >> 16)
}
