package costplan

import (
	"testing"
	"time"

	"kvtier.dev/kvtier"
	"kvtier.dev/kvtier/cost"
)

// TestPlanCompressedTier: the server's planner prices a tier's codec. With
// llama-3.1-8b's NVMe tier behind a 3.5 GB/s drive, a 64-block prefix held
// raw is recomputed (its load is slower than its prefill on the H200) and
// the same prefix held as fp8-e4m3 is loaded but for a head that the pass
// recomputes while the first layers land.
func TestPlanCompressedTier(t *testing.T) {
	cfg, err := cost.NewPlannerConfig(cost.Presets{Model: "llama-3.1-8b", GPU: "h200", HostLink: "pcie5-pinned", NVMe: "nvme-gen5", BlockTokens: 16, MaxBlocks: 4})
	if err != nil {
		t.Fatal(err)
	}
	cfg.Paths[cost.TierNVMe].Source = cost.Link{Name: "pcie3-drive", BandwidthBytesPerS: 3.5e9, Latency: 80 * time.Microsecond}
	fp8, err := cost.LookupCodec("fp8-e4m3")
	if err != nil {
		t.Fatal(err)
	}
	req := &kvtier.PlanRequest{Blocks: make([]kvtier.PlanBlock, 64)}
	for i := range req.Blocks {
		req.Blocks[i] = kvtier.PlanBlock{Cached: true, Tier: kvtier.NVMe}
	}
	for _, c := range []struct {
		codec    cost.Codec
		minLoads int
		maxLoads int
	}{{cost.Codec{}, 0, 0}, {fp8, 48, 64}} {
		cfg.Paths[cost.TierNVMe].Codec = c.codec
		cp, err := cost.NewPlanner(cfg)
		if err != nil {
			t.Fatal(err)
		}
		p, err := New(cp)
		if err != nil {
			t.Fatal(err)
		}
		got := make([]kvtier.Action, len(req.Blocks))
		if _, err := p.Plan(req, got); err != nil {
			t.Fatal(err)
		}
		loads := 0
		for _, a := range got {
			if a == kvtier.Load {
				loads++
			}
		}
		if loads < c.minLoads || loads > c.maxLoads {
			t.Errorf("codec %q: %d of 64 blocks loaded, want %d to %d (load %v, recompute %v)", c.codec.Name, loads, c.minLoads, c.maxLoads,
				cp.BlockLoadCost(cost.TierNVMe), cp.BlockRecomputeCost(0))
		}
	}
}
