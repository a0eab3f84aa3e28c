package cost

import (
	"fmt"
	"math"
	"sort"
	"strings"
)

// PrefillFit is the fitted prefill time of any model on this GPU, per rank
// (a rate of 0: no such term; docs/cost.md says why each term):
//
//	prefill = FixedSeconds + weight bytes × RampWidth/HiddenSize / WeightBytesPerS + linear FLOPs / LinearFLOPS
//	        + FLOPs of pairs among new tokens / AttentionFLOPS + of pairs with the prefix / PrefixAttentionFLOPS
//	        + the prefix's KV bytes / PrefixReadBytesPerS
type PrefillFit struct {
	FixedSeconds         float64 `json:"fixed_seconds"`
	WeightBytesPerS      float64 `json:"weight_bytes_per_s"`
	LinearFLOPS          float64 `json:"linear_flops"`
	AttentionFLOPS       float64 `json:"attention_flops"`
	PrefixAttentionFLOPS float64 `json:"prefix_attention_flops"` // in a file without samples, 0: AttentionFLOPS
	PrefixReadBytesPerS  float64 `json:"prefix_read_bytes_per_s"`
	Samples              int     `json:"samples"`     // 0: the presets alone
	Outliers             int     `json:"outliers"`    // samples given no weight
	ErrorWidth           float64 `json:"error_width"` // typical relative error, 0.05: 5%
	// LoadSlowdown is how much slower a pass computes while its loads
	// copy into the GPU: 0.2, a fifth slower for as long as they overlap
	// (PrefillCost.LoadedSeconds); LoadSlowdownSamples, the passes with
	// loads it was learned from (0: the prior's).
	LoadSlowdown        float64 `json:"load_slowdown,omitempty"`
	LoadSlowdownSamples int     `json:"load_slowdown_samples,omitempty"`
	// AttentionWave is how many query rows × heads one wave of the
	// runtime's attention kernel holds (its rows a CTA × the GPU's SMs;
	// Calibration.SetAttentionWave), 0 if unknown. A pass computing fewer
	// rows than that over its heads still takes a whole wave over its
	// prefix: its prefix pairs are priced for its rows past
	// AttentionWave/heads only, the wave's cost being in the read term
	// (PrefillCost.PrefixFullRows).
	AttentionWave int `json:"attention_wave,omitempty"`
}

// prefixFullRows is the rows a pass of m on one of tp ranks computes
// before its prefix attention fills the GPU: wave / m's query heads on a
// rank (0 without a wave).
func prefixFullRows(m *Model, tp, wave int) float64 {
	if wave <= 0 {
		return 0
	}
	heads := (m.QHeads + max(1, tp) - 1) / max(1, tp)
	return float64(wave) / float64(heads)
}

// LinkFit is a link's fit: b bytes take LatencySeconds + b/BandwidthBytesPerS.
type LinkFit struct {
	Name               string  `json:"name"`
	BandwidthBytesPerS float64 `json:"bandwidth_bytes_per_s"`
	LatencySeconds     float64 `json:"latency_seconds"`
	Samples            int     `json:"samples"`
	Outliers           int     `json:"outliers"`
	ErrorWidth         float64 `json:"error_width"`
}

// Fit is a Calibration's figures: immutable, so a reader may keep one.
type Fit struct {
	GPU     string     `json:"gpu"`
	Prefill PrefillFit `json:"prefill"`
	Links   []LinkFit  `json:"links"` // sorted by name
	// CodecKernels are the codecs' kernels, fitted as links are (a fixed
	// cost a launch, bytes of the codec's input at a rate), named by
	// CodecKernelName; sorted by name. Fit.Codec prices loads by them.
	CodecKernels []LinkFit `json:"codec_kernels,omitempty"`
}

// RampWidth is the width at which PrefillFit.WeightBytesPerS is stated: a
// model h wide (0: RampWidth) pays its weight term × RampWidth/h.
const RampWidth = 4096

