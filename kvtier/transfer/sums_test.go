package transfer

import (
	"context"
	"errors"
	"math/rand/v2"
	"strings"
	"testing"

	"kvtier.dev/cudastream"
	"kvtier.dev/internal/checksum"
)

// TestSums: with Config.Sums, every offload and staged onboard reports
// each block's word sum as checksum.WordSum computes it over the block's
// bytes in host order, by every path (batches, the copy kernel, the gather
// ring); a plain onboard has none.
func TestSums(t *testing.T) {
	for _, layout := range []string{"layer-first", "block-first"} {
		for _, m := range []Method{MethodBatch, MethodKernel, MethodGather} {
			t.Run(layout+"/"+m.String(), func(t *testing.T) {
				f := newFixture(t, layout, cudastream.H200Link())
				staging, err := f.sim.HostAlloc(2 * f.host.SlotBytes)
				if err != nil {
					t.Fatal(err)
				}
				cfg := Config{Sums: true, Method: m, Staging: [][]byte{staging}}
				if m == MethodGather {
					cfg.GatherBuffers, cfg.GatherBufferBytes = 2, 4*f.gpu.BlockBytes()
				}
				e := f.engine(t, cfg)
				rng := rand.New(rand.NewPCG(2, 2))
				fill(rng, f.host.Pool[:8*f.host.SlotBytes])
				in, out := roundTripPairs(rng)
				check := func(what string, tr *Transfer, want func(i int) []byte) {
					t.Helper()
					if err := tr.Wait(context.Background()); err != nil {
						t.Fatalf("%s: %v", what, err)
					}
					sums := tr.Sums()
					if len(sums) != len(in) {
						t.Fatalf("%s: %d sums for %d blocks", what, len(sums), len(in))
					}
					for i, s := range sums {
						if w := checksum.WordSum(want(i)); s != w {
							t.Fatalf("%s: block %d: sum %#x, want %#x", what, i, s, w)
						}
					}
					tr.Release()
				}
				slot := func(pairs []Pair) func(int) []byte {
					return func(i int) []byte { return f.host.Slot(pairs[i].HostSlot)[:f.gpu.BlockBytes()] }
				}
				tr, err := e.Onboard(context.Background(), in)
				if err != nil {
					t.Fatal(err)
				}
				if err := tr.Wait(context.Background()); err != nil || tr.Sums() != nil {
					t.Fatalf("onboard: %v, sums %v, want none", err, tr.Sums())
				}
				tr.Release()
				tr, err = e.Offload(context.Background(), out)
				if err != nil {
					t.Fatal(err)
				}
				check("offload", tr, slot(out))
				gpu := make([]int32, len(in))
				for i, p := range in {
					gpu[i] = p.GPUBlock
				}
				src := &blockSource{size: f.host.SlotBytes}
				tr, err = e.OnboardStaged(context.Background(), src, gpu)
				if err != nil {
					t.Fatal(err)
				}
				check("staged onboard", tr, func(i int) []byte { return blockBytes(i, f.host.SlotBytes)[:f.gpu.BlockBytes()] })
			})
		}
	}
}

// TestSumsNeedADeviceThatSums: a TimingOnly simulator has no bytes to sum,
// and a part that is not whole words cannot be summed: New says so.
func TestSumsNeedADeviceThatSums(t *testing.T) {
	sim, err := cudastream.NewSim(cudastream.SimConfig{MemoryBytes: 1 << 20, TimingOnly: true})
	if err != nil {
		t.Fatal(err)
	}
	defer sim.Close()
	region, _ := sim.Alloc(64 << 10)
	gpu, _ := BlockFirstLayout(region, 2, 2, 4, 4096)
	pool, _ := sim.HostAlloc(4 * gpu.BlockBytes())
	host := HostLayout{Pool: pool, SlotBytes: gpu.BlockBytes()}
	if _, err := New(sim, Config{GPU: gpu, Host: host, Sums: true}); !errors.Is(err, cudastream.ErrNotSupported) {
		t.Errorf("TimingOnly simulator: %v, want ErrNotSupported", err)
	}
	f := newFixture(t, "block-first", cudastream.LinkModel{})
	odd, _ := BlockFirstLayout(f.region, 2, 2, 4, 4092)
	if _, err := New(f.sim, Config{GPU: odd, Host: f.host, Sums: true}); err == nil || !strings.Contains(err.Error(), "PartBytes 4092") {
		t.Errorf("a part of 4092 bytes: %v, want an error naming PartBytes", err)
	}
	stride, _ := LayerFirstLayout(f.region, 2, 2, 4, 4096)
	stride.BlockStride = 4100
	if _, err := New(f.sim, Config{GPU: stride, Host: f.host, Sums: true}); err == nil || !strings.Contains(err.Error(), "BlockStride 4100") {
		t.Errorf("a block stride of 4100 bytes: %v, want an error naming BlockStride", err)
	}
}
