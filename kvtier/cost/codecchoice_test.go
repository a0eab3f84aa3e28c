package cost

import (
	"errors"
	"math"
	"strings"
	"testing"
)

// TestChooseCodec: over PCIe 5 a 16-token block of llama-3.1-8b loads
// sooner in FP8 and the format's error is within the default budget, so
// FP8 is chosen; a budget below its error, a link faster than its decode
// (2 TB/s), or a model whose KV is already FP8 leaves the blocks as they
// are, the reason naming why.
func TestChooseCodec(t *testing.T) {
	m, _ := LookupModel("llama-3.1-8b")
	pcie, _ := LookupLink("pcie5-pinned")
	fast := Link{Name: "hbm-like", BandwidthBytesPerS: 2e12}
	fp8m := m
	fp8m.Dtype = FP8
	for _, tc := range []struct {
		name   string
		p      Path
		m      Model
		budget float64
		want   string // the codec chosen, "" none
		reason string
	}{
		{"pcie5", DirectPath(pcie), m, DefaultErrorBudget, "fp8-e4m3", "within the budget"},
		{"drive then pcie5", Path{Source: Link{Name: "drive", BandwidthBytesPerS: 2e9}, Ingress: pcie, Pipelined: true}, m, DefaultErrorBudget, "fp8-e4m3", "2.00x the blocks"},
		{"tight budget", DirectPath(pcie), m, 0.01, "", "over the budget"},
		{"no budget", DirectPath(pcie), m, 0, "", "over the budget"},
		{"faster than the decode", DirectPath(fast), m, DefaultErrorBudget, "", "raw in"},
		{"fp8 KV", DirectPath(pcie), fp8m, DefaultErrorBudget, "", "encodes bf16"},
	} {
		got, err := ChooseCodec(tc.p, tc.m, 16, 1, tc.budget)
		if err != nil {
			t.Fatalf("%s: %v", tc.name, err)
		}
		t.Logf("%s: %s", tc.name, got.Reason)
		if got.Codec.Name != tc.want || !strings.Contains(got.Reason, tc.reason) {
			t.Errorf("%s: chose %q (%s), want %q and a reason saying %q", tc.name, got.Codec.Name, got.Reason, tc.want, tc.reason)
		}
	}
}

// TestChooseCodecRejects: a budget outside [0, 1), a bad block size, a
// path or a candidate that does not validate is an error naming it.
func TestChooseCodecRejects(t *testing.T) {
	m, _ := LookupModel("llama-3.1-8b")
	pcie, _ := LookupLink("pcie5-pinned")
	bad := fp8(t)
	bad.ErrorRMS = 1.5
	for _, tc := range []struct {
		name   string
		p      Path
		bt     int
		budget float64
		cands  []Codec
		field  string
	}{
		{"negative budget", DirectPath(pcie), 16, -0.1, nil, "error_budget"},
		{"budget 1", DirectPath(pcie), 16, 1, nil, "error_budget"},
		{"NaN budget", DirectPath(pcie), 16, math.NaN(), nil, "error_budget"},
		{"no block", DirectPath(pcie), 0, 0.05, nil, "block_tokens"},
		{"no link", DirectPath(Link{Name: "zero"}), 16, 0.05, nil, "bandwidth"},
		{"bad candidate", DirectPath(pcie), 16, 0.05, []Codec{bad}, "codec.error_rms"},
	} {
		_, err := ChooseCodec(tc.p, m, tc.bt, 1, tc.budget, tc.cands...)
		var fe *FieldError
		if !errors.As(err, &fe) || fe.Field != tc.field {
			t.Errorf("%s: %v, want a FieldError of %s", tc.name, err, tc.field)
		}
	}
}
