package trace

import (
	"fmt"
	"time"
)

// Format is a trace's line format.
type Format uint8

const (
	// FormatAuto tells the format from the first line that is not blank: a
	// line with hash_ids or timestamp is Mooncake, one with arrival_us is
	// native.
	FormatAuto Format = iota
	// FormatMooncake is the Mooncake FAST'25 trace format.
	FormatMooncake
	// FormatNative is kvtier's own format.
	FormatNative
	NumFormats
)

func (f Format) String() string {
	switch f {
	case FormatAuto:
		return "auto"
	case FormatMooncake:
		return "mooncake"
	case FormatNative:
		return "native"
	}
	return fmt.Sprintf("Format(%d)", uint8(f))
}

// ParseFormat returns the Format named s ("auto", "mooncake" or "native").
func ParseFormat(s string) (Format, error) {
	for f := FormatAuto; f < NumFormats; f++ {
		if f.String() == s {
			return f, nil
		}
	}
	return 0, fmt.Errorf("trace: unknown format %q (known: auto, mooncake, native)", s)
}

// MooncakeBlockTokens is the block size of the Mooncake traces: each hash id
// stands for 512 tokens.
const MooncakeBlockTokens = 512

// MaxBlockTokens is the most tokens per block a trace may have: the block
// manager's limit (kvtier.MaxBlockTokens), so that a trace the reader
// accepts can be replayed.
const MaxBlockTokens = 1 << 16

// Request is one request of a trace.
//
// A Reader reuses the Keys and Tokens of the Request it fills: they are
// valid until the next call to Next with the same Request. Copy them to keep
// them.
type Request struct {
	// Arrival is the request's arrival, from the start of the trace.
	Arrival time.Duration
	// Salt separates tenants, models and adapters: blocks with equal keys
	// but different salts are different blocks. Mooncake traces have none (0).
	Salt uint64
	// InputTokens is the prompt's length in tokens.
	InputTokens int
	// OutputTokens is how many tokens the request decodes.
	OutputTokens int
	// BlockTokens is how many tokens each key stands for (512 in Mooncake
	// traces). The last block may be partial.
	BlockTokens int
	// Keys are the prompt's prefix-chained block keys, one per block of
	// BlockTokens tokens, the trailing partial block included:
	// len(Keys) == ceil(InputTokens / BlockTokens). Two requests with equal
	// salt and equal Keys[i] have identical prompts up to the end of block i.
	Keys []uint64
	// Tokens are the prompt's token ids when the trace gave them (native
	// format only), empty otherwise; Keys are then derived from them (see
	// KeyHasher).
	Tokens []int32
}

// NumBlocks returns ceil(tokens / blockTokens), the number of keys a prompt
// of tokens tokens has.
func NumBlocks(tokens, blockTokens int) int {
	return (tokens + blockTokens - 1) / blockTokens
}
