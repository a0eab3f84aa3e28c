package model

import (
	"encoding/binary"
	"fmt"
	"math"
)

// CPU is the reference backend: float32 math over the model's weights, with
// the KV region in host memory laid out as on the GPU (see the package
// doc). It is not safe for concurrent use.
type CPU struct {
	cfg    Config
	t      Tensors
	embed  []float32
	final  []float32
	lmHead []float32
	layers [][NumLayerTensors][]float32

	region   []byte
	numSlots int

	cos, sin []float32 // rotary tables for positions [0, len(cos)/(HeadDim/2))

	// Scratch, grown to the largest pass seen and reused.
	x, xn, qkv, q, att, gu, act, scores, logits []float32
}

// NewCPU builds the model c with weights from seed and a KV region of
// numSlots blocks (numSlots × c.BlockBytes() bytes).
func NewCPU(c Config, seed uint64, numSlots int) (*CPU, error) {
	if err := c.Validate(); err != nil {
		return nil, err
	}
	if numSlots <= 0 {
		return nil, fmt.Errorf("model: NewCPU: numSlots must be positive, got %d", numSlots)
	}
	m := &CPU{cfg: c, t: TensorsOf(c), numSlots: numSlots, region: make([]byte, int64(numSlots)*c.BlockBytes())}
	fill := func(t Tensor) []float32 {
		v := make([]float32, t.Elems())
		t.Fill(seed, v)
		return v
	}
	m.embed, m.final = fill(m.t.Embed), fill(m.t.FinalNorm)
	m.lmHead = m.embed
	if !c.TieEmbeddings {
		m.lmHead = fill(m.t.LMHead)
	}
	m.layers = make([][NumLayerTensors][]float32, c.Layers)
	for l := range m.layers {
		for i, t := range m.t.Layer[l] {
			m.layers[l][i] = fill(t)
		}
	}
	m.logits = make([]float32, c.Vocab)
	return m, nil
}

// Config is the model's shape.
func (m *CPU) Config() Config { return m.cfg }

// Region is the KV region: slot s is Region()[s*BlockBytes:(s+1)*BlockBytes].
// Callers may read and write it between passes (to load blocks).
func (m *CPU) Region() []byte { return m.region }

// Slot is slot s's bytes.
func (m *CPU) Slot(s int32) []byte {
	bb := m.cfg.BlockBytes()
	return m.region[int64(s)*bb : int64(s+1)*bb]
}

func grow(b []float32, n int) []float32 {
	if cap(b) < n {
		return make([]float32, n)
	}
	return b[:n]
}

// Forward runs the plan over tokens (the whole sequence): it computes the
// positions p.Compute lists, writing their KV into their blocks, and returns
// the logits of the last position (valid until the next call) and their
// argmax, the greedy next token.
func (m *CPU) Forward(tokens []int32, p Plan) (logits []float32, next int32, err error) {
	c := m.cfg
	if err := c.Check(tokens, p, m.numSlots); err != nil {
		return nil, 0, err
	}
	n, nc, h := len(tokens), len(p.Compute), c.Hidden
	half := c.HeadDim / 2
	if len(m.cos) < n*half {
		m.cos, m.sin = RopeTables(c, max(n, 2*len(m.cos)/half))
	}
	m.x = grow(m.x, nc*h)
	m.xn = grow(m.xn, nc*h)
	m.qkv = grow(m.qkv, nc*c.QKVWidth())
	m.q = grow(m.q, nc*c.QHeads*c.HeadDim)
	m.att = grow(m.att, nc*c.QHeads*c.HeadDim)
	m.gu = grow(m.gu, nc*2*c.Intermediate)
	m.act = grow(m.act, nc*c.Intermediate)
	m.scores = grow(m.scores, n)

	for i, pos := range p.Compute {
		tok := int(tokens[pos])
		copy(m.x[i*h:(i+1)*h], m.embed[tok*h:(tok+1)*h])
	}
	for l := range c.Layers {
		if p.Ready != nil {
			if err := p.Ready(l); err != nil {
				return nil, 0, fmt.Errorf("model: forward: layer %d not ready: %w", l, err)
			}
		}
		w := &m.layers[l]
		rmsNorm(m.xn, m.x, w[AttnNorm], nc, h, c.NormEps)
		linear(m.qkv, m.xn, w[QKV], nc, h, c.QKVWidth(), false)
		m.ropeAndStore(l, p)
		m.attention(l, p)
		linear(m.x, m.att, w[Out], nc, c.QHeads*c.HeadDim, h, true)
		rmsNorm(m.xn, m.x, w[MLPNorm], nc, h, c.NormEps)
		linear(m.gu, m.xn, w[GateUp], nc, h, 2*c.Intermediate, false)
		for i := range nc {
			g := m.gu[i*2*c.Intermediate:]
			for j := range c.Intermediate {
				gv, uv := g[j], g[c.Intermediate+j]
				m.act[i*c.Intermediate+j] = roundBF16(gv / (1 + float32(math.Exp(float64(-gv)))) * uv)
			}
		}
		linear(m.x, m.act, w[Down], nc, c.Intermediate, h, true)
	}
	last := m.x[(nc-1)*h : nc*h]
	rmsNorm(m.xn[:h], last, m.final, 1, h, c.NormEps)
	for v := range c.Vocab {
		m.logits[v] = dot(m.xn[:h], m.lmHead[v*h:(v+1)*h])
	}
	return m.logits, Argmax(m.logits), nil
}

