package cost

import (
	"fmt"
	"math"
	"strings"
	"time"
)

// Codec is how a tier holds its blocks when it compresses them: the
// encoded size of a block, which the cost model computes from the Model's
// shape, and the GPU kernels' rates. The zero Codec is none: the tier holds
// the bytes the GPU holds.
//
// The encoded block is, per block, a section of scales (ScaleBytes per
// (layer, K|V, KV head) group, or one group per layer for MLA's latent,
// padded to a multiple of ScaleAlign) and then ValueBytes per value. The
// FP8 e4m3 codec (kvtier/codec.FP8E4M3PerHead) is ValueBytes 1, ScaleBytes
// 4, ScaleAlign 16: a 16-token block of llama-3.1-8b is 2,048 + 1,048,576
// bytes against 2,097,152.
type Codec struct {
	Name string
	// Input is the KV dtype the codec reads and restores (bf16).
	Input Dtype
	// ValueBytes is one value's encoded size: 1 for FP8.
	ValueBytes int
	// ScaleBytes is one group's scale (4: an fp32), ScaleAlign the
	// multiple the scale section is padded to (16).
	ScaleBytes, ScaleAlign int
	// EncodeBytesPerS and DecodeBytesPerS are the kernels' rates on the
	// GPU in bytes of Input (what the GPU holds), not encoded bytes: the
	// H200 quantizes 1.18e12 and dequantizes 1.12e12 bf16 bytes a second.
	EncodeBytesPerS, DecodeBytesPerS float64
	// ChunkBlocks is how many blocks one kernel launch codes while the
	// link copies the chunk before or after it (8).
	ChunkBlocks int
	// ErrorRMS is what a round trip does to the KV: the relative RMS
	// error ||decoded − x|| / ||x|| over a block's values, what an error
	// budget (ChooseCodec) is set against. FP8 e4m3 with a scale per
	// head: 0.027 (e4m3's 3 mantissa bits; the same for Gaussian,
	// Laplace, heavy-tailed and outlier-channel values,
	// TestFP8ErrorRMSIsTheFormats).
	ErrorRMS float64
	Source   string
}

// Enabled reports whether c compresses (false for the zero Codec).
func (c *Codec) Enabled() bool { return *c != (Codec{}) }

// Validate rejects a codec that cannot price a load, naming the field
// (codec.<field>). The zero Codec is valid.
func (c *Codec) Validate() error {
	if !c.Enabled() {
		return nil
	}
	bad := func(field string, v any, format string, args ...any) error {
		return fieldErr("codec."+field, v, format, args...)
	}
	switch {
	case c.Name == "":
		return bad("name", `""`, "a codec needs a name")
	case c.Input >= NumDtypes:
		return bad("input", c.Input, "unknown dtype")
	case c.ValueBytes < 1 || c.ValueBytes >= c.Input.Bytes():
		return bad("value_bytes", c.ValueBytes, "must be at least 1 and less than the input's %d bytes (%s)", c.Input.Bytes(), c.Input)
	case c.ScaleBytes < 0 || c.ScaleBytes > 64:
		return bad("scale_bytes", c.ScaleBytes, "must be between 0 and 64")
	case c.ScaleAlign < 1 || c.ScaleAlign > 4096:
		return bad("scale_align", c.ScaleAlign, "must be between 1 and 4096")
	case !(c.EncodeBytesPerS > 0) || c.EncodeBytesPerS > maxHBMBytesS:
		return bad("encode_bytes_per_s", c.EncodeBytesPerS, "must be positive and at most %g", float64(maxHBMBytesS))
	case !(c.DecodeBytesPerS > 0) || c.DecodeBytesPerS > maxHBMBytesS:
		return bad("decode_bytes_per_s", c.DecodeBytesPerS, "must be positive and at most %g", float64(maxHBMBytesS))
	case c.ChunkBlocks < 1 || c.ChunkBlocks > 1<<16:
		return bad("chunk_blocks", c.ChunkBlocks, "must be between 1 and %d", 1<<16)
	case !(c.ErrorRMS >= 0 && c.ErrorRMS < 1):
		return bad("error_rms", c.ErrorRMS, "must be at least 0 and below 1")
	}
	return nil
}

// checkModel rejects a model whose KV the codec does not read.
func (c *Codec) checkModel(m *Model) error {
	if c.Enabled() && m.Dtype != c.Input {
		return fieldErr("dtype", m.Dtype, "codec %s encodes %s KV", c.Name, c.Input)
	}
	return nil
}

