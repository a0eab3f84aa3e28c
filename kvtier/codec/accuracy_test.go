package codec

import (
	"encoding/binary"
	"math"
	"math/rand/v2"
	"testing"

	"kvtier.dev/kvtier/cost"
)

// block builds a bf16 block of shape s whose value i is f(i, head).
func block(s Shape, f func(i, head int) float32) []byte {
	b := make([]byte, s.BlockBytes())
	for i := range int(s.values()) {
		binary.LittleEndian.PutUint16(b[2*i:], refBF16(f(i, (i/s.HeadDim)%s.Heads)))
	}
	return b
}

func value(b []byte, i int) float32 { return bf16ToFloat32(binary.LittleEndian.Uint16(b[2*i:])) }

// groupOf is the (layer, part, head) group of value i.
func groupOf(s Shape, i int) int {
	return (i/s.partValues())*s.Heads + (i/s.HeadDim)%s.Heads
}

// groupAmax is each group's largest finite |x|, computed directly.
func groupAmax(s Shape, b []byte) []float64 {
	a := make([]float64, s.groups())
	for i := range int(s.values()) {
		x := math.Abs(float64(value(b, i)))
		if g := groupOf(s, i); x > a[g] && !math.IsInf(x, 0) {
			a[g] = x
		}
	}
	return a
}

// checkRoundTrip encodes and decodes src and checks every value against
// the format's contract: the scales are amax/448, finite values come
// back within |x|·(2^-4 + 2^-7) + scale·2^-9 (e4m3's half ulp, 2^-4 of
// a normal value and 2^-10 of the scale below 2^-6, plus bf16's rounding
// of the result), groups below MinAmax come back as zeros of their sign,
// ±Inf as ±448·scale and NaN as NaN. It returns the largest error over
// amax/448 seen.
func checkRoundTrip(t testing.TB, s Shape, src []byte) float64 {
	t.Helper()
	enc := make([]byte, encodedBytes(FP8E4M3PerHead, s))
	dec := make([]byte, s.BlockBytes())
	if err := Encode(FP8E4M3PerHead, s, enc, src); err != nil {
		t.Fatal(err)
	}
	if err := Decode(FP8E4M3PerHead, s, dec, enc); err != nil {
		t.Fatalf("Decode of Encode's output: %v", err)
	}
	amax := groupAmax(s, src)
	scale := make([]float64, len(amax))
	for g, a := range amax {
		got := math.Float32frombits(binary.LittleEndian.Uint32(enc[4*g:]))
		want := float32(0)
		if a >= MinAmax {
			want = float32(a) / 448
		}
		if got != want {
			t.Fatalf("group %d: scale %v, want amax/448 = %v (amax %v)", g, got, want, a)
		}
		scale[g] = float64(got)
	}
	worst := 0.0
	for i := range int(s.values()) {
		x, y := float64(value(src, i)), float64(value(dec, i))
		g := groupOf(s, i)
		switch {
		case math.IsNaN(x):
			if binary.LittleEndian.Uint16(dec[2*i:]) != bf16NaN {
				t.Fatalf("value %d: NaN came back as %v", i, y)
			}
			continue
		case math.IsInf(x, 0):
			want := float64(bf16ToFloat32(refBF16(float32(math.Copysign(448, x) * scale[g]))))
			if y != want {
				t.Fatalf("value %d: %v came back as %v, want %v (448·scale)", i, x, y, want)
			}
			continue
		case amax[g] < MinAmax:
			if y != 0 || math.Signbit(x) != math.Signbit(y) {
				t.Fatalf("value %d: %v in a group of amax %v below MinAmax came back as %v, want a zero of its sign", i, x, amax[g], y)
			}
			continue
		}
		e := math.Abs(x - y)
		if bound := math.Abs(x)*(0x1p-4+0x1p-7) + scale[g]*0x1p-9; e > bound {
			t.Fatalf("value %d (group %d, amax %v): %v came back as %v, error %v over the bound %v", i, g, amax[g], x, y, e, bound)
		}
		if r := e / scale[g]; r > worst {
			worst = r
		}
	}
	return worst
}

