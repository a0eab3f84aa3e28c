package gpu

import (
	"fmt"
	"math/bits"
)

// Options bound what one Model can do; its scratch memory is sized by them
// at New.
type Options struct {
	// MaxTokens is the most positions one Forward computes, e.g. 32768 for
	// a 32K prefill (the MLP's scratch alone is MaxTokens × 2 ×
	// Intermediate bf16 values: 1.9 GB for llama-3.1-8b).
	MaxTokens int
	// MaxContext is the longest sequence, e.g. 33280 for 512 tokens after
	// a 32K prefix.
	MaxContext int
	// ScoreBytes bounds the attention scores of one query chunk (fp32
	// scores plus bf16 probabilities); 0 means 4 GiB. Larger chunks mean
	// fewer, larger products but more masked work above the diagonal.
	ScoreBytes int64
	// FusedMinTokens: a pass that computes at least this many positions
	// uses the fused attention kernel (kvm_flash_*: tensor-core products
	// with an online softmax, no scores in memory); shorter ones (decode
	// steps) use cuBLAS products per query chunk, which spread a few
	// queries over the whole GPU. 0 means 64; 1 sends every pass to the
	// fused kernel.
	FusedMinTokens int
	// ExactRows runs the linear layers' products at exactly the rows a
	// pass computes. By default a pass's products run at RowBucket(rows):
	// cuBLAS then sees a few dozen shapes, which WarmUp runs once at
	// start, instead of a new one for nearly every request, whose first
	// pass costs more (kernels loaded, a heuristic consulted: 54 ms
	// against 15 for a 7-token pass on the H200, benchmarks/serve/shapes.sh).
	ExactRows bool
	// Attention picks the fused kernel's implementation; the zero value,
	// AttentionAuto, takes the fastest the device runs.
	Attention Attention
	// StageTimes records a CUDA event between the stages of each pass
	// (norms, products, rotary, gather, attention, ...): Stages returns
	// what the device spent in each since the last call. The events cost
	// a few microseconds a stage; leave it off when serving.
	StageTimes bool
}

// StageTime is what the device spent in one stage of the passes
// (Options.StageTimes), summed over layers and passes.
type StageTime struct {
	Name    string
	Seconds float64
}

// Attention is the fused attention kernel a Model runs for passes of
// Options.FusedMinTokens rows or more.
type Attention int

const (
	// AttentionAuto: AttentionWGMMA where it runs (compute capability
	// 9.x, head dim 128, a driver that loads its PTX), else AttentionMMA.
	AttentionAuto Attention = iota
	// AttentionMMA: kernels/model.cu's kvm_flash_d64/d128, mma.sync
	// (sm_80) tensor-core products; any GPU of compute capability 8.0 or
	// later.
	AttentionMMA
	// AttentionWGMMA: kernels/hopper.cu's kvm_flash_h128, warpgroup
	// (wgmma) products for Hopper; New fails on another GPU or head dim.
	AttentionWGMMA
	numAttention
)

func (a Attention) String() string {
	switch a {
	case AttentionAuto:
		return "auto"
	case AttentionMMA:
		return "mma"
	case AttentionWGMMA:
		return "wgmma"
	}
	return fmt.Sprintf("Attention(%d)", int(a))
}

// ParseAttention is the Attention a String names.
func ParseAttention(s string) (Attention, error) {
	for a := range numAttention {
		if a.String() == s {
			return a, nil
		}
	}
	return 0, fmt.Errorf("gpu: attention kernel %q: want auto, mma or wgmma", s)
}

