package kvprom

import (
	"context"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"kvtier.dev/internal/stacktest"
	"kvtier.dev/kvtier"
)

// TestMoverAndStoreCollectors: a cache on the simulated device writes one
// block through to the host tier and on to NVMe, and the mover's and the
// store's collectors report those copies.
func TestMoverAndStoreCollectors(t *testing.T) {
	c := stacktest.Open(t, stacktest.Options{GPUBlocks: 4, HostBlocks: 4, NVMeBlocks: 4, BlockTokens: 2, WriteThrough: true})
	writeOneBlock(t, c)
	labels := prometheus.Labels{"model": "test"}
	mover := Mover(c.Mover, "kvserve", labels)
	store := Store(c.Store, "kvserve", labels)
	reg := prometheus.NewPedanticRegistry()
	reg.MustRegister(mover...)
	reg.MustRegister(store...)
	if n, err := testutil.GatherAndCount(reg); err != nil || n != 14 {
		t.Fatalf("%d series, %v; want 6 paths, failures, dropped, the drive's queue and 2 rates, 2 checked, corrupt", n, err)
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
	if q, w := testutil.ToFloat64(mover[8]), testutil.ToFloat64(mover[10]); q != 0 || w <= 0 {
		t.Errorf("the drive: %v writes queued, %v bytes/s written; want 0 and a measured rate", q, w)
	}
	for i, col := range store {
		if got := testutil.ToFloat64(col); got != 0 {
			t.Errorf("store collector %d: %v, want 0 (nothing read)", i, got)
		}
	}
}

// TestEngineAndPinnedCollectors: the block a cache on the simulated device
// writes through to the host tier is counted in the copy engine's offload
// bytes (a block each way would show in both), and the pinned pool's
// gauges say the region is whole and registered.
func TestEngineAndPinnedCollectors(t *testing.T) {
	c := stacktest.Open(t, stacktest.Options{GPUBlocks: 4, HostBlocks: 4, BlockTokens: 2, WriteThrough: true})
	if err := c.WaitHostPinned(context.Background()); err != nil {
		t.Fatal(err)
	}
	writeOneBlock(t, c)
	eng := Engine(c.Engine, "kvserve", nil)
	pool := Pinned(c.Pool(), "kvserve", nil)
	reg := prometheus.NewPedanticRegistry()
	reg.MustRegister(eng...)
	reg.MustRegister(pool...)
	if n, err := testutil.GatherAndCount(reg); err != nil || n != len(eng)+len(pool) {
		t.Fatalf("%d series, %v; want %d", n, err, len(eng)+len(pool))
	}
	block := float64(c.Host.SlotBytes)
	if on, off, transfers := testutil.ToFloat64(eng[0]), testutil.ToFloat64(eng[1]), testutil.ToFloat64(eng[2]); on != 0 || off != block || transfers != 1 {
		t.Errorf("copy engine: %v bytes onboarded, %v offloaded in %v transfers; want 0, %v (one block) in 1", on, off, transfers, block)
	}
	size, registered := testutil.ToFloat64(pool[0]), testutil.ToFloat64(pool[2])
	if size <= 0 || registered != size {
		t.Errorf("pinned pool: %v bytes, %v registered; want all of a non-empty region", size, registered)
	}
	if total := testutil.ToFloat64(pool[6]); total <= 0 {
		t.Errorf("pinned pool: total rate %v GiB/s once allocated, want > 0", total)
	}
}

// writeOneBlock computes one block into c's GPU tier and waits for its
// copies down the tiers (write-through).
func writeOneBlock(t *testing.T, c *stacktest.Stack) {
	t.Helper()
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
}