// small is a shape with several layers, parts and heads, and tokens that
// make a head's values non-contiguous.
var small = Shape{Layers: 3, Parts: 2, Tokens: 5, Heads: 4, HeadDim: 32}

func TestRoundTripRandom(t *testing.T) {
	r := rand.New(rand.NewPCG(37, 3))
	dists := map[string]func(i, head int) float32{
		"normal":         func(i, head int) float32 { return float32(r.NormFloat64()) },
		"per-head scale": func(i, head int) float32 { return float32(r.NormFloat64() * math.Ldexp(1, 10*head-20)) },
		"heavy tail":     func(i, head int) float32 { return float32(r.NormFloat64() / (r.Float64() + 1e-3)) },
		"uniform wide":   func(i, head int) float32 { return float32(math.Ldexp(r.Float64()*2-1, r.IntN(60)-30)) },
	}
	for name, f := range dists {
		t.Run(name, func(t *testing.T) {
			for _, s := range []Shape{small, {1, 1, 1, 1, 16}, {2, 2, 16, 8, 128}} {
				worst := checkRoundTrip(t, s, block(s, f))
				// The largest error is in the top binade: half its ulp of 32
				// (16·scale), plus bf16's rounding of the result (at most
				// 448·2^-8·scale).
				if worst > 16+448*0x1p-8 {
					t.Errorf("shape %+v: worst error %v·scale, more than half an ulp of 448 and a bf16 rounding", s, worst)
				}
			}
		})
	}
}

func TestRoundTripAdversarial(t *testing.T) {
	inf, nan := float32(math.Inf(1)), float32(math.NaN())
	cases := map[string]func(i, head int) float32{
		"zeros":          func(i, head int) float32 { return 0 },
		"negative zeros": func(i, head int) float32 { return float32(math.Copysign(0, -1)) },
		"one spike": func(i, head int) float32 {
			if i == 77 {
				return 3e4
			}
			return float32(i%13) * 1e-3
		},
		"negative spike per head": func(i, head int) float32 {
			if i%(small.HeadDim*small.Heads) == head*small.HeadDim {
				return -float32(head+1) * 100
			}
			return 0.5
		},
		"bf16 subnormals":    func(i, head int) float32 { return float32(i%9-4) * 0x1p-133 },
		"subnormals and 1":   func(i, head int) float32 { return [2]float32{0x1p-130, 1}[i%2] },
		"tiny normal amax":   func(i, head int) float32 { return float32(i%7-3) * 0x1p-99 },
		"below MinAmax":      func(i, head int) float32 { return float32(i%7-3) * 0x1p-103 },
		"bf16 max":           func(i, head int) float32 { return [3]float32{math.MaxFloat32, -1e38, 1}[i%3] },
		"e4m3 subnormal mix": func(i, head int) float32 { return [3]float32{448, 1e-2, 3e-3}[i%3] },
		"inf and nan": func(i, head int) float32 {
			return [6]float32{inf, -inf, nan, -nan, 2, -0.25}[i%6]
		},
		"only inf": func(i, head int) float32 { return [2]float32{inf, -inf}[i%2] },
	}
	for name, f := range cases {
		t.Run(name, func(t *testing.T) { checkRoundTrip(t, small, block(small, f)) })
	}
}

