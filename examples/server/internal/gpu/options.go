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