func (o Options) withDefaults() (Options, error) {
	if o.MaxTokens <= 0 || o.MaxContext <= 0 {
		return o, fmt.Errorf("gpu: Options.MaxTokens (%d) and MaxContext (%d) must be positive", o.MaxTokens, o.MaxContext)
	}
	if o.MaxTokens > o.MaxContext {
		return o, fmt.Errorf("gpu: Options.MaxTokens %d exceeds MaxContext %d", o.MaxTokens, o.MaxContext)
	}
	if o.ScoreBytes == 0 {
		o.ScoreBytes = 4 << 30
	}
	if o.FusedMinTokens == 0 {
		o.FusedMinTokens = 64
	}
	if o.FusedMinTokens < 0 {
		return o, fmt.Errorf("gpu: Options.FusedMinTokens must not be negative, got %d", o.FusedMinTokens)
	}
	if o.Attention < 0 || o.Attention >= numAttention {
		return o, fmt.Errorf("gpu: Options.Attention %d: want AttentionAuto, AttentionMMA or AttentionWGMMA", int(o.Attention))
	}
	if o.ScoreBytes < 0 {
		return o, fmt.Errorf("gpu: Options.ScoreBytes must not be negative, got %d", o.ScoreBytes)
	}
	return o, nil
}

// maxChunk is the most queries per attention chunk: 1024, or fewer when
// their scores would pass ScoreBytes; at least 1.
func (o Options) maxChunk(qHeads int) int {
	per := int64(qHeads) * int64(o.keyCap()) * 6
	return int(max(1, min(int64(min(1024, o.MaxTokens)), o.ScoreBytes/per)))
}

// RowBucket is the row count the linear layers' products run at for a
// pass of n rows (Options.ExactRows unset): 1 for a decode step's single
// row, a multiple of 16 up to 128, and above that eight buckets per
// doubling (n rounded up to a multiple of 2^(⌊log₂(n-1)⌋-3)), so that the
// padding is at most 1/8 of the rows. On the H200 a pass of up to about
// 128 rows of an 8B model reads its weights for longer than it computes,
// so padding it costs little; above, the padding's compute is paid, 6% on
// average.
func RowBucket(n int) int {
	switch {
	case n <= 1:
		return n
	case n <= 128:
		return (n + 15) &^ 15
	}
	step := 1 << (bits.Len(uint(n-1)) - 4)
	return (n + step - 1) &^ (step - 1)
}

// RowBuckets lists the buckets of passes of 1 to maxRows rows, ascending.
func RowBuckets(maxRows int) []int {
	var out []int
	for n := 1; n <= maxRows; n = RowBucket(n) + 1 {
		out = append(out, RowBucket(n))
	}
	return out
}

// keyCap is the capacity in positions of the gathered K and V (and of a
// row of attention scores): MaxContext rounded up to a multiple of 64, so
// that keys(n) fits.
func (o Options) keyCap() int { return (o.MaxContext + 63) &^ 63 }

// keys is the key count the attention products (decode steps, passes of
// fewer than FusedMinTokens rows) run at for n keys present: n rounded up
// to a multiple of 64 (n itself with ExactRows). The scores of the padding
// keys are computed from whatever the K scratch holds there and given
// probability 0 (kvm_softmax masks past each row's position), so they
// change no output; the products keep aligned leading dimensions and
// MaxContext/64 shapes.
func (o Options) keys(n int) int {
	if o.ExactRows {
		return n
	}
	return (n + 63) &^ 63
}

// rows is the products' row count for a pass of n rows.
func (o Options) rows(n int) int {
	if o.ExactRows {
		return n
	}
	return RowBucket(n)
}

// attentionWarmUps lists the passes WarmUp runs, after the buckets, for the
// attention products (decode steps and passes of fewer than FusedMinTokens
// rows), whose shapes follow the keys present (Options.keys): (keys, rows)
// for keys 128, 256, ... up to maxKeys and rows 1, 8, 16, 32 and FusedMinTokens-1,
// those under FusedMinTokens. cuBLAS picks among a few kernels by size;
// these passes load the ones a server meets.
func (o Options) attentionWarmUps(maxKeys int) [][2]int {
	var out [][2]int
	for keys := 128; keys <= maxKeys; keys *= 2 {
		last := 0
		for _, r := range []int{1, 8, 16, 32, o.FusedMinTokens - 1} {
			if r <= last || r >= o.FusedMinTokens || r >= keys {
				continue
			}
			out = append(out, [2]int{keys, r})
			last = r
		}
	}
	return out
}
