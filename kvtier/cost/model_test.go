package cost

import (
	"errors"
	"math"
	"strings"
	"testing"
)

// TestSeedExercise2KVBytes is the seed chapter's exercise 2: a 70B model of
// 80 layers, 8 KV heads, head dim 128, bf16 keeps 327,680 bytes per token,
// and 32K tokens is 10 GiB.
func TestSeedExercise2KVBytes(t *testing.T) {
	m := Model{Name: "70b", Layers: 80, QHeads: 64, KVHeads: 8, HeadDim: 128, Dtype: BF16, TotalParams: 70e9, ActiveParams: 70e9}
	if err := m.Validate(); err != nil {
		t.Fatal(err)
	}
	if got := m.KVBytesPerToken(); got != 327680 {
		t.Fatalf("KV bytes per token = %d, want 327,680", got)
	}
	if got := float64(m.KVBytesPerToken()*32768) / (1 << 30); got != 10 {
		t.Fatalf("32K tokens = %g GiB, want 10", got)
	}
	if got := m.KVBytesPerBlock(16); got != 16*327680 {
		t.Fatalf("KV bytes per 16-token block = %d", got)
	}
}

// TestPresetKVBytes checks each preset's KV bytes per token against the
// arithmetic on its config.json, done by hand here.
func TestPresetKVBytes(t *testing.T) {
	want := map[string]int64{
		"llama-3.1-8b":   32 * 2 * 8 * 128 * 2,  // 131,072
		"llama-3.2-1b":   16 * 2 * 8 * 64 * 2,   // 32,768
		"llama-3.1-70b":  80 * 2 * 8 * 128 * 2,  // 327,680
		"llama-3.1-405b": 126 * 2 * 8 * 128 * 2, // 516,096
		"qwen2.5-7b":     28 * 2 * 4 * 128 * 2,  // 57,344
		"qwen2.5-72b":    80 * 2 * 8 * 128 * 2,  // 327,680
		"mixtral-8x7b":   32 * 2 * 8 * 128 * 2,  // 131,072
		"deepseek-v3":    61 * (512 + 64) * 2,   // 70,272: latent + rope key
	}
	if len(want) != len(ModelNames()) {
		t.Fatalf("presets %v, test covers %d", ModelNames(), len(want))
	}
	for name, w := range want {
		m, err := LookupModel(name)
		if err != nil {
			t.Fatal(err)
		}
		if err := m.Validate(); err != nil {
			t.Errorf("%s: %v", name, err)
		}
		if got := m.KVBytesPerToken(); got != w {
			t.Errorf("%s: KV bytes per token %d, want %d", name, got, w)
		}
		if m.Name != name {
			t.Errorf("%s: Name %q", name, m.Name)
		}
	}
}

// llamaParams counts a Llama/Qwen/Mixtral-style decoder's weights from its
// config.json: untied embedding and head, attention, SwiGLU experts.
func llamaParams(vocab, hidden, layers, qHeads, kvHeads, headDim, inter, experts, activeExperts int, qkvBias bool) (total, active float64) {
	attn := float64(hidden*qHeads*headDim*2 + hidden*kvHeads*headDim*2)
	if qkvBias {
		attn += float64(qHeads*headDim + 2*kvHeads*headDim)
	}
	expert := float64(3 * hidden * inter)
	router := 0.0
	if experts > 1 {
		router = float64(hidden * experts)
	}
	norms := float64(2 * hidden)
	embed := float64(2*vocab*hidden + hidden)
	total = embed + float64(layers)*(attn+float64(experts)*expert+router+norms)
	active = embed + float64(layers)*(attn+float64(activeExperts)*expert+router+norms)
	return total, active
}

// TestPresetParams recomputes the dense and MoE presets' parameter counts
// from their config.json geometry (vocab_size, intermediate_size, experts)
// and checks the preset's published figure within 1%: a wrong layer or head
// count shows here.
func TestPresetParams(t *testing.T) {
	cases := []struct {
		name                          string
		vocab, inter, experts, active int
		bias                          bool
	}{
		{"llama-3.1-8b", 128256, 14336, 1, 1, false},
		{"llama-3.1-70b", 128256, 28672, 1, 1, false},
		{"llama-3.1-405b", 128256, 53248, 1, 1, false},
		{"qwen2.5-7b", 152064, 18944, 1, 1, true},
		{"qwen2.5-72b", 152064, 29568, 1, 1, true},
		{"mixtral-8x7b", 32000, 14336, 8, 2, false},
	}
	for _, c := range cases {
		m, err := LookupModel(c.name)
		if err != nil {
			t.Fatal(err)
		}
		if m.HiddenSize != m.QHeads*m.HeadDim {
			t.Errorf("%s: hidden %d != heads %d × head dim %d", c.name, m.HiddenSize, m.QHeads, m.HeadDim)
		}
		total, active := llamaParams(c.vocab, m.HiddenSize, m.Layers, m.QHeads, m.KVHeads, m.HeadDim, c.inter, c.experts, c.active, c.bias)
		if r := total / m.TotalParams; math.Abs(r-1) > 0.01 {
			t.Errorf("%s: config gives %.4g total params, preset %.4g", c.name, total, m.TotalParams)
		}
		if r := active / m.ActiveParams; math.Abs(r-1) > 0.01 {
			t.Errorf("%s: config gives %.4g active params, preset %.4g", c.name, active, m.ActiveParams)
		}
	}
}