// passBytesPerRank is the weight term's feature: the weights one of tp
// ranks holds, × RampWidth/HiddenSize (PrefillFit).
func (m *Model) passBytesPerRank(tp int) float64 {
	w := float64(m.WeightBytesPerRank(tp))
	if m.HiddenSize > 0 {
		w *= RampWidth / float64(m.HiddenSize)
	}
	return w
}

// PrefillCost prices m's prefills on tp GPUs of g (the floor) under the
// fit; a nil Fit, or a new Calibration's, gives PresetPrefillCost.
func (f *Fit) PrefillCost(m *Model, g *GPU, tp int) PrefillCost {
	c := PresetPrefillCost(m, g, tp)
	if f == nil {
		return c
	}
	tp = max(1, tp)
	p := &f.Prefill
	c.PassSeconds = p.FixedSeconds
	if p.WeightBytesPerS > 0 {
		c.PassSeconds += m.passBytesPerRank(tp) / p.WeightBytesPerS
	}
	c.LinearSecondsPerToken, c.AttentionSecondsPerPair, c.PrefixSecondsPerPair = 0, 0, 0
	if p.LinearFLOPS > 0 {
		c.LinearSecondsPerToken = 2 * m.ActiveParams / (p.LinearFLOPS * float64(tp))
	}
	if p.AttentionFLOPS > 0 {
		c.AttentionSecondsPerPair = m.attentionFLOPsPerPair() / (p.AttentionFLOPS * float64(tp))
	}
	if p.PrefixAttentionFLOPS > 0 {
		c.PrefixSecondsPerPair = m.attentionFLOPsPerPair() / (p.PrefixAttentionFLOPS * float64(tp))
	}
	if p.PrefixReadBytesPerS > 0 {
		c.PrefixReadSecondsPerToken = float64(m.KVBytesPerTokenPerRank(tp)) / p.PrefixReadBytesPerS
	}
	c.LoadSlowdown = p.LoadSlowdown
	c.PrefixFullRows = prefixFullRows(m, tp, p.AttentionWave)
	return c
}

// Link returns l with the fit's figures for its name, and their width.
func (f *Fit) Link(l Link) (Link, float64) {
	if f == nil {
		return l, 0
	}
	i := sort.Search(len(f.Links), func(i int) bool { return f.Links[i].Name >= l.Name })
	if i == len(f.Links) || f.Links[i].Name != l.Name {
		return l, 0
	}
	lf := &f.Links[i]
	l.BandwidthBytesPerS, l.Latency = lf.BandwidthBytesPerS, seconds(lf.LatencySeconds)
	if lf.Samples > 0 {
		l.Source = fmt.Sprintf("calibrated from %d copies", lf.Samples)
	} else {
		l.Source = "calibration file"
	}
	return l, lf.ErrorWidth
}

// Codec returns cd with the rates its kernels were fitted at, where the fit
// has them: each kernel's rate at a launch of chunkRawBytes (a chunk of
// cd.ChunkBlocks blocks, as the GPU holds them), its fixed cost included,
// so that the cost model's pipeline of chunks (Codec) prices what a launch
// took. Kernels the fit lacks keep cd's rates.
func (f *Fit) Codec(cd Codec, chunkRawBytes int64) Codec {
	if f == nil || !cd.Enabled() {
		return cd
	}
	rate := func(encode bool, preset float64) float64 {
		name := CodecKernelName(cd.Name, encode)
		i := sort.Search(len(f.CodecKernels), func(i int) bool { return f.CodecKernels[i].Name >= name })
		if i == len(f.CodecKernels) || f.CodecKernels[i].Name != name {
			return preset
		}
		k := &f.CodecKernels[i]
		if chunkRawBytes <= 0 {
			return k.BandwidthBytesPerS
		}
		b := float64(chunkRawBytes)
		return b / (k.LatencySeconds + b/k.BandwidthBytesPerS)
	}
	enc, dec := rate(true, cd.EncodeBytesPerS), rate(false, cd.DecodeBytesPerS)
	if enc != cd.EncodeBytesPerS || dec != cd.DecodeBytesPerS {
		cd.EncodeBytesPerS, cd.DecodeBytesPerS = enc, dec
		cd.Source = fmt.Sprintf("%s's kernels as calibrated, at launches of %d bytes", cd.Name, chunkRawBytes)
	}
	return cd
}

