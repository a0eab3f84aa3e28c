package model

import (
	"fmt"
	"math"
	"strings"

	"kvtier.dev/kvtier/cost"
)

// Config is a model's shape.
type Config struct {
	Name         string
	Layers       int
	Hidden       int // model width
	QHeads       int
	KVHeads      int // QHeads/KVHeads query heads share one KV head
	HeadDim      int
	Intermediate int // MLP width
	Vocab        int
	// RopeTheta is the rotary base (500000 for Llama 3). Plain rotary
	// embedding: Llama 3.1's long-context frequency scaling is not applied,
	// it changes no shape or cost.
	RopeTheta float64
	NormEps   float32
	// TieEmbeddings uses the embedding table as the LM head (llama-3.2-1b).
	TieEmbeddings bool
	// BlockTokens is the tokens per KV block, e.g. 16.
	BlockTokens int
}

// extra is what a preset needs beyond kvtier/cost's geometry, from each
// model's config.json (intermediate_size, vocab_size, rope_theta,
// rms_norm_eps, tie_word_embeddings). Qwen2.5's q/k/v biases are not modelled.
type extra struct {
	intermediate, vocab int
	theta               float64
	eps                 float32
	tie                 bool
}

var presetExtras = map[string]extra{
	"llama-3.1-8b": {14336, 128256, 500000, 1e-5, false},
	"llama-3.2-1b": {8192, 128256, 500000, 1e-5, true},
	"qwen2.5-7b":   {18944, 152064, 1e6, 1e-6, false},
}

// Preset is the named model's shape: attention geometry from kvtier/cost's
// preset of that name, the rest from its config.json.
func Preset(name string, blockTokens int) (Config, error) {
	x, ok := presetExtras[strings.ToLower(name)]
	if !ok {
		return Config{}, fmt.Errorf("model: preset %q: unknown; known: llama-3.1-8b, llama-3.2-1b, qwen2.5-7b, tiny", name)
	}
	m, err := cost.LookupModel(name)
	if err != nil {
		return Config{}, fmt.Errorf("model: preset %q: %w", name, err)
	}
	c := Config{Name: m.Name, Layers: m.Layers, Hidden: m.HiddenSize, QHeads: m.QHeads, KVHeads: m.KVHeads,
		HeadDim: m.HeadDim, Intermediate: x.intermediate, Vocab: x.vocab, RopeTheta: x.theta, NormEps: x.eps,
		TieEmbeddings: x.tie, BlockTokens: blockTokens}
	return c, c.Validate()
}

// Tiny is the test shape: 2 layers, width 256, 4 query heads over 2 KV
// heads of 64, MLP 512, vocabulary 512, blocks of 4 tokens.
func Tiny() Config {
	return Config{Name: "tiny", Layers: 2, Hidden: 256, QHeads: 4, KVHeads: 2, HeadDim: 64, Intermediate: 512,
		Vocab: 512, RopeTheta: 10000, NormEps: 1e-5, BlockTokens: 4}
}

// Lookup is Preset, or Tiny for "tiny".
func Lookup(name string, blockTokens int) (Config, error) {
	if strings.EqualFold(name, "tiny") {
		c := Tiny()
		if blockTokens > 0 {
			c.BlockTokens = blockTokens
		}
		return c, c.Validate()
	}
	return Preset(name, blockTokens)
}

// Validate names the first field that is impossible.
func (c Config) Validate() error {
	pos := func(name string, v int) error {
		if v <= 0 {
			return fmt.Errorf("model: config %q: %s must be positive, got %d", c.Name, name, v)
		}
		return nil
	}
	for _, f := range []struct {
		n string
		v int
	}{{"Layers", c.Layers}, {"Hidden", c.Hidden}, {"QHeads", c.QHeads}, {"KVHeads", c.KVHeads},
		{"HeadDim", c.HeadDim}, {"Intermediate", c.Intermediate}, {"Vocab", c.Vocab}, {"BlockTokens", c.BlockTokens}} {
		if err := pos(f.n, f.v); err != nil {
			return err
		}
	}
	switch {
	case c.QHeads%c.KVHeads != 0:
		return fmt.Errorf("model: config %q: QHeads %d is not a multiple of KVHeads %d", c.Name, c.QHeads, c.KVHeads)
	case c.HeadDim%2 != 0 || c.HeadDim > 256:
		return fmt.Errorf("model: config %q: HeadDim %d must be even (rotary embedding) and at most 256", c.Name, c.HeadDim)
	case !(c.RopeTheta > 1) || math.IsInf(c.RopeTheta, 0):
		return fmt.Errorf("model: config %q: RopeTheta must be above 1, got %g", c.Name, c.RopeTheta)
	case !(c.NormEps > 0):
		return fmt.Errorf("model: config %q: NormEps must be positive, got %g", c.Name, c.NormEps)
	}
	return nil
}

// QKVWidth is the fused q, k, v projection's output width.
func (c Config) QKVWidth() int { return (c.QHeads + 2*c.KVHeads) * c.HeadDim }

// PartBytes is one block's K (or V) of one layer: BlockTokens × KVHeads ×
// HeadDim bf16 values.
func (c Config) PartBytes() int64 { return int64(c.BlockTokens*c.KVHeads*c.HeadDim) * 2 }

// BlockBytes is one block over all layers, K and V.
func (c Config) BlockBytes() int64 { return int64(c.Layers) * 2 * c.PartBytes() }

// KVBytesPerToken is the KV cache of one token, all layers.
func (c Config) KVBytesPerToken() int64 { return int64(c.Layers*2*c.KVHeads*c.HeadDim) * 2 }

// KVOffset is the byte offset, inside a block's slot, of (layer, part,
// token in block, KV head).
func (c Config) KVOffset(layer, part, token, head int) int64 {
	return int64(layer*2+part)*c.PartBytes() + int64((token*c.KVHeads+head)*c.HeadDim)*2
}

// Params counts the weights.
func (c Config) Params() int64 {
	h := int64(c.Hidden)
	layer := 2*h + h*int64(c.QKVWidth()) + int64(c.QHeads*c.HeadDim)*h + 3*h*int64(c.Intermediate)
	p := int64(c.Layers)*layer + h + int64(c.Vocab)*h
	if !c.TieEmbeddings {
		p += int64(c.Vocab) * h
	}
	return p
}