// EncodedBlockBytes is one block of tokens tokens as one GPU of tp holds
// it, encoded: ceil(KVHeads/tp) heads' scales and values (the whole
// latent for MLA, one group per layer). With the zero Codec it is the
// block's bytes as the GPU holds them.
func (c *Codec) EncodedBlockBytes(m *Model, tokens, tp int) int64 {
	raw := m.KVBytesPerTokenPerRank(tp) * int64(tokens)
	if !c.Enabled() || tokens <= 0 {
		return raw
	}
	groups := int64(m.Layers)
	if !m.IsMLA() {
		heads := m.KVHeads
		if tp > 1 {
			heads = (m.KVHeads + tp - 1) / tp
		}
		groups *= 2 * int64(heads)
	}
	align := int64(c.ScaleAlign)
	scales := (groups*int64(c.ScaleBytes) + align - 1) / align * align
	values := raw / int64(m.Dtype.Bytes())
	return scales + values*int64(c.ValueBytes)
}

// encodedBytes is tokens tokens in blocks of blockTokens, the last one
// short, as one GPU of tp holds them encoded.
func (c *Codec) encodedBytes(m *Model, tokens, blockTokens, tp int) int64 {
	full := int64(tokens / blockTokens)
	n := full * c.EncodedBlockBytes(m, blockTokens, tp)
	if rest := tokens % blockTokens; rest > 0 {
		n += c.EncodedBlockBytes(m, rest, tp)
	}
	return n
}

// EncodeTime is the GPU's time to encode rawBytes of Input (0 for the
// zero Codec).
func (c *Codec) EncodeTime(rawBytes int64) time.Duration {
	if !c.Enabled() || rawBytes <= 0 {
		return 0
	}
	return seconds(float64(rawBytes) / c.EncodeBytesPerS)
}

// DecodeTime is the GPU's time to decode back to rawBytes of Input (0 for
// the zero Codec).
func (c *Codec) DecodeTime(rawBytes int64) time.Duration {
	if !c.Enabled() || rawBytes <= 0 {
		return 0
	}
	return seconds(float64(rawBytes) / c.DecodeBytesPerS)
}

// A compressed load's time. The path carries the encoded bytes and the
// GPU decodes them in chunks of ChunkBlocks blocks, chunk i's decode
// overlapping chunk i+1's copy, as the H200 benchmark runs them
// (benchmarks/results/fp8-codec-h200.md). So loading raw bytes that are
// enc bytes encoded takes
//
//	latency + max(enc × path's seconds per byte, raw / DecodeBytesPerS) + one chunk's decode
//
// the slower of the copies and the decodes, plus the last chunk's decode,
// which nothing overlaps. When the copies are the slower (every link we
// have measured: decode at 1.12 TB/s of bf16 outruns any link carrying
// half the bytes below 560 GB/s) this is exact for a pipeline of equal
// chunks; when the decodes are, it overcounts by a chunk's copy at most.
// The decode's time on the GPU is not charged to prefill: it is about
// 1/230 of a block's recompute for llama-3.1-8b on the H200.

// codecLoadSeconds is the time to bring raw bytes (encoded: enc) over p
// and decode them, chunkRaw being the last chunk's raw bytes; without a
// codec it is p's plain transfer of raw bytes.
func (p *Path) codecLoadSeconds(raw, enc, chunkRaw int64) float64 {
	if raw <= 0 {
		return 0
	}
	c := &p.Codec
	if !c.Enabled() {
		return p.latencySeconds() + float64(raw)*p.secondsPerByte()
	}
	steady := math.Max(float64(enc)*p.secondsPerByte(), float64(raw)/c.DecodeBytesPerS)
	return p.latencySeconds() + steady + float64(chunkRaw)/c.DecodeBytesPerS
}

// fp8E4M3 is the FP8 e4m3 codec with a scale per head, as the H200 ran it.
var fp8E4M3 = Codec{
	Name: "fp8-e4m3", Input: BF16, ValueBytes: 1, ScaleBytes: 4, ScaleAlign: 16,
	EncodeBytesPerS: 1.18e12, DecodeBytesPerS: 1.12e12, ChunkBlocks: 8, ErrorRMS: 0.027,
	Source: "kvtier/codec.FP8E4M3PerHead's format; the cudacodec kernels on the project's H200 " +
		"(benchmarks/results/fp8-codec-h200.md, CuKernels medians of the kernels that code blocks where the KV cache " +
		"keeps them, 7693b5c): quantize 1.18e12, dequantize 1.12e12 bf16 bytes/s, chunks of 8 blocks",
}

var codecPresets = map[string]Codec{"fp8-e4m3": fp8E4M3}

// CodecNames lists the codec presets, sorted.
func CodecNames() []string { return sortedKeys(codecPresets) }

// LookupCodec returns a copy of the named preset (case-insensitive).
func LookupCodec(name string) (Codec, error) {
	c, ok := codecPresets[strings.ToLower(name)]
	if !ok {
		return Codec{}, fmt.Errorf("codec %q: %w; known: %s", name, ErrUnknownName, strings.Join(CodecNames(), ", "))
	}
	return c, nil
}
