package stack_test

import (
	"bytes"
	"context"
	"fmt"
	"log/slog"
	"os"

	"kvtier.dev/cudastream"
	"kvtier.dev/kvtier"
	"kvtier.dev/kvtier/stack"
	"kvtier.dev/kvtier/transfer"
)

// Open a cache with host and NVMe tiers on the simulated device, store a
// prefix, evict it to NVMe, look it up and onboard it layer by layer.
func ExampleOpen() {
	ctx := context.Background()
	sim, _ := cudastream.NewSim(cudastream.SimConfig{MemoryBytes: 1 << 20})
	defer sim.Close()
	region, _ := sim.Alloc(8 << 12)                             // 8 blocks of 4 KiB:
	gpu, _ := transfer.BlockFirstLayout(region, 2, 2, 8, 1<<10) // 2 layers, K and V
	dir, _ := os.MkdirTemp("", "kvtier-example")
	defer os.RemoveAll(dir)
	c, err := stack.Open(ctx, stack.Options{Device: sim, GPU: gpu, BlockTokens: 4, HostBytes: 8 << 12,
		NVMeDirs: []string{dir}, NVMeBytes: 32 << 12, Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		fmt.Println(err)
		return
	}
	defer c.Close()
	compute, _ := sim.NewStream(0) // the model's stream
	kv := func(k kvtier.Key) []byte { return bytes.Repeat([]byte{byte(k)}, int(gpu.BlockBytes())) }
	at := func(s kvtier.Slot) cudastream.DevicePtr {
		return region + cudastream.DevicePtr(int64(s)*gpu.BlockBytes())
	}

	prompt := []int32{1, 2, 3, 4, 5, 6, 7, 8} // two blocks of 4 tokens
	var w kvtier.Lease
	_ = c.Insert(7, prompt, kvtier.GPU, &w) // prefill writes each new block's KV
	for _, b := range w.Blocks {
		_ = compute.CopyHtoD(at(b.Slot), kv(b.Key))
	}
	written, _ := sim.NewEvent(cudastream.EventOptions{})
	_ = written.Record(compute)
	_ = c.CommitAfter(&w, written) // no host wait: copies wait for the event
	c.Release(&w)
	n, err := c.Evict(ctx, 7, prompt, kvtier.NVMe)
	fmt.Println("evicted to nvme:", n, err)

	var l kvtier.Lease
	_ = c.Lookup(7, prompt, &l)
	_ = c.Plan(&l)
	_ = c.Onboard(&l)
	for layer := range gpu.Layers { // the model waits for each layer on the device
		evs, _ := l.LayerEvents(layer, nil)
		for _, ev := range evs {
			_ = compute.WaitEvent(ev.(cudastream.Event))
		}
	}
	for _, b := range l.Blocks {
		got := make([]byte, gpu.BlockBytes())
		_ = compute.CopyDtoH(got, at(b.GPUSlot))
		_ = compute.Synchronize()
		fmt.Println("block from", b.Tier, "loaded:", b.Loading, "bytes match:", bytes.Equal(got, kv(b.Key)))
	}
	c.Release(&l)
	_ = compute.Destroy()
	_ = written.Destroy()
	// Output:
	// evicted to nvme: 2 <nil>
	// block from nvme loaded: true bytes match: true
	// block from nvme loaded: true bytes match: true
}
