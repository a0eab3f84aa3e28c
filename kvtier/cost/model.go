package cost

import (
	"fmt"
	"sort"
	"strings"
)

// Dtype is the element type of the KV cache.
type Dtype uint8

const (
	BF16 Dtype = iota
	FP16
	FP8
	FP32
	NumDtypes
)

var dtypeNames = [NumDtypes]string{"bf16", "fp16", "fp8", "fp32"}
var dtypeBytes = [NumDtypes]int{2, 2, 1, 4}

func (d Dtype) String() string {
	if d < NumDtypes {
		return dtypeNames[d]
	}
	return fmt.Sprintf("Dtype(%d)", uint8(d))
}

// Bytes is the size of one element.
func (d Dtype) Bytes() int {
	if d < NumDtypes {
		return dtypeBytes[d]
	}
	return 0
}

// ParseDtype reads "bf16", "fp16", "fp8" or "fp32" (case-insensitive).
func ParseDtype(s string) (Dtype, error) {
	for i, n := range dtypeNames {
		if strings.EqualFold(s, n) {
			return Dtype(i), nil
		}
	}
	return 0, fmt.Errorf("dtype %q: %w; known: %s", s, ErrUnknownName, strings.Join(dtypeNames[:], ", "))
}

// Model is the transformer geometry the cost model needs. Per layer and
// token, MHA and GQA cache a key and a value of HeadDim per KV head; MLA
// (KVLoraRank > 0) a latent of KVLoraRank and a rope key of QKRopeHeadDim.
type Model struct {
	Name       string
	Layers     int
	QHeads     int // attention (query) heads
	KVHeads    int // key/value heads; QHeads for MHA, fewer for GQA; unused for MLA
	HeadDim    int // per-head dimension of Q, K and V (MHA/GQA)
	HiddenSize int
	Dtype      Dtype
	// WeightDtype is the weights' element type (DeepSeek-V3 ships fp8).
	WeightDtype Dtype

	// MLA only; DeepSeek-V3: 512, 64, 128, 128.
	KVLoraRank    int
	QKRopeHeadDim int
	QKNopeHeadDim int
	VHeadDim      int

	// ActiveParams are the weights one token passes through (fewer than
	// TotalParams in a mixture of experts).
	TotalParams  float64
	ActiveParams float64
}

// IsMLA reports whether the model caches a compressed latent (MLA).
func (m *Model) IsMLA() bool { return m.KVLoraRank > 0 }

// KVElementsPerTokenPerLayer is what one layer caches for one token.
func (m *Model) KVElementsPerTokenPerLayer() int {
	if m.IsMLA() {
		return m.KVLoraRank + m.QKRopeHeadDim
	}
	return 2 * m.KVHeads * m.HeadDim
}

// KVBytesPerToken is one token's KV, all layers (a 70B Llama's: 80 layers
// × 2 × 8 heads × 128 × 2 bytes = 327,680).
func (m *Model) KVBytesPerToken() int64 {
	return int64(m.Layers) * int64(m.KVElementsPerTokenPerLayer()) * int64(m.Dtype.Bytes())
}

// KVBytesPerBlock is the KV cache of a block of blockTokens tokens.
func (m *Model) KVBytesPerBlock(blockTokens int) int64 {
	return m.KVBytesPerToken() * int64(blockTokens)
}

// KVBytesPerTokenPerRank is what one GPU of tp holds per token and loads
// over its own link: ceil(KVHeads/tp) heads, or the whole MLA latent.
func (m *Model) KVBytesPerTokenPerRank(tp int) int64 {
	if tp <= 1 || m.IsMLA() {
		return m.KVBytesPerToken()
	}
	heads := (m.KVHeads + tp - 1) / tp
	return int64(m.Layers) * int64(2*heads*m.HeadDim) * int64(m.Dtype.Bytes())
}

// WeightBytesPerRank is one GPU of tp's share of the weights
// (Llama-3.1-8B in bf16: 16.1 GB at tp 1).
func (m *Model) WeightBytesPerRank(tp int) int64 {
	return int64(m.TotalParams*float64(m.WeightDtype.Bytes())) / int64(max(1, tp))
}

// qkHeadDim and vHeadDim are the per-head widths of the two attention
// products: QKᵀ and A·V.
func (m *Model) qkHeadDim() int {
	if m.IsMLA() {
		return m.QKNopeHeadDim + m.QKRopeHeadDim
	}
	return m.HeadDim
}

func (m *Model) vHeadDim() int {
	if m.IsMLA() {
		return m.VHeadDim
	}
	return m.HeadDim
}

// attentionFLOPsPerPair is the FLOPs of one query attending to one key,
// all layers and heads: QKᵀ and A·V, 2 FLOPs per multiply-add.
func (m *Model) attentionFLOPsPerPair() float64 {
	return 2 * float64(m.Layers) * float64(m.QHeads) * float64(m.qkHeadDim()+m.vHeadDim())
}

