package main

import (
	"testing"
	"time"

	"kvtier.dev/kvtier/cost"
	"kvtier.dev/kvtier/costplan"
)

// gateOver is a gate over llama-3.1-8b's 16-token blocks on the H200, its
// drive reading at readBps.
func gateOver(t *testing.T, readBps float64) *costplan.Gate {
	t.Helper()
	cfg, err := cost.NewPlannerConfig(cost.Presets{Model: "llama-3.1-8b", GPU: "h200", HostLink: "pcie5-pinned", NVMe: "nvme-gen4", BlockTokens: 16, MaxBlocks: 1025})
	if err != nil {
		t.Fatal(err)
	}
	drive := cost.Link{Name: "test-drive", BandwidthBytesPerS: readBps, Latency: 50 * time.Microsecond}
	cfg.Paths[cost.TierNVMe] = cost.Path{Source: drive, Ingress: cfg.Paths[cost.TierHost].Ingress, Pipelined: true}
	m, err := cost.NewPlanner(cfg)
	if err != nil {
		t.Fatal(err)
	}
	g, err := costplan.NewGate(costplan.GateConfig{Model: m, Tier: cost.TierNVMe})
	if err != nil {
		t.Fatal(err)
	}
	return g
}

// TestFlushAtExit: shutdown writes the cache down to NVMe only into a
// directory a restart reads, and with gated writes only when the drive is
// worth some load or -nvme-persist asks.
func TestFlushAtExit(t *testing.T) {
	slow, fast := gateOver(t, 1.4e9), gateOver(t, 50e9)
	if _, ok := slow.BreakEven(1024); ok {
		t.Fatal("a 1.4 GB/s drive breaks even: the case below tests nothing")
	}
	for _, c := range []struct {
		name    string
		dir     string
		persist bool
		h       *gateHandle
		want    bool
	}{
		{"a temporary directory", "", false, &gateHandle{blocks: 1025}, false},
		{"ungated", "/kv", false, &gateHandle{blocks: 1025}, true},
		{"no handle", "/kv", false, nil, true},
		{"gated, a slow drive", "/kv", false, &gateHandle{gate: slow, blocks: 1025}, false},
		{"gated, a slow drive, -nvme-persist", "/kv", true, &gateHandle{gate: slow, blocks: 1025}, true},
		{"gated, a fast drive", "/kv", false, &gateHandle{gate: fast, blocks: 1025}, true},
	} {
		if got := c.h.flushAtExit(&config{nvmeDir: c.dir, nvmePersist: c.persist}); got != c.want {
			t.Errorf("%s: flush %v, want %v", c.name, got, c.want)
		}
	}
}
