package cost

import (
	"bytes"
	"math"
	"os"
	"testing"
)

// FuzzParseProbe: whatever the file holds, ParseProbe returns an error or a
// probe whose links pass Validate and whose figures are finite and in
// range; it never panics.
func FuzzParseProbe(f *testing.F) {
	if b, err := os.ReadFile("testdata/probe-h200.json"); err == nil {
		f.Add(b)
	}
	for _, s := range []string{
		`{"measured":{"h2d_pinned_bytes_per_s":5e10,"small_copy_issue_seconds":3e-6}}`,
		`{"device":{"name":"x","pcie_gen":5,"pcie_width":16},"measured":{"h2d_pinned_bytes_per_s":1,"h2d_pageable_bytes_per_s":-1}}`,
		`{"measured":{"h2d_pinned_bytes_per_s":1e400}}`,
		`{"measured":null}`, `null`, `[]`, `{"measured":{"d2h_pinned_bytes_per_s":"fast"}}`, ``,
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		p, err := ParseProbe(bytes.NewReader(b))
		if err != nil {
			return
		}
		if err := p.Pinned.Validate(); err != nil {
			t.Fatalf("accepted a probe whose pinned link fails Validate: %v", err)
		}
		if p.Pageable != (Link{}) {
			if err := p.Pageable.Validate(); err != nil {
				t.Fatalf("accepted a probe whose pageable link fails Validate: %v", err)
			}
		}
		if d := p.D2HPinnedBytesPerS; d < 0 || math.IsNaN(d) || math.IsInf(d, 0) {
			t.Fatalf("accepted d2h_pinned_bytes_per_s = %v", d)
		}
		if p.Pinned.Latency < 0 {
			t.Fatalf("accepted a negative latency %v", p.Pinned.Latency)
		}
	})
}