// Validate rejects an impossible or absurd geometry, naming the field.
func (m *Model) Validate() error {
	if m.Layers < 1 || m.Layers > maxLayers {
		return fieldErr("layers", m.Layers, "must be between 1 and %d", maxLayers)
	}
	if m.QHeads < 1 || m.QHeads > maxHeads {
		return fieldErr("q_heads", m.QHeads, "must be between 1 and %d", maxHeads)
	}
	if m.HiddenSize < 0 || m.HiddenSize > maxHeads*maxHeadDim {
		return fieldErr("hidden_size", m.HiddenSize, "must be between 0 (unknown) and %d", maxHeads*maxHeadDim)
	}
	if m.Dtype >= NumDtypes {
		return fieldErr("dtype", m.Dtype, "unknown dtype")
	}
	if m.IsMLA() {
		if m.KVLoraRank > maxHeadDim {
			return fieldErr("kv_lora_rank", m.KVLoraRank, "must be at most %d", maxHeadDim)
		}
		if m.QKRopeHeadDim < 0 || m.QKRopeHeadDim > maxHeadDim {
			return fieldErr("qk_rope_head_dim", m.QKRopeHeadDim, "must be between 0 and %d", maxHeadDim)
		}
		if m.QKNopeHeadDim < 1 || m.QKNopeHeadDim > maxHeadDim {
			return fieldErr("qk_nope_head_dim", m.QKNopeHeadDim, "must be between 1 and %d for an MLA model", maxHeadDim)
		}
		if m.VHeadDim < 1 || m.VHeadDim > maxHeadDim {
			return fieldErr("v_head_dim", m.VHeadDim, "must be between 1 and %d for an MLA model", maxHeadDim)
		}
	} else {
		if m.KVLoraRank < 0 {
			return fieldErr("kv_lora_rank", m.KVLoraRank, "must not be negative")
		}
		if m.KVHeads < 1 || m.KVHeads > m.QHeads {
			return fieldErr("kv_heads", m.KVHeads, "must be between 1 and q_heads (%d)", m.QHeads)
		}
		if m.QHeads%m.KVHeads != 0 {
			return fieldErr("kv_heads", m.KVHeads, "must divide q_heads (%d)", m.QHeads)
		}
		if m.HeadDim < 1 || m.HeadDim > maxHeadDim {
			return fieldErr("head_dim", m.HeadDim, "must be between 1 and %d", maxHeadDim)
		}
	}
	if !(m.TotalParams > 0) || m.TotalParams > maxParams {
		return fieldErr("total_params", m.TotalParams, "must be positive and at most %g", float64(maxParams))
	}
	if !(m.ActiveParams > 0) || m.ActiveParams > m.TotalParams {
		return fieldErr("active_params", m.ActiveParams, "must be positive and at most total_params (%g)", m.TotalParams)
	}
	return nil
}

// The presets, from each model's published config.json on Hugging Face
// (num_hidden_layers, num_attention_heads, num_key_value_heads, hidden_size,
// head_dim or hidden_size/num_attention_heads, kv_lora_rank, ...) and the
// parameter counts on its model card. Mixtral's and DeepSeek-V3's active
// counts are their papers' (12.9B of 46.7B; 37B of 671B). DeepSeek-V3's
// KV dtype is bf16, as its reference inference code caches it, though its
// weights ship in fp8.
var modelPresets = map[string]Model{
	"llama-3.1-8b": {Name: "llama-3.1-8b", Layers: 32, QHeads: 32, KVHeads: 8, HeadDim: 128, HiddenSize: 4096,
		Dtype: BF16, TotalParams: 8.03e9, ActiveParams: 8.03e9},
	"llama-3.2-1b": {Name: "llama-3.2-1b", Layers: 16, QHeads: 32, KVHeads: 8, HeadDim: 64, HiddenSize: 2048,
		Dtype: BF16, TotalParams: 1.24e9, ActiveParams: 1.24e9},
	"llama-3.1-70b": {Name: "llama-3.1-70b", Layers: 80, QHeads: 64, KVHeads: 8, HeadDim: 128, HiddenSize: 8192,
		Dtype: BF16, TotalParams: 70.6e9, ActiveParams: 70.6e9},
	"llama-3.1-405b": {Name: "llama-3.1-405b", Layers: 126, QHeads: 128, KVHeads: 8, HeadDim: 128, HiddenSize: 16384,
		Dtype: BF16, TotalParams: 405.8e9, ActiveParams: 405.8e9},
	"qwen2.5-7b": {Name: "qwen2.5-7b", Layers: 28, QHeads: 28, KVHeads: 4, HeadDim: 128, HiddenSize: 3584,
		Dtype: BF16, TotalParams: 7.61e9, ActiveParams: 7.61e9},
	"qwen2.5-72b": {Name: "qwen2.5-72b", Layers: 80, QHeads: 64, KVHeads: 8, HeadDim: 128, HiddenSize: 8192,
		Dtype: BF16, TotalParams: 72.7e9, ActiveParams: 72.7e9},
	"mixtral-8x7b": {Name: "mixtral-8x7b", Layers: 32, QHeads: 32, KVHeads: 8, HeadDim: 128, HiddenSize: 4096,
		Dtype: BF16, TotalParams: 46.7e9, ActiveParams: 12.9e9},
	"deepseek-v3": {Name: "deepseek-v3", Layers: 61, QHeads: 128, HiddenSize: 7168,
		KVLoraRank: 512, QKRopeHeadDim: 64, QKNopeHeadDim: 128, VHeadDim: 128,
		Dtype: BF16, WeightDtype: FP8, TotalParams: 671e9, ActiveParams: 37e9},
}

// ModelNames lists the model presets, sorted.
func ModelNames() []string { return sortedKeys(modelPresets) }

// LookupModel returns a copy of the named preset (case-insensitive).
func LookupModel(name string) (Model, error) {
	m, ok := modelPresets[strings.ToLower(name)]
	if !ok {
		return Model{}, fmt.Errorf("model %q: %w; known: %s", name, ErrUnknownName, strings.Join(ModelNames(), ", "))
	}
	return m, nil
}

func sortedKeys[V any](m map[string]V) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	return keys
}
