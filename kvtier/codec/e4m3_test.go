package codec

import (
	"math"
	"math/rand/v2"
	"testing"
)

// refValue is code c's value computed from the e4m3 definition in float64,
// independently of e4m3Value: (-1)^s · 2^(1-7) · m/8 for e = 0, and
// (-1)^s · 2^(e-7) · (1 + m/8) otherwise; S.1111.111 is NaN.
func refValue(c int) float64 {
	s, e, m := c>>7, (c>>3)&15, c&7
	if e == 15 && m == 7 {
		return math.NaN()
	}
	v := math.Ldexp(1+float64(m)/8, e-7)
	if e == 0 {
		v = math.Ldexp(float64(m)/8, -6)
	}
	if s == 1 {
		v = -v
	}
	return v
}

// refNearest is the code nearest to f by exhaustive search over the
// finite codes, ties to the even code, saturating at ±448; NaN gives 0x7F.
func refNearest(f float32) uint8 {
	x := float64(f)
	if math.IsNaN(x) {
		return e4m3NaN
	}
	var sign uint8
	if math.Signbit(x) {
		sign, x = 0x80, -x
	}
	if x >= 448 {
		return sign | 0x7E
	}
	best, bestErr := 0, math.Inf(1)
	for c := 0; c <= 0x7E; c++ {
		d := math.Abs(refValue(c) - x)
		if d < bestErr || (d == bestErr && c%2 == 0) {
			best, bestErr = c, d
		}
	}
	return sign | uint8(best)
}

func TestE4M3AllCodesDecode(t *testing.T) {
	anchors := map[int]float64{0x00: 0, 0x01: 0x1p-9, 0x07: 7 * 0x1p-9, 0x08: 0x1p-6, 0x38: 1, 0x3C: 1.5,
		0x7E: 448, 0x80: 0, 0xB8: -1, 0xFE: -448}
	for c := range 256 {
		got, want := e4m3Values[c], refValue(c)
		if math.IsNaN(want) {
			if c != 0x7F && c != 0xFF || !math.IsNaN(float64(got)) {
				t.Errorf("code %#02x: got %v, want NaN (only 0x7F and 0xFF)", c, got)
			}
			continue
		}
		if float64(got) != want || math.Signbit(float64(got)) != (c&0x80 != 0) {
			t.Errorf("code %#02x: got %v, want %v", c, got, want)
		}
		if a, ok := anchors[c]; ok && want != a {
			t.Errorf("code %#02x: reference %v, the standard says %v", c, want, a)
		}
	}
}

func TestE4M3RoundsEveryBF16(t *testing.T) {
	for h := range 1 << 16 {
		f := bf16ToFloat32(uint16(h))
		if got, want := e4m3FromFloat32(f), refNearest(f); got != want {
			t.Fatalf("bf16 %#04x (%v): got code %#02x, want %#02x", h, f, got, want)
		}
	}
}

// TestE4M3Ties rounds every midpoint between adjacent finite codes (and
// the float32 neighbours of each) and checks ties go to the even code.
func TestE4M3Ties(t *testing.T) {
	for c := 0; c < 0x7E; c++ {
		mid := float32((refValue(c) + refValue(c+1)) / 2) // exact: 5 significant bits at most
		even := uint8(c)
		if c%2 == 1 {
			even = uint8(c + 1)
		}
		for _, f := range []float32{mid, -mid} {
			want := even | uint8(math.Float32bits(f)>>24)&0x80
			if got := e4m3FromFloat32(f); got != want {
				t.Errorf("midpoint %v between codes %#02x and %#02x: got %#02x, want %#02x", f, c, c+1, got, want)
			}
		}
		below, above := math.Nextafter32(mid, 0), math.Nextafter32(mid, 1000)
		if got := e4m3FromFloat32(below); got != uint8(c) {
			t.Errorf("just below midpoint %v: got %#02x, want %#02x", mid, got, c)
		}
		if got := e4m3FromFloat32(above); got != uint8(c+1) {
			t.Errorf("just above midpoint %v: got %#02x, want %#02x", mid, got, c+1)
		}
	}
}

func TestE4M3SpecialInputs(t *testing.T) {
	cases := []struct {
		f    float32
		want uint8
	}{
		{float32(math.Inf(1)), 0x7E}, {float32(math.Inf(-1)), 0xFE},
		{float32(math.NaN()), 0x7F}, {-float32(math.NaN()), 0x7F},
		{math.Float32frombits(0xFFC00001), 0x7F},
		{464, 0x7E}, {1e30, 0x7E}, {-math.MaxFloat32, 0xFE},
		{float32(math.Copysign(0, -1)), 0x80}, {0x1p-149, 0x00}, {0x1p-10, 0x00}, {0x1.0001p-10, 0x01},
	}
	for _, c := range cases {
		if got := e4m3FromFloat32(c.f); got != c.want {
			t.Errorf("e4m3FromFloat32(%v, bits %#08x) = %#02x, want %#02x", c.f, math.Float32bits(c.f), got, c.want)
		}
	}
}

func TestE4M3RoundsRandomFloat32(t *testing.T) {
	r := rand.New(rand.NewPCG(37, 1))
	for range 200_000 {
		// Exponents around e4m3's range, any mantissa bits.
		f := math.Float32frombits(r.Uint32()&0x807FFFFF | uint32(110+r.IntN(30))<<23)
		if got, want := e4m3FromFloat32(f), refNearest(f); got != want {
			t.Fatalf("%v (bits %#08x): got code %#02x, want %#02x", f, math.Float32bits(f), got, want)
		}
	}
}

// refBF16 rounds f to bf16 by comparing the two neighbouring bf16 values
// in float64, ties to the even one.
func refBF16(f float32) uint16 {
	if math.IsNaN(float64(f)) {
		return bf16NaN
	}
	lo := uint16(math.Float32bits(f) >> 16)
	if math.IsInf(float64(f), 0) || bf16ToFloat32(lo) == f {
		return lo
	}
	hi := lo + 1 // the next magnitude up (may be Inf)
	dl := math.Abs(float64(f) - float64(bf16ToFloat32(lo)))
	var dh float64
	if hv := bf16ToFloat32(hi); math.IsInf(float64(hv), 0) {
		dh = math.Abs(math.Ldexp(1, 128)) - math.Abs(float64(f)) // Inf rounds as 2^128
	} else {
		dh = math.Abs(float64(hv) - float64(f))
	}
	if dl < dh || dl == dh && lo%2 == 0 {
		return lo
	}
	return hi
}

func TestFloat32ToBF16(t *testing.T) {
	r := rand.New(rand.NewPCG(37, 2))
	edge := []uint32{0, 0x80000000, 0x7F7FFFFF, 0xFF7FFFFF, 0x7F7F8000, 0x3F808000, 0x3F818000, 0x00008000, 0x7F800000, 0x7FC00001, 0xFFFFFFFF}
	for i := range 300_000 {
		b := r.Uint32()
		if i < len(edge) {
			b = edge[i]
		}
		f := math.Float32frombits(b)
		if got, want := float32ToBF16(f), refBF16(f); got != want {
			t.Fatalf("float32 bits %#08x (%v): got bf16 %#04x, want %#04x", b, f, got, want)
		}
	}
}