// TestPerHeadScales: each head's scale follows its own amax, whatever the
// other heads, layers and parts hold, and its amax encodes as ±448.
func TestPerHeadScales(t *testing.T) {
	s := small
	amax := func(layerPart, head int) float32 { return float32(head+1) * float32(layerPart+1) * 0.75 }
	src := block(s, func(i, head int) float32 {
		lp := i / s.partValues()
		tok := (i % s.partValues()) / (s.Heads * s.HeadDim)
		if tok == 2 && i%s.HeadDim == head {
			return -amax(lp, head) // the group's largest magnitude, negative
		}
		return amax(lp, head) / float32(2+i%5)
	})
	enc := make([]byte, encodedBytes(FP8E4M3PerHead, s))
	if err := Encode(FP8E4M3PerHead, s, enc, src); err != nil {
		t.Fatal(err)
	}
	for lp := range s.Layers * s.Parts {
		for h := range s.Heads {
			got := math.Float32frombits(binary.LittleEndian.Uint32(enc[4*(lp*s.Heads+h):]))
			if want := refFloat32Div(amax(lp, h), 448); got != want {
				t.Errorf("layer %d part %d head %d: scale %v, want %v", lp/2, lp%2, h, got, want)
			}
			i := lp*s.partValues() + (2*s.Heads+h)*s.HeadDim + h
			if c := enc[s.ScaleBytes()+int64(i)]; c != 0xFE {
				t.Errorf("layer %d part %d head %d: amax's code %#02x, want 0xFE (-448)", lp/2, lp%2, h, c)
			}
		}
	}
	checkRoundTrip(t, s, src)
}

// refFloat32Div is a/b rounded to float32 through float64 (exact: a
// float64 quotient of float32s rounds to float32 without double-rounding
// error, as 53 >= 2·24+2).
func refFloat32Div(a, b float32) float32 { return float32(float64(a) / float64(b)) }

// TestFP8ErrorRMSIsTheFormats: the cost model's ErrorRMS for fp8-e4m3,
// what an error budget is set against, is what this format does to KV
// values of any spread: Gaussian, Laplace, heavy-tailed (Student t, 3
// degrees), and a head whose few channels are 20 times the rest. e4m3
// rounds each value relative to itself (3 mantissa bits), so the error
// barely moves with the distribution; the preset is its ceiling, within
// 10%.
func TestFP8ErrorRMSIsTheFormats(t *testing.T) {
	cc, err := cost.LookupCodec("fp8-e4m3")
	if err != nil {
		t.Fatal(err)
	}
	s := Shape{Layers: 4, Parts: 2, Tokens: 16, Heads: 8, HeadDim: 128}
	rng := rand.New(rand.NewPCG(11, 12))
	dists := []struct {
		name string
		f    func(i int) float64
	}{
		{"gaussian", func(int) float64 { return rng.NormFloat64() }},
		{"laplace", func(int) float64 { return rng.ExpFloat64() * float64(1-2*rng.IntN(2)) }},
		{"student-t3", func(int) float64 {
			c := 0.0
			for range 3 {
				z := rng.NormFloat64()
				c += z * z
			}
			return rng.NormFloat64() / math.Sqrt(c/3)
		}},
		{"outlier-channels", func(i int) float64 {
			if i%s.HeadDim < 4 {
				return 20 * rng.NormFloat64()
			}
			return rng.NormFloat64()
		}},
	}
	enc := make([]byte, encodedBytes(FP8E4M3PerHead, s))
	dec := make([]byte, s.BlockBytes())
	for _, d := range dists {
		name, f := d.name, d.f
		var num, den float64
		for range 8 {
			src := block(s, func(i, _ int) float32 { return float32(f(i)) })
			if err := Encode(FP8E4M3PerHead, s, enc, src); err != nil {
				t.Fatal(err)
			}
			if err := Decode(FP8E4M3PerHead, s, dec, enc); err != nil {
				t.Fatal(err)
			}
			for i := range int(s.values()) {
				x, y := float64(value(src, i)), float64(value(dec, i))
				num, den = num+(x-y)*(x-y), den+x*x
			}
		}
		got := math.Sqrt(num / den)
		t.Logf("%s: relative RMS error %.4f", name, got)
		if got > cc.ErrorRMS || got < 0.9*cc.ErrorRMS {
			t.Errorf("%s: relative RMS error %.4f, the cost model says %.4f", name, got, cc.ErrorRMS)
		}
	}
}
