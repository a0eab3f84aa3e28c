package main

import (
	"fmt"
	"io"
	"strings"

	"kvtier.dev/kvtier/cost"
)

// calcCodecFlag is --codec's help.
func calcCodecFlag() string {
	return "the tier holds compressed blocks: " + strings.Join(cost.CodecNames(), ", ") +
		" (or none); the report puts the reload and the break-even with it beside those without"
}

// calcLookupCodec is --codec's codec; "" and "none" are the zero Codec.
func calcLookupCodec(name string) (cost.Codec, error) {
	if name == "" || strings.EqualFold(name, "none") {
		return cost.Codec{}, nil
	}
	c, err := cost.LookupCodec(name)
	if err != nil {
		return cost.Codec{}, fmt.Errorf("--codec %s: %w", name, err)
	}
	return c, nil
}

// compressed is the scenario with the tier holding cfg.codec's blocks.
func (cfg *calcConfig) compressed() cost.Scenario {
	s := cfg.scenario
	s.Path.Codec = cfg.codec
	s.BlockTokens = cfg.blockTokens
	return s
}

// checkCodec validates the compressed scenario: a model the codec cannot
// read is an error naming --codec.
func (cfg *calcConfig) checkCodec() error {
	if !cfg.codec.Enabled() {
		return nil
	}
	s := cfg.compressed()
	if err := s.Validate(); err != nil {
		return fmt.Errorf("--codec %s: %w", cfg.codec.Name, err)
	}
	return nil
}

// calcCodec is the report's side with compression (JSON "codec"), the
// figures without it being the report's own.
type calcCodec struct {
	Name                  string  `json:"name"`
	Source                string  `json:"source"`
	Path                  string  `json:"path"`
	EncodedBytesPerBlock  int64   `json:"encoded_bytes_per_block"`
	EncodeSecondsPerBlock float64 `json:"encode_seconds_per_block"`
	DecodeSecondsPerBlock float64 `json:"decode_seconds_per_block"`
	WireBytesPerGPU       int64   `json:"wire_bytes_per_gpu"`
	ReloadSeconds         float64 `json:"reload_seconds"`
	Decision              string  `json:"decision"`
	SplitRecomputeTokens  int     `json:"split_recompute_tokens"`
	SplitLoadTokens       int     `json:"split_load_tokens"`
	SplitSeconds          float64 `json:"split_seconds"`
	BreakEvenTokens       *int    `json:"break_even_tokens"`        // with attention; null: reload never wins
	BreakEvenLinearTokens *int    `json:"break_even_linear_tokens"` // linear-only recompute
}

// calcCodecReport prices cfg's request with the tier compressed.
func calcCodecReport(cfg calcConfig) (*calcCodec, error) {
	s := cfg.compressed()
	d, err := s.Decide(cfg.tokens, cfg.prefix)
	if err != nil {
		return nil, err
	}
	c := &s.Path.Codec
	raw := s.Model.KVBytesPerBlock(cfg.blockTokens)
	r := &calcCodec{Name: c.Name, Source: c.Source, Path: s.Path.Name(),
		EncodedBytesPerBlock:  c.EncodedBlockBytes(&s.Model, cfg.blockTokens, 1),
		EncodeSecondsPerBlock: c.EncodeTime(raw).Seconds(), DecodeSecondsPerBlock: c.DecodeTime(raw).Seconds(),
		WireBytesPerGPU: s.WireBytes(cfg.tokens), ReloadSeconds: d.Reload.Seconds(), Decision: d.Choice.String(),
		SplitRecomputeTokens: d.Split.RecomputeTokens, SplitLoadTokens: d.Split.LoadTokens, SplitSeconds: d.Split.Time.Seconds(),
	}
	if n, ok := s.BreakEven(true); ok {
		r.BreakEvenTokens = &n
	}
	if n, ok := s.BreakEven(false); ok {
		r.BreakEvenLinearTokens = &n
	}
	return r, nil
}

// calcPrintCodec prints the request without and with compression side by
// side.
func calcPrintCodec(w io.Writer, r *calcReport) {
	c := r.Codec
	fmt.Fprintf(w, "\ncompressed %s: %s bytes/block of %d tokens (%.3f of %s); on the GPU, encode %s and decode %s a block\n",
		c.Name, calcInt(c.EncodedBytesPerBlock), r.BlockTokens, float64(c.EncodedBytesPerBlock)/float64(r.KVBytesPerBlock),
		calcInt(r.KVBytesPerBlock), calcDur(c.EncodeSecondsPerBlock), calcDur(c.DecodeSecondsPerBlock))
	fmt.Fprintf(w, "  %-38s %16s %18s\n", "", "without", "with "+c.Name)
	row := func(name, without, with string) { fmt.Fprintf(w, "  %-38s %16s %18s\n", name, without, with) }
	row("bytes on the path per GPU", calcInt(r.KVBytesPerGPU), calcInt(c.WireBytesPerGPU))
	row("reload", calcDur(r.ReloadSeconds), calcDur(c.ReloadSeconds))
	row("decision", r.Decision, c.Decision)
	row("best split", calcDur(r.SplitSeconds), calcDur(c.SplitSeconds))
	row("break-even (recompute with attention)", calcTokensOrNever(r.BreakEvenTokens), calcTokensOrNever(c.BreakEvenTokens))
	row("break-even (linear only)", calcTokensOrNever(r.BreakEvenLinearTokens), calcTokensOrNever(c.BreakEvenLinearTokens))
}
