package codec

import "fmt"

// Shape is a KV block's shape: Layers × Parts × Tokens × Heads × HeadDim
// bf16 values. For llama-3.1-8b with 16-token blocks it is {32, 2, 16, 8,
// 128}: 2 MiB as bf16.
type Shape struct {
	Layers  int // model layers, 1..1024
	Parts   int // 2 (K then V) or 1 (one tensor per layer)
	Tokens  int // tokens per block, 1..65536
	Heads   int // KV heads, 1..1024
	HeadDim int // values per head, a multiple of 16 in [16, 1024]
}

// Limits of Shape. HeadDim is a multiple of 16 so that a head's codes are
// whole 16-byte vectors for the kernels.
const (
	maxLayers  = 1024
	maxTokens  = 1 << 16
	maxHeads   = 1024
	maxHeadDim = 1024
	headDimMul = 16
	// maxBlockBytes bounds a block's bf16 bytes (16 GiB) so that every
	// size fits an int on any platform Go runs kvtier on.
	maxBlockBytes = 1 << 34
)

// Validate reports ErrShape naming the first field out of range.
func (s Shape) Validate() error {
	bad := func(field string, v int, want string) error {
		return fmt.Errorf("codec: %w: Shape.%s = %d, want %s", ErrShape, field, v, want)
	}
	switch {
	case s.Layers < 1 || s.Layers > maxLayers:
		return bad("Layers", s.Layers, fmt.Sprintf("1..%d", maxLayers))
	case s.Parts != 1 && s.Parts != 2:
		return bad("Parts", s.Parts, "1 or 2")
	case s.Tokens < 1 || s.Tokens > maxTokens:
		return bad("Tokens", s.Tokens, fmt.Sprintf("1..%d", maxTokens))
	case s.Heads < 1 || s.Heads > maxHeads:
		return bad("Heads", s.Heads, fmt.Sprintf("1..%d", maxHeads))
	case s.HeadDim < headDimMul || s.HeadDim > maxHeadDim || s.HeadDim%headDimMul != 0:
		return bad("HeadDim", s.HeadDim, fmt.Sprintf("a multiple of %d in [%d, %d]", headDimMul, headDimMul, maxHeadDim))
	}
	if b := s.values() * 2; b > maxBlockBytes {
		return fmt.Errorf("codec: %w: %+v is %d bytes as bf16, more than %d", ErrShape, s, b, int64(maxBlockBytes))
	}
	return nil
}

// values is the number of values in a block (no overflow once the fields
// are in range: at most 2^10·2·2^16·2^10·2^10 = 2^47).
func (s Shape) values() int64 {
	return int64(s.Layers) * int64(s.Parts) * int64(s.Tokens) * int64(s.Heads) * int64(s.HeadDim)
}

// groups is the number of (layer, part, head) groups, each with a scale.
func (s Shape) groups() int { return s.Layers * s.Parts * s.Heads }

// partValues is the number of values in one (layer, part).
func (s Shape) partValues() int { return s.Tokens * s.Heads * s.HeadDim }

// BlockBytes is the block's size as bf16, which is its size under None.
// The shape MUST be valid.
func (s Shape) BlockBytes() int64 { return 2 * s.values() }

// ScaleBytes is the size of an FP8E4M3PerHead block's scale section: 4
// bytes per (layer, part, head), rounded up to 16. The shape MUST be valid.
func (s Shape) ScaleBytes() int64 { return (4*int64(s.groups()) + 15) &^ 15 }

// EncodedBytes is the size of a block of shape s encoded with c: a pure
// function of the two. It reports ErrCodec or ErrShape for bad arguments.
func EncodedBytes(c Codec, s Shape) (int64, error) {
	if err := c.Check(); err != nil {
		return 0, err
	}
	if err := s.Validate(); err != nil {
		return 0, err
	}
	return encodedBytes(c, s), nil
}

func encodedBytes(c Codec, s Shape) int64 {
	if c == FP8E4M3PerHead {
		return s.ScaleBytes() + s.values()
	}
	return s.BlockBytes()
}
