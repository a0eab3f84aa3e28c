package model

import "math"

// Tensor is one weight tensor: Rows × Cols bf16 values, row-major, each
// output's weights in one row (nn.Linear's [out][in]). Element i is
// Value(seed, ID, i, Lim, Shift, Offset).
type Tensor struct {
	Name       string
	ID         uint32
	Rows, Cols int
	// Value's parameters: an integer k in [-Lim, Lim] scaled by 2^-Shift,
	// plus Offset (0 or 1).
	Lim, Shift int
	Offset     float32
}

// Elems is Rows × Cols.
func (t Tensor) Elems() int64 { return int64(t.Rows) * int64(t.Cols) }

// The tensors of one layer, in Layer order.
const (
	AttnNorm = iota // [1][Hidden]
	QKV             // [QKVWidth][Hidden]: q heads, then k heads, then v heads
	Out             // [Hidden][QHeads*HeadDim]
	MLPNorm         // [1][Hidden]
	GateUp          // [2*Intermediate][Hidden]: gate rows, then up rows
	Down            // [Hidden][Intermediate]
	NumLayerTensors
)

// Tensors of a whole model.
type Tensors struct {
	Embed     Tensor // [Vocab][Hidden]
	FinalNorm Tensor // [1][Hidden]
	LMHead    Tensor // [Vocab][Hidden]; equal to Embed when tied
	Layer     [][NumLayerTensors]Tensor
}

// scaleShift is the Shift that gives Value a standard deviation of about
// std: k uniform in [-127, 127] has a standard deviation of about 73.
func scaleShift(std float64) int { return int(math.Round(math.Log2(73 / std))) }

// TensorsOf lays out c's weights. Matrices have a standard deviation of
// about 1/sqrt(fan-in), so activations keep their size through the layers;
// the LM head's is 8 times that, so the logits spread well apart and greedy
// choices are rarely near ties; norm weights lie in [0.875, 1.125].
func TensorsOf(c Config) Tensors {
	mat := func(name string, id uint32, rows, cols int, std float64) Tensor {
		return Tensor{Name: name, ID: id, Rows: rows, Cols: cols, Lim: 127, Shift: scaleShift(std)}
	}
	norm := func(name string, id uint32, n int) Tensor {
		return Tensor{Name: name, ID: id, Rows: 1, Cols: n, Lim: 16, Shift: 7, Offset: 1}
	}
	inv := func(n int) float64 { return 1 / math.Sqrt(float64(n)) }
	t := Tensors{
		Embed:     mat("embed", 1, c.Vocab, c.Hidden, 1),
		FinalNorm: norm("final_norm", 2, c.Hidden),
		LMHead:    mat("lm_head", 3, c.Vocab, c.Hidden, 8*inv(c.Hidden)),
		Layer:     make([][NumLayerTensors]Tensor, c.Layers),
	}
	if c.TieEmbeddings {
		t.LMHead = t.Embed
	}
	for l := range t.Layer {
		id := uint32(16 + l*NumLayerTensors)
		t.Layer[l] = [NumLayerTensors]Tensor{
			AttnNorm: norm("attn_norm", id+AttnNorm, c.Hidden),
			QKV:      mat("qkv", id+QKV, c.QKVWidth(), c.Hidden, inv(c.Hidden)),
			Out:      mat("out", id+Out, c.Hidden, c.QHeads*c.HeadDim, inv(c.QHeads*c.HeadDim)),
			MLPNorm:  norm("mlp_norm", id+MLPNorm, c.Hidden),
			GateUp:   mat("gate_up", id+GateUp, 2*c.Intermediate, c.Hidden, inv(c.Hidden)),
			Down:     mat("down", id+Down, c.Hidden, c.Intermediate, inv(c.Intermediate)),
		}
	}
	return t
}

// Value is element i of tensor id under seed: a splitmix64 hash of (seed,
// id, i) picks k in [-lim, lim], and the value is k·2^-shift + offset,
// exact in bf16 and in float32 (|k| < 256; offset 1 only with shift ≤ 7 and
// lim ≤ 127). The GPU kernel kvm_init_weights computes the same.
func Value(seed uint64, id uint32, i uint64, lim, shift int, offset float32) float32 {
	return value(seed, id, i, lim, float32(math.Ldexp(1, -shift)), offset)
}

func value(seed uint64, id uint32, i uint64, lim int, scale, offset float32) float32 {
	x := seed ^ uint64(id)<<48 ^ i
	x += 0x9E3779B97F4A7C15
	x = (x ^ x>>30) * 0xBF58476D1CE4E5B9
	x = (x ^ x>>27) * 0x94D049BB133111EB
	x ^= x >> 31
	k := int32(uint32(x>>32)%uint32(2*lim+1)) - int32(lim)
	return float32(k)*scale + offset
}

// Fill writes t's values under seed into dst (len t.Elems()). Like the
// reference's inner loops it is left out of race instrumentation.
//
//go:norace
func (t Tensor) Fill(seed uint64, dst []float32) {
	scale := float32(math.Ldexp(1, -t.Shift))
	for i := range dst {
		dst[i] = value(seed, t.ID, uint64(i), t.Lim, scale, t.Offset)
	}
}

// RopeTables returns cos and sin of position p times frequency d at
// [p*HeadDim/2+d], for positions [0, maxPos): float64 math rounded once to
// float32, shared by both backends so that they rotate identically.
func RopeTables(c Config, maxPos int) (cos, sin []float32) {
	half := c.HeadDim / 2
	cos = make([]float32, maxPos*half)
	sin = make([]float32, maxPos*half)
	for d := range half {
		inv := math.Pow(c.RopeTheta, -2*float64(d)/float64(c.HeadDim))
		for p := range maxPos {
			s, co := math.Sincos(float64(p) * inv)
			cos[p*half+d], sin[p*half+d] = float32(co), float32(s)
		}
	}
	return cos, sin
}
