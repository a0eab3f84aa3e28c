// Calculator answers "reload or recompute?" for one model and machine, using
// kvtier/cost directly: the KV size of a prefix, the time to bring it back
// over PCIe, the time to recompute it, the best split between the two, and a
// per-block plan for a prefix scattered over tiers.
//
//	go run ./examples/calculator
package main

import (
	"fmt"
	"log"
	"time"

	"kvtier.dev/kvtier/cost"
)

func main() {
	model, err := cost.LookupModel("llama-3.1-70b")
	if err != nil {
		log.Fatal(err)
	}
	gpu, _ := cost.LookupGPU("h200")
	pcie, _ := cost.LookupLink("pcie5-pinned")
	s := cost.Scenario{Model: model, GPU: gpu, TP: 1, Path: cost.DirectPath(pcie)}
	if err := s.Validate(); err != nil {
		log.Fatal(err)
	}

	fmt.Printf("%s on %s over %s: %d bytes of KV per token\n\n", model.Name, gpu.Name, pcie.Name, model.KVBytesPerToken())
	fmt.Printf("%8s %10s %12s %12s %18s  %s\n", "tokens", "reload", "recompute", "best split", "split recomputes", "decision")
	for _, n := range []int{256, 2048, 16384, 131072} {
		d, err := s.Decide(n, 0)
		if err != nil {
			log.Fatal(err)
		}
		fmt.Printf("%8d %10v %12v %12v %18d  %s\n", n, ms(d.Reload), ms(d.RecomputeWithAttention), ms(d.Split.Time), d.Split.RecomputeTokens, d.Choice)
	}
	if n, ok := s.BreakEven(true); ok {
		fmt.Printf("\nreload wins from %d tokens on\n", n)
	}

	// A 64-block prefix: the first 8 blocks still on the GPU, most in host
	// memory, the last 16 on NVMe, and block 20 evicted everywhere.
	nvme, _ := cost.LookupLink("nvme-gen5")
	cfg := cost.PlannerConfig{Model: model, GPU: gpu, TP: 1, BlockTokens: 16, MaxBlocks: 128}
	cfg.Paths[cost.TierHost] = cost.DirectPath(pcie)
	cfg.Paths[cost.TierNVMe] = cost.Path{Source: nvme, Ingress: pcie, Pipelined: true}
	planner, err := cost.NewPlanner(cfg)
	if err != nil {
		log.Fatal(err)
	}
	blocks := make([]cost.BlockSource, 64)
	for i := range blocks {
		switch {
		case i < 8:
			blocks[i].Tier = cost.TierGPU
		case i >= 48:
			blocks[i].Tier = cost.TierNVMe
		default:
			blocks[i].Tier = cost.TierHost
		}
	}
	blocks[20].Tier = cost.TierMissing
	actions := make([]cost.Action, len(blocks))
	res, err := planner.Plan(blocks, actions)
	if err != nil {
		log.Fatal(err)
	}
	fmt.Printf("\nplan for 64 blocks: load %d, recompute %d, ready in %v (load all: %v, recompute all: %v)\n",
		res.LoadBlocks, res.RecomputeBlocks, ms(res.Time), ms(res.LoadAllTime), ms(res.RecomputeAllTime))
	for i, a := range actions {
		if a == cost.ActionRecompute {
			fmt.Printf("  block %d (%s): recompute\n", i, blocks[i].Tier)
		}
	}
}

// ms rounds a duration to 0.1 ms for printing.
func ms(d time.Duration) time.Duration { return d.Round(100 * time.Microsecond) }
