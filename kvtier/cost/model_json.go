package cost

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
)

// modelJSON is the file format of a custom model. Keys are snake_case and
// every unknown key is an error, so that a misspelt "kv_head" is not
// silently read as zero heads. Example (a 70B Llama):
//
//	{"name": "my-70b", "layers": 80, "q_heads": 64, "kv_heads": 8,
//	 "head_dim": 128, "dtype": "bf16", "total_params": 70.6e9}
//
// active_params defaults to total_params; an MLA model sets kv_lora_rank,
// qk_rope_head_dim, qk_nope_head_dim and v_head_dim instead of kv_heads and
// head_dim.
type modelJSON struct {
	Name          string  `json:"name"`
	Layers        int     `json:"layers"`
	QHeads        int     `json:"q_heads"`
	KVHeads       int     `json:"kv_heads"`
	HeadDim       int     `json:"head_dim"`
	HiddenSize    int     `json:"hidden_size"`
	Dtype         string  `json:"dtype"`
	WeightDtype   string  `json:"weight_dtype"`
	KVLoraRank    int     `json:"kv_lora_rank"`
	QKRopeHeadDim int     `json:"qk_rope_head_dim"`
	QKNopeHeadDim int     `json:"qk_nope_head_dim"`
	VHeadDim      int     `json:"v_head_dim"`
	TotalParams   float64 `json:"total_params"`
	ActiveParams  float64 `json:"active_params"`
}

// maxModelFileBytes bounds what LoadModel reads: a model file is a few
// hundred bytes.
const maxModelFileBytes = 1 << 20

// LoadModel reads and validates one custom model in JSON (modelJSON).
// Errors, unknown keys among them, name the key.
func LoadModel(r io.Reader) (Model, error) {
	data, err := io.ReadAll(io.LimitReader(r, maxModelFileBytes+1))
	if err != nil {
		return Model{}, fmt.Errorf("model: read: %w", err)
	}
	if len(data) > maxModelFileBytes {
		return Model{}, fmt.Errorf("model: larger than %d bytes", maxModelFileBytes)
	}
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.DisallowUnknownFields()
	var j modelJSON
	if err := dec.Decode(&j); err != nil {
		var te *json.UnmarshalTypeError
		if errors.As(err, &te) {
			return Model{}, fmt.Errorf("model: field %q: expected %v, got JSON %s", te.Field, te.Type, te.Value)
		}
		return Model{}, fmt.Errorf("model: %w", err)
	}
	if _, err := dec.Token(); err != io.EOF {
		return Model{}, errors.New("model: trailing data after the JSON object")
	}
	m := Model{
		Name: j.Name, Layers: j.Layers, QHeads: j.QHeads, KVHeads: j.KVHeads, HeadDim: j.HeadDim,
		HiddenSize: j.HiddenSize, KVLoraRank: j.KVLoraRank, QKRopeHeadDim: j.QKRopeHeadDim,
		QKNopeHeadDim: j.QKNopeHeadDim, VHeadDim: j.VHeadDim,
		TotalParams: j.TotalParams, ActiveParams: j.ActiveParams,
	}
	if m.Name == "" {
		m.Name = "custom"
	}
	if j.Dtype == "" {
		m.Dtype = BF16
	} else {
		d, err := ParseDtype(j.Dtype)
		if err != nil {
			return Model{}, fmt.Errorf("model: %w", fieldErr("dtype", j.Dtype, "%v", err))
		}
		m.Dtype = d
	}
	if j.WeightDtype != "" {
		d, err := ParseDtype(j.WeightDtype)
		if err != nil {
			return Model{}, fmt.Errorf("model: %w", fieldErr("weight_dtype", j.WeightDtype, "%v", err))
		}
		m.WeightDtype = d
	}
	if m.ActiveParams == 0 {
		m.ActiveParams = m.TotalParams
	}
	if err := m.Validate(); err != nil {
		return Model{}, fmt.Errorf("model: %w", err)
	}
	return m, nil
}

// LoadModelFile is LoadModel on a file; errors name the path.
func LoadModelFile(path string) (Model, error) {
	f, err := os.Open(path)
	if err != nil {
		return Model{}, err
	}
	defer f.Close()
	m, err := LoadModel(f)
	if err != nil {
		return Model{}, fmt.Errorf("%s: %w", path, err)
	}
	return m, nil
}
