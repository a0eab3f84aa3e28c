package replay

import (
	"time"

	"kvtier.dev/kvtier/codec"
	"kvtier.dev/kvtier/cost"
	"kvtier.dev/kvtier/transfer"
)

// The tiers' codecs (Config.HostCodec, NVMeCodec, RemoteCodec): a
// compressed tier holds each block in cost.Codec.EncodedBlockBytes, so the
// same bytes hold more blocks and its copies carry fewer bytes; a copy to
// or from the GPU also takes the codec's time on the GPU, overlapped with
// the link's as the copy engine pipelines them (transfer.Config.Codec),
// and the planner prices loads so (cost.Path.Codec). Under Mover "device"
// the engine runs the codec path itself, on the simulated device.

// checkCodecs checks the codecs' names and that the tiers that exist
// share one, naming the field.
func (c *Config) checkCodecs() error {
	if _, err := c.lowerCodec(); err != nil {
		return err
	}
	return nil
}

// autoCodec is HostCodec's value that has the engine choose the codec
// (chooseCodec), as the server's -host-codec auto.
const autoCodec = "auto"

// lowerCodec is the codec the lower tiers share (zero: none; with
// HostCodec auto, none until the engine starts and chooses).
func (c *Config) lowerCodec() (cost.Codec, error) {
	if b := c.CodecErrorBudget; b != nil && !(*b >= 0 && *b < 1) {
		return cost.Codec{}, cfgErr("codec_error_budget", "%v: must be at least 0 and below 1", *b)
	}
	if c.HostCodec == autoCodec {
		for _, f := range []struct{ field, v string }{{"nvme_codec", c.NVMeCodec}, {"remote_codec", c.RemoteCodec}} {
			if f.v != "" {
				return cost.Codec{}, cfgErr(f.field, "%q with host_codec auto: the lower tiers follow the host tier's choice", f.v)
			}
		}
		return cost.Codec{}, nil
	}
	if c.CodecErrorBudget != nil {
		return cost.Codec{}, cfgErr("codec_error_budget", "without host_codec auto: only the choice weighs it")
	}
	tiers := []struct {
		field, name string
		exists      bool
	}{{"host_codec", c.HostCodec, c.HostBytes > 0}, {"nvme_codec", c.NVMeCodec, c.NVMeBytes > 0}}
	var common cost.Codec
	first := ""
	for _, t := range tiers {
		var cc cost.Codec
		if t.name != "" {
			var err error
			if cc, err = cost.LookupCodec(t.name); err != nil {
				return cc, cfgErr(t.field, "%v", err)
			}
		}
		switch {
		case !t.exists && t.name != "":
			return cc, cfgErr(t.field, "%q without that tier (its bytes are 0)", t.name)
		case !t.exists:
		case first == "":
			common, first = cc, t.field
		case cc != common:
			return cc, cfgErr(t.field, "%q, but %s is %q: tiers of different codecs are not supported yet (a move between them would transcode)",
				t.name, first, map[bool]string{true: common.Name, false: ""}[common.Enabled()])
		}
	}
	if c.RemoteCodec != "" {
		cc, err := cost.LookupCodec(c.RemoteCodec)
		if err != nil {
			return cc, cfgErr("remote_codec", "%v", err)
		}
		if cc != common {
			return cc, cfgErr("remote_codec", "%q, but the host tier's is %q: the remote tier holds the host tier's blocks as they are", c.RemoteCodec, c.HostCodec)
		}
	}
	return common, nil
}

// codecShape is a block's shape for kvtier/codec: each GPU's share of a
// block of bt tokens of m at tp.
func codecShape(m *cost.Model, bt, tp int) codec.Shape {
	if m.IsMLA() {
		return codec.Shape{Layers: m.Layers, Parts: 1, Tokens: bt, Heads: 1, HeadDim: m.KVLoraRank + m.QKRopeHeadDim}
	}
	return codec.Shape{Layers: m.Layers, Parts: 2, Tokens: bt, Heads: (m.KVHeads + tp - 1) / tp, HeadDim: m.HeadDim}
}

// codingTime is a block's coding on the GPU on a copy from one tier to
// another: its encode leaving the GPU, its decode arriving, none between
// lower tiers.
func (e *engine) codingTime(fromGPU, toGPU bool) time.Duration {
	switch {
	case fromGPU:
		return e.codec.EncodeTime(e.blockBytes)
	case toGPU:
		return e.codec.DecodeTime(e.blockBytes)
	}
	return 0
}

// checkCodecShape refuses a model whose blocks the codec cannot code.
func (e *engine) checkCodecShape() error {
	if !e.codec.Enabled() {
		return nil
	}
	field := "host_codec"
	if e.cfg.HostCodec == "" {
		field = "nvme_codec"
	}
	if _, ok := deviceCodecs[e.codec.Name]; !ok {
		return cfgErr(field, "%s has no kvtier/codec format", e.codec.Name)
	}
	if err := codecShape(&e.model, e.bt, e.cfg.TP).Validate(); err != nil {
		return cfgErr(field, "%s cannot code the blocks of %s: %v", e.codec.Name, e.model.Name, err)
	}
	return nil
}

// deviceCodecs are kvtier/codec's formats of the cost model's codecs.
var deviceCodecs = map[string]codec.Codec{"fp8-e4m3": codec.FP8E4M3PerHead}

// deviceCodec gives the device path's engine the codec path (checked by
// checkCodecShape): kvtier/codec's format for the cost model's codec,
// priced at its rates on the simulated device.
func (e *engine) deviceCodec(cfg *transfer.Config) {
	if !e.codec.Enabled() {
		return
	}
	cfg.Codec, cfg.CodecShape = deviceCodecs[e.codec.Name], codecShape(&e.model, e.bt, e.cfg.TP)
	cfg.CodecChunkBlocks = e.codec.ChunkBlocks
	cfg.GoCodecEncodeBytesPerS, cfg.GoCodecDecodeBytesPerS = e.codec.EncodeBytesPerS, e.codec.DecodeBytesPerS
}

// codecScratchBytes is the device memory the engine's codec scratch takes
// (transfer.Engine.CodecBytes), with room for the simulator's rounding of
// its two allocations.
func (e *engine) codecScratchBytes() int64 {
	if !e.codec.Enabled() {
		return 0
	}
	chunk := int64(e.codec.ChunkBlocks)
	buf := (chunk*e.blockBytes+255)&^255 + (chunk*e.stored+255)&^255
	return 2 * (int64(transfer.DefaultCodecBuffers)*buf + 256)
}

// chooseCodec is host_codec auto's choice for the host link, blocks of bt
// tokens: cost.ChooseCodec's within the budget, none without a host tier.
// It returns the reason, for the report.
func (e *engine) chooseCodec(bt int) (string, error) {
	cfg := &e.cfg
	if cfg.HostCodec != autoCodec {
		return "", nil
	}
	if cfg.HostBytes == 0 || !e.strategy.LowerTiers() {
		return "none: no lower tier", nil
	}
	budget := cost.DefaultErrorBudget
	if cfg.CodecErrorBudget != nil {
		budget = *cfg.CodecErrorBudget
	}
	choice, err := cost.ChooseCodec(cost.DirectPath(e.hostLink), e.model, bt, cfg.TP, budget)
	if err != nil {
		return "", cfgErr("host_codec", "auto: %v", err)
	}
	e.codec = choice.Codec
	return choice.Reason, nil
}
