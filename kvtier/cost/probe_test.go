package cost

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// testdata/probe-h200.json carries the figures design.md reports for the
// project's H200 (49.4 GiB/s pinned, 5.4 GiB/s pageable, 3 us per copy).
func TestLoadProbe(t *testing.T) {
	p, err := LoadProbe(filepath.Join("testdata", "probe-h200.json"))
	if err != nil {
		t.Fatal(err)
	}
	if p.DeviceName != "NVIDIA H200" || p.PCIeGen != 5 || p.PCIeWidth != 16 {
		t.Fatalf("device: %+v", p)
	}
	if p.Pinned.BandwidthBytesPerS != 53042995200 || p.Pinned.Latency != 3*time.Microsecond || p.Pinned.Name != "probe-pcie5-x16-pinned" {
		t.Fatalf("pinned link: %+v", p.Pinned)
	}
	if p.Pageable.BandwidthBytesPerS != 5798205849 {
		t.Fatalf("pageable link: %+v", p.Pageable)
	}
	// A measurement replaces the preset: this older one's 53 GB/s moves 16
	// GB slower than the preset's 55.3 (the probe of
	// benchmarks/results/probe-h200.json).
	preset, _ := LookupLink("pcie5-pinned")
	if p.Pinned.TransferTime(16e9) <= preset.TransferTime(16e9) {
		t.Fatal("measured 53 GB/s should be slower than the 55.3 GB/s preset")
	}
}

func TestLoadProbeRejects(t *testing.T) {
	dir := t.TempDir()
	cases := []struct{ body, mention string }{
		{`{"device": {"name": "x"}}`, `"measured"`},
		{`{"measured": {"h2d_pinned_bytes_per_s": 0}}`, "h2d_pinned_bytes_per_s"},
		{`{"measured": {"h2d_pinned_bytes_per_s": -5}}`, "h2d_pinned_bytes_per_s"},
		{`{"measured": {"h2d_pinned_bytes_per_s": "fast"}}`, "h2d_pinned_bytes_per_s"},
		{`{"measured": {"h2d_pinned_bytes_per_s": 5e10, "h2d_pageable_bytes_per_s": -1}}`, "h2d_pageable_bytes_per_s"},
		{`{"measured": {"h2d_pinned_bytes_per_s": 5e10, "small_copy_issue_seconds": -1}}`, "small_copy_issue_seconds"},
		{`{"measured": {"h2d_pinned_bytes_per_s": 5e10, "d2h_pinned_bytes_per_s": -1}}`, "d2h_pinned_bytes_per_s"},
		{`not json`, "probe"},
	}
	for i, c := range cases {
		path := filepath.Join(dir, "p.json")
		if err := os.WriteFile(path, []byte(c.body), 0o600); err != nil {
			t.Fatal(err)
		}
		_, err := LoadProbe(path)
		if err == nil || !strings.Contains(err.Error(), c.mention) || !strings.Contains(err.Error(), path) {
			t.Errorf("case %d %s: want error naming %s and the file, got %v", i, c.body, c.mention, err)
		}
	}
	if _, err := LoadProbe(filepath.Join(dir, "absent.json")); err == nil {
		t.Error("absent probe file accepted")
	}
}
