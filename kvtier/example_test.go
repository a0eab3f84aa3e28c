package kvtier_test

import (
	"context"
	"fmt"

	"kvtier.dev/kvtier"
	"kvtier.dev/kvtier/policy"
)

// instantMover completes every copy inside Submit, as a simulated device
// with no latency would. A real mover (kvtier/transfer, kvtier/nvme)
// completes them later, from its own goroutines.
type instantMover struct{}

func (instantMover) Submit(t *kvtier.Batch) error {
	for i := range t.Ops {
		t.Complete(i, nil)
	}
	return nil
}

// A request's path through a GPU tier of 4 blocks over a host tier of 64,
// write-through, with 4-token blocks.
func Example() {
	gpuLRU, _ := policy.NewDenseLRU[kvtier.BlockRef](4)
	hostLRU, _ := policy.NewDenseLRU[kvtier.BlockRef](64)
	var cfg kvtier.Config
	cfg.BlockTokens = 4
	cfg.WriteThrough = true
	cfg.Mover = instantMover{}
	cfg.Tiers[kvtier.GPU] = kvtier.TierConfig{CapacityBytes: 4 << 20, SlotBytes: 1 << 20, Policy: gpuLRU}
	cfg.Tiers[kvtier.Host] = kvtier.TierConfig{CapacityBytes: 64 << 20, SlotBytes: 1 << 20, Policy: hostLRU}
	m, err := kvtier.New(cfg)
	if err != nil {
		fmt.Println(err)
		return
	}
	ctx := context.Background()
	serve := func(tokens []int32) {
		var l, w kvtier.Lease
		_ = m.Lookup(7, tokens, &l) // the cached prefix, leased
		_ = m.Plan(&l)              // load or recompute each block
		_ = m.Onboard(&l)           // copy the loads into GPU slots
		if err := m.Wait(ctx, &l); err != nil {
			fmt.Println(err)
		}
		cached := l.Len()
		// Prefill writes the blocks Insert asks for (Write set) into
		// their GPU slots; Commit makes them readable (and, write-through,
		// copies them to the host).
		if err := m.Insert(7, tokens, kvtier.GPU, &w); err != nil {
			fmt.Println(err)
		}
		written := 0
		for _, b := range w.Blocks {
			if b.Write {
				written++
			}
		}
		_ = m.Commit(&w, nil)
		m.Release(&w)
		m.Release(&l)
		fmt.Printf("%d tokens: %d blocks cached, %d written\n", len(tokens), cached, written)
	}
	prompt := make([]int32, 18) // 4 full blocks and 2 tokens
	for i := range prompt {
		prompt[i] = int32(100 + i)
	}
	serve(prompt)
	serve(prompt)
	other := append([]int32{1, 2, 3, 4}, prompt[4:]...) // shares no prefix
	serve(other)
	serve(prompt) // evicted from the GPU by other, still in the host
	mt := m.Metrics()
	fmt.Printf("gpu hits %d, host hits %d, host resident %d\n",
		mt.Tiers[kvtier.GPU].Hits, mt.Tiers[kvtier.Host].Hits, mt.Tiers[kvtier.Host].ResidentBlocks)
	// Output:
	// 18 tokens: 0 blocks cached, 4 written
	// 18 tokens: 4 blocks cached, 0 written
	// 18 tokens: 0 blocks cached, 4 written
	// 18 tokens: 4 blocks cached, 0 written
	// gpu hits 4, host hits 4, host resident 8
}