// Describe writes the fit for a person, m on tp GPUs as the example.
func (f *Fit) Describe(m *Model, tp int) string {
	var b strings.Builder
	p := &f.Prefill
	fmt.Fprintf(&b, "prefill on %s, from %d samples (%d outliers), typical error %.1f%%:\n", f.GPU, p.Samples, p.Outliers, 100*p.ErrorWidth)
	fmt.Fprintf(&b, "  fixed cost per prefill   %.3f ms\n", p.FixedSeconds*1e3)
	if p.WeightBytesPerS > 0 {
		w := m.passBytesPerRank(tp)
		fmt.Fprintf(&b, "  weights per pass         at %.0f GB/s at width %d (%s at tp %d: %.2f ms)\n", p.WeightBytesPerS/1e9, RampWidth, m.Name, max(1, tp), w/p.WeightBytesPerS*1e3)
		if p.LinearFLOPS > 0 {
			half := w / p.WeightBytesPerS * p.LinearFLOPS * float64(max(1, tp)) / (2 * m.ActiveParams)
			fmt.Fprintf(&b, "  efficiency ramp          half of the linear rate at %.0f tokens (%s)\n", half, m.Name)
		}
	} else {
		fmt.Fprintf(&b, "  weights per pass         no term\n")
	}
	fmt.Fprintf(&b, "  linear layers            %s per GPU\n", rateText(p.LinearFLOPS))
	fmt.Fprintf(&b, "  attention                %s per GPU\n", rateText(p.AttentionFLOPS))
	fmt.Fprintf(&b, "  attention with a prefix  %s per GPU\n", rateText(p.PrefixAttentionFLOPS))
	if p.PrefixReadBytesPerS > 0 {
		fmt.Fprintf(&b, "  prefix KV read per pass  at %.0f GB/s (%s at tp %d: %.2f ms per 32K tokens present)\n", p.PrefixReadBytesPerS/1e9,
			m.Name, max(1, tp), 32768*float64(m.KVBytesPerTokenPerRank(tp))/p.PrefixReadBytesPerS*1e3)
	} else {
		fmt.Fprintf(&b, "  prefix KV read per pass  no term\n")
	}
	fmt.Fprintf(&b, "  loads in flight          the pass %.0f%% slower while they copy (from %d passes)\n", 100*p.LoadSlowdown, p.LoadSlowdownSamples)
	for _, l := range f.Links {
		fmt.Fprintf(&b, "link %s, from %d copies (%d outliers), typical error %.1f%%: %.2f GB/s, latency %.2f us\n",
			l.Name, l.Samples, l.Outliers, 100*l.ErrorWidth, l.BandwidthBytesPerS/1e9, l.LatencySeconds*1e6)
	}
	for _, k := range f.CodecKernels {
		fmt.Fprintf(&b, "codec kernel %s, from %d launches (%d outliers), typical error %.1f%%: %.0f GB/s of input, %.2f us a launch\n",
			k.Name, k.Samples, k.Outliers, 100*k.ErrorWidth, k.BandwidthBytesPerS/1e9, k.LatencySeconds*1e6)
	}
	return b.String()
}

func rateText(flops float64) string {
	if flops <= 0 || math.IsInf(flops, 0) {
		return "no term"
	}
	return fmt.Sprintf("%.0f TFLOP/s", flops/1e12)
}