// Argmax is the index of the largest value, the first one on ties.
func Argmax(v []float32) int32 {
	best := 0
	for i, x := range v {
		if x > v[best] {
			best = i
		}
	}
	return int32(best)
}

// dot is the reference's inner loop. It is pure arithmetic on memory its
// caller owns, so it is left out of the race detector's instrumentation
// (go:norace), which made race-enabled tests tens of times slower.
//
//go:norace
func dot(a, b []float32) float32 {
	var s float32
	for i, x := range a {
		s += x * b[i]
	}
	return s
}

// rmsNorm writes bf16(x / rms(x) * w) for n rows of width h.
func rmsNorm(dst, x, w []float32, n, h int, eps float32) {
	for i := range n {
		row := x[i*h : (i+1)*h]
		var ss float32
		for _, v := range row {
			ss += v * v
		}
		r := float32(1 / math.Sqrt(float64(ss/float32(h)+eps)))
		for j, v := range row {
			dst[i*h+j] = roundBF16(v * r * w[j])
		}
	}
}

// linear computes x[n][in] · w[out][in]ᵀ: added to dst in float32 when
// accumulate (the residual), else stored rounded to bf16.
func linear(dst, x, w []float32, n, in, out int, accumulate bool) {
	for i := range n {
		xr := x[i*in : (i+1)*in]
		for o := range out {
			s := dot(xr, w[o*in:(o+1)*in])
			if accumulate {
				dst[i*out+o] += s
			} else {
				dst[i*out+o] = roundBF16(s)
			}
		}
	}
}

// kvAt is the region offset of (layer, part, position, KV head).
func (m *CPU) kvAt(p Plan, layer, part, pos, head int) int64 {
	c := m.cfg
	slot := int64(p.Slots[pos/c.BlockTokens])
	return slot*c.BlockBytes() + c.KVOffset(layer, part, pos%c.BlockTokens, head)
}

// ropeAndStore rotates the computed tokens' q and k (rotate-half form),
// keeps q in m.q and writes k and v into their blocks as bf16.
func (m *CPU) ropeAndStore(layer int, p Plan) {
	c := m.cfg
	d, half, qw := c.HeadDim, c.HeadDim/2, c.QHeads*c.HeadDim
	rot := func(dst []float32, src []float32, pos int) {
		cs, sn := m.cos[pos*half:(pos+1)*half], m.sin[pos*half:(pos+1)*half]
		for j := range half {
			a, b := src[j], src[j+half]
			dst[j] = roundBF16(a*cs[j] - b*sn[j])
			dst[j+half] = roundBF16(b*cs[j] + a*sn[j])
		}
	}
	var k [256]float32
	for i, pos32 := range p.Compute {
		pos := int(pos32)
		row := m.qkv[i*c.QKVWidth() : (i+1)*c.QKVWidth()]
		for hd := range c.QHeads {
			rot(m.q[i*qw+hd*d:i*qw+(hd+1)*d], row[hd*d:(hd+1)*d], pos)
		}
		for g := range c.KVHeads {
			kk := k[:d]
			rot(kk, row[qw+g*d:qw+(g+1)*d], pos)
			putBF16s(m.region[m.kvAt(p, layer, 0, pos, g):], kk)
			putBF16s(m.region[m.kvAt(p, layer, 1, pos, g):], row[qw+(c.KVHeads+g)*d:qw+(c.KVHeads+g+1)*d])
		}
	}
}

func putBF16s(dst []byte, v []float32) {
	for j, f := range v {
		binary.LittleEndian.PutUint16(dst[2*j:], uint16(ToBF16(f)))
	}
}

func bf16At(b []byte, j int) float32 {
	return BF16(binary.LittleEndian.Uint16(b[2*j:])).Float32()
}

// dotBF16 is q · k for k stored as bf16 bytes (go:norace as dot).
//
//go:norace
func dotBF16(q []float32, k []byte) float32 {
	var acc float32
	for j, qv := range q {
		acc += qv * bf16At(k, j)
	}
	return acc
}

// axpyBF16 adds a·v to out for v stored as bf16 bytes (go:norace as dot).
//
//go:norace
func axpyBF16(out []float32, a float32, v []byte) {
	for j := range out {
		out[j] += a * bf16At(v, j)
	}
}

// attention: each computed token's query heads over positions [0, pos],
// K and V read from the blocks; probabilities and output rounded to bf16
// as the GPU stores them.
func (m *CPU) attention(layer int, p Plan) {
	c := m.cfg
	d, qw, group := c.HeadDim, c.QHeads*c.HeadDim, c.QHeads/c.KVHeads
	scale := float32(1 / math.Sqrt(float64(d)))
	for i, pos32 := range p.Compute {
		pos := int(pos32)
		for hd := range c.QHeads {
			g := hd / group
			q := m.q[i*qw+hd*d : i*qw+(hd+1)*d]
			s := m.scores[:pos+1]
			mx := float32(math.Inf(-1))
			for t := range s {
				s[t] = dotBF16(q, m.region[m.kvAt(p, layer, 0, t, g):]) * scale
				mx = max(mx, s[t])
			}
			var sum float32
			for t, v := range s {
				s[t] = float32(math.Exp(float64(v - mx)))
				sum += s[t]
			}
			out := m.att[i*qw+hd*d : i*qw+(hd+1)*d]
			clear(out)
			for t, v := range s {
				axpyBF16(out, roundBF16(v/sum), m.region[m.kvAt(p, layer, 1, t, g):])
			}
			for j := range out {
				out[j] = roundBF16(out[j])
			}
		}
	}
}
