package gpu

import "fmt"

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
	if o.ScoreBytes < 0 {
		return o, fmt.Errorf("gpu: Options.ScoreBytes must not be negative, got %d", o.ScoreBytes)
	}
	return o, nil
}

// maxChunk is the most queries per attention chunk: 1024, or fewer when
// their scores would pass ScoreBytes; at least 1.
func (o Options) maxChunk(qHeads int) int {
	per := int64(qHeads) * int64(o.MaxContext) * 6
	return int(max(1, min(int64(min(1024, o.MaxTokens)), o.ScoreBytes/per)))
}
