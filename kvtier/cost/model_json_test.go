package cost

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

const model70bJSON = `{"name": "my-70b", "layers": 80, "q_heads": 64, "kv_heads": 8,
 "head_dim": 128, "dtype": "bf16", "total_params": 70e9}`

func TestLoadModel(t *testing.T) {
	m, err := LoadModel(strings.NewReader(model70bJSON))
	if err != nil {
		t.Fatal(err)
	}
	if m.KVBytesPerToken() != 327680 || m.ActiveParams != 70e9 || m.Name != "my-70b" {
		t.Fatalf("loaded %+v", m)
	}
	mla, err := LoadModel(strings.NewReader(`{"layers": 61, "q_heads": 128, "kv_lora_rank": 512,
		"qk_rope_head_dim": 64, "qk_nope_head_dim": 128, "v_head_dim": 128, "dtype": "fp8",
		"total_params": 671e9, "active_params": 37e9}`))
	if err != nil {
		t.Fatal(err)
	}
	if mla.KVBytesPerToken() != 61*576 || mla.Name != "custom" {
		t.Fatalf("MLA fp8: %d bytes per token, name %q", mla.KVBytesPerToken(), mla.Name)
	}
}

func TestLoadModelFile(t *testing.T) {
	path := filepath.Join(t.TempDir(), "m.json")
	if err := os.WriteFile(path, []byte(`{"layers": 0, "q_heads": 8, "kv_heads": 8, "head_dim": 64, "total_params": 1e9}`), 0o600); err != nil {
		t.Fatal(err)
	}
	_, err := LoadModelFile(path)
	if err == nil || !strings.Contains(err.Error(), path) || !strings.Contains(err.Error(), "layers") {
		t.Fatalf("want error naming file and field, got %v", err)
	}
	if _, err := LoadModelFile(filepath.Join(t.TempDir(), "absent.json")); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("absent file: %v", err)
	}
}

func TestLoadModelRejects(t *testing.T) {
	cases := []struct{ in, mention string }{
		{`{"layers": 80, "kv_head": 8}`, `"kv_head"`},
		{`{"layers": "eighty"}`, `"layers"`},
		{`{"layers": 80.5}`, `"layers"`},
		{model70bJSON + ` {}`, "trailing"},
		{`{"layers": 80, "q_heads": 64, "kv_heads": 8, "head_dim": 128, "dtype": "int3", "total_params": 7e10}`, "dtype"},
		{`{"layers": 80, "q_heads": 64, "kv_heads": 8, "head_dim": 128, "total_params": -1}`, "total_params"},
		{`{"layers": 80, "q_heads": 64, "kv_heads": 8, "head_dim": 0, "total_params": 7e10}`, "head_dim"},
		{`{"layers": 80, "q_heads": 64, "kv_heads": 8, "head_dim": 128, "total_params": 7e10, "active_params": 8e10}`, "active_params"},
		{`[1,2]`, "model"},
		{``, "EOF"},
		{`{"layers": 80,`, "EOF"},
	}
	for _, c := range cases {
		_, err := LoadModel(strings.NewReader(c.in))
		if err == nil || !strings.Contains(err.Error(), c.mention) {
			t.Errorf("%q: want error mentioning %s, got %v", c.in, c.mention, err)
		}
	}
	big := strings.Repeat(" ", maxModelFileBytes+1)
	if _, err := LoadModel(strings.NewReader(big)); err == nil {
		t.Error("oversized input accepted")
	}
}

// FuzzLoadModel: whatever the bytes, LoadModel returns a model that passes
// Validate with a positive KV size, or an error; it never panics.
func FuzzLoadModel(f *testing.F) {
	f.Add([]byte(model70bJSON))
	f.Add([]byte(`{"layers": 61, "q_heads": 128, "kv_lora_rank": 512, "qk_rope_head_dim": 64, "qk_nope_head_dim": 128, "v_head_dim": 128, "total_params": 671e9, "active_params": 37e9}`))
	f.Add([]byte(`{"layers": 1, "q_heads": 1, "kv_heads": 1, "head_dim": 1, "total_params": 1}`))
	f.Add([]byte(`{"layers": -1}`))
	f.Add([]byte(`{"kv_heads": 1e400}`))
	f.Add([]byte(`null`))
	f.Add([]byte(`{"dtype": "fp8", "dtype": "bf16"}`))
	f.Fuzz(func(t *testing.T, data []byte) {
		m, err := LoadModel(strings.NewReader(string(data)))
		if err != nil {
			return
		}
		if verr := m.Validate(); verr != nil {
			t.Fatalf("accepted an invalid model: %v", verr)
		}
		if m.KVBytesPerToken() <= 0 {
			t.Fatalf("accepted a model with %d KV bytes per token", m.KVBytesPerToken())
		}
	})
}
