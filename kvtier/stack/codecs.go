package stack

import (
	"fmt"

	"kvtier.dev/kvtier/codec"
	"kvtier.dev/kvtier/cost"
	"kvtier.dev/kvtier/transfer"
)

// Codecs says how the tiers below the GPU hold blocks: codec.None (the
// GPU's bf16 bytes, the zero value) or codec.FP8E4M3PerHead, about half
// of them, so that the same bytes hold about twice the blocks. The copy
// engines quantize blocks on the GPU before they leave it and dequantize
// them after they arrive (transfer.Config.Codec); the model never sees an
// encoded block.
//
// The tiers that exist MUST share one codec for now: a block moves
// between them as it is (host to NVMe, NVMe to host, host to remote), and
// Open refuses tiers of different codecs rather than transcode.
type Codecs struct {
	Host, NVMe, Remote codec.Codec
	// KVHeads is the KV heads of a block on one GPU (the model's KV heads
	// over the tensor-parallel degree): the codec keeps one scale per
	// layer, K or V, and head. Required when a tier compresses; with the
	// GPU layout's parts and Options.BlockTokens it gives the head size.
	// For llama-3.1-8b on one GPU: 8 (16-token parts of 32 KiB: 128
	// values a head).
	KVHeads int
}

// enabled reports whether the tiers compress (check holds them to the
// host tier's codec).
func (c *Codecs) enabled() bool { return c.Host != codec.None }

// check checks the codecs of the tiers o makes, naming the field.
func (c *Codecs) check(o *Options) error {
	fields := []struct {
		name   string
		c      codec.Codec
		exists bool
	}{{"Host", c.Host, true}, {"NVMe", c.NVMe, o.NVMeBytes > 0}, {"Remote", c.Remote, o.Remote != nil}}
	for _, f := range fields {
		if err := f.c.Check(); err != nil {
			return optionErr("Codecs."+f.name, "%v", err)
		}
	}
	for _, f := range fields[1:] {
		if !f.exists && f.c != codec.None {
			return optionErr("Codecs."+f.name, "%s without that tier (Options.NVMeBytes 0, or no Options.Remote)", f.c)
		}
		if f.exists && f.c != c.Host {
			return optionErr("Codecs."+f.name, "%s, but Options.Codecs.Host is %s: tiers of different codecs are not supported yet (a move between them would transcode); give the tiers that exist one codec",
				f.c, c.Host)
		}
	}
	if c.enabled() && c.KVHeads <= 0 {
		return optionErr("Codecs.KVHeads", "%d: a compressed tier needs the KV heads per GPU (the codec's scales are per head)", c.KVHeads)
	}
	return nil
}

// shape is a block's shape for the codec on a GPU of layout g, with
// blockTokens tokens a block.
func (c *Codecs) shape(g transfer.GPULayout, blockTokens int) (codec.Shape, error) {
	s := codec.Shape{Layers: g.Layers, Parts: g.Parts, Tokens: blockTokens, Heads: c.KVHeads}
	per := 2 * int64(blockTokens) * int64(c.KVHeads) // bytes per head value, over the part
	if g.PartBytes%per != 0 {
		return s, optionErr("Codecs.KVHeads", "%d: a part of %d bytes (GPU.PartBytes) is not %d tokens x %d heads of bf16 values", c.KVHeads, g.PartBytes, blockTokens, c.KVHeads)
	}
	s.HeadDim = int(g.PartBytes / per)
	if err := s.Validate(); err != nil {
		return s, optionErr("Codecs.KVHeads", "%d heads of %d tokens in parts of %d bytes: %v", c.KVHeads, blockTokens, g.PartBytes, err)
	}
	return s, nil
}

// engineCodec sets cfg's codec fields for a host tier of codec c and
// blocks of shape s: on a simulated device the Go codec is priced at the
// cost model's rates for it (cost.LookupCodec), so the replay and the
// server's planner see the same codec time.
func engineCodec(cfg *transfer.Config, c codec.Codec, s codec.Shape) error {
	if c == codec.None {
		return nil
	}
	cfg.Codec, cfg.CodecShape = c, s
	cc, err := CostCodec(c)
	if err != nil {
		return optionErr("Codecs.Host", "%v", err)
	}
	cfg.GoCodecEncodeBytesPerS, cfg.GoCodecDecodeBytesPerS = cc.EncodeBytesPerS, cc.DecodeBytesPerS
	cfg.CodecChunkBlocks = cc.ChunkBlocks
	return nil
}

// CostCodec is the cost model's preset for c (the zero cost.Codec for
// codec.None): its encoded size and its kernels' rates, for a planner
// whose tiers hold c's blocks (cost.Path.Codec).
func CostCodec(c codec.Codec) (cost.Codec, error) {
	if c == codec.None {
		return cost.Codec{}, nil
	}
	name, ok := costCodecNames[c]
	if !ok {
		return cost.Codec{}, fmt.Errorf("codec %s has no preset in the cost model", c)
	}
	return cost.LookupCodec(name)
}

// costCodecNames are the cost model's presets for the codecs.
var costCodecNames = map[codec.Codec]string{codec.FP8E4M3PerHead: "fp8-e4m3"}

// ParseCodec reads a tier's codec from a flag or a config file: a name of
// package codec ("none", "fp8-e4m3-per-head") or the cost model's preset
// for it ("fp8-e4m3"), or "" for none.
func ParseCodec(s string) (codec.Codec, error) {
	if s == "" {
		return codec.None, nil
	}
	for c, name := range costCodecNames {
		if s == name {
			return c, nil
		}
	}
	c, err := codec.ParseCodec(s)
	if err != nil {
		return 0, fmt.Errorf("%w (or %q)", err, costCodecNames[codec.FP8E4M3PerHead])
	}
	return c, nil
}
