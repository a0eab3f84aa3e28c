package kvprom

import (
	"context"
	"log/slog"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"kvtier.dev/cudastream"
	"kvtier.dev/kvtier"
	"kvtier.dev/kvtier/stack"
	"kvtier.dev/kvtier/transfer"
)

// TestMoverAndStoreCollectors: a cache on the simulated device writes one
// block through to the host tier and on to NVMe, and the mover's and the
// store's collectors report those copies.
func TestMoverAndStoreCollectors(t *testing.T) {
	sim, err := cudastream.NewSim(cudastream.SimConfig{MemoryBytes: 1 << 20})
	if err != nil {
		t.Fatal(err)
	}
	defer sim.Close()
	region, err := sim.Alloc(4 << 12)
	if err != nil {
		t.Fatal(err)
	}
	gpu, err := transfer.BlockFirstLayout(region, 2, 2, 4, 1<<10)
	if err != nil {
		t.Fatal(err)
	}
	c, err := stack.Open(context.Background(), stack.Options{Device: sim, GPU: gpu, BlockTokens: 2, HostBytes: 4 << 12,
		NVMeDirs: []string{t.TempDir()}, NVMeBytes: 4 << 12, WriteThrough: true, Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	var w kvtier.Lease
	if err := c.Insert(1, []int32{1, 2}, kvtier.GPU, &w); err != nil {
		t.Fatal(err)
	}
	if err := c.Commit(&w, nil); err != nil {
		t.Fatal(err)
	}
	c.Release(&w)
	if err := c.Drain(context.Background()); err != nil {
		t.Fatal(err)
	}
	labels := prometheus.Labels{"model": "test"}
	mover := Mover(c.Mover, "kvserve", labels)
	store := Store(c.Store, "kvserve", labels)
	reg := prometheus.NewPedanticRegistry()
	reg.MustRegister(mover...)
	reg.MustRegister(store...)
	if n, err := testutil.GatherAndCount(reg); err != nil || n != 10 {
		t.Fatalf("%d series, %v; want 6 paths, failures, 2 checked, corrupt", n, err)
	}
	want := map[int]float64{1: 1, 2: 1} // offload, nvme_write (Mover's order)
	for i, col := range mover[:6] {
		if got := testutil.ToFloat64(col); got != want[i] {
			t.Errorf("mover collector %d: %v, want %v", i, got, want[i])
		}
	}
	if got := testutil.ToFloat64(mover[6]); got != 0 {
		t.Errorf("failures: %v", got)
	}
	for i, col := range store {
		if got := testutil.ToFloat64(col); got != 0 {
			t.Errorf("store collector %d: %v, want 0 (nothing read)", i, got)
		}
	}
}