func TestDeepSeekMLA(t *testing.T) {
	m, err := LookupModel("DeepSeek-V3")
	if err != nil {
		t.Fatal(err)
	}
	if !m.IsMLA() || m.Layers != 61 || m.KVLoraRank != 512 || m.QKRopeHeadDim != 64 {
		t.Fatalf("deepseek-v3 geometry: %+v", m)
	}
	// The latent is not split across tensor-parallel ranks.
	if m.KVBytesPerTokenPerRank(8) != m.KVBytesPerToken() {
		t.Fatal("MLA latent must be whole on every rank")
	}
	// Attention: QKᵀ over 128+64 dims, A·V over 128, 128 heads, 61 layers.
	if got, want := m.attentionFLOPsPerPair(), 2.0*61*128*(192+128); got != want {
		t.Fatalf("attention FLOPs per pair %g, want %g", got, want)
	}
	if m.ActiveParams >= m.TotalParams/10 {
		t.Fatal("deepseek-v3 active params should be 37B of 671B")
	}
}

func TestKVPerRank(t *testing.T) {
	m, _ := LookupModel("llama-3.1-70b")
	if got := m.KVBytesPerTokenPerRank(8); got != 327680/8 {
		t.Errorf("tp 8: %d", got)
	}
	if got := m.KVBytesPerTokenPerRank(16); got != 327680/8 {
		t.Errorf("tp 16 replicates the 8 heads: %d", got)
	}
	if got := m.KVBytesPerTokenPerRank(3); got != 80*2*3*128*2 {
		t.Errorf("tp 3: ceil(8/3) = 3 heads per rank: %d", got)
	}
}

func TestModelValidateNamesField(t *testing.T) {
	good, _ := LookupModel("llama-3.1-8b")
	cases := []struct {
		field string
		edit  func(*Model)
	}{
		{"layers", func(m *Model) { m.Layers = 0 }},
		{"layers", func(m *Model) { m.Layers = 100000 }},
		{"q_heads", func(m *Model) { m.QHeads = -1 }},
		{"kv_heads", func(m *Model) { m.KVHeads = 0 }},
		{"kv_heads", func(m *Model) { m.KVHeads = 64 }},
		{"kv_heads", func(m *Model) { m.KVHeads = 5 }},
		{"head_dim", func(m *Model) { m.HeadDim = 0 }},
		{"hidden_size", func(m *Model) { m.HiddenSize = -5 }},
		{"total_params", func(m *Model) { m.TotalParams = 0 }},
		{"total_params", func(m *Model) { m.TotalParams = math.NaN() }},
		{"total_params", func(m *Model) { m.TotalParams = 1e20 }},
		{"active_params", func(m *Model) { m.ActiveParams = 2 * m.TotalParams }},
		{"active_params", func(m *Model) { m.ActiveParams = -1 }},
		{"dtype", func(m *Model) { m.Dtype = NumDtypes }},
		{"kv_lora_rank", func(m *Model) { m.KVLoraRank = -3 }},
		{"qk_nope_head_dim", func(m *Model) { m.KVLoraRank = 512 }},
	}
	for _, c := range cases {
		m := good
		c.edit(&m)
		err := m.Validate()
		var fe *FieldError
		if !errors.As(err, &fe) || fe.Field != c.field {
			t.Errorf("want FieldError on %s, got %v", c.field, err)
		}
	}
}

func TestLookupUnknownListsKnown(t *testing.T) {
	_, err := LookupModel("gpt-5")
	if !errors.Is(err, ErrUnknownName) || !strings.Contains(err.Error(), "llama-3.1-70b") || !strings.Contains(err.Error(), "deepseek-v3") {
		t.Fatalf("unknown model error: %v", err)
	}
	_, err = LookupGPU("a100")
	if !errors.Is(err, ErrUnknownName) || !strings.Contains(err.Error(), "h200") {
		t.Fatalf("unknown gpu error: %v", err)
	}
	_, err = LookupLink("pcie3")
	if !errors.Is(err, ErrUnknownName) || !strings.Contains(err.Error(), "pcie5-pinned") {
		t.Fatalf("unknown link error: %v", err)
	}
	if _, err := ParseDtype("int4"); !errors.Is(err, ErrUnknownName) {
		t.Fatalf("unknown dtype: %v", err)
	}
	for _, name := range []string{"bf16", "FP16", "fp8", "fp32"} {
		if _, err := ParseDtype(name); err != nil {
			t.Error(err)
		}
	}
}
