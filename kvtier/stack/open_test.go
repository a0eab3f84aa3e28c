package stack

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"kvtier.dev/cudastream"
	"kvtier.dev/kvtier"
	"kvtier.dev/kvtier/devmover"
	"kvtier.dev/kvtier/transfer"
)

// TestOpenErrors: each bad option is refused with an error naming it, and
// nothing is left open (the sim's Close would report leaked memory).
func TestOpenErrors(t *testing.T) {
	sim, err := cudastream.NewSim(cudastream.SimConfig{MemoryBytes: 1 << 20})
	if err != nil {
		t.Fatal(err)
	}
	defer sim.Close()
	region, err := sim.Alloc(8 << 12)
	if err != nil {
		t.Fatal(err)
	}
	gpu, err := transfer.BlockFirstLayout(region, 2, 2, 8, 1<<10)
	if err != nil {
		t.Fatal(err)
	}
	good := Options{Device: sim, GPU: gpu, BlockTokens: 4, HostBytes: 8 << 12, Logger: slog.New(slog.DiscardHandler)}
	for _, tc := range []struct {
		edit func(*Options)
		want string
	}{
		{func(o *Options) { o.Device = nil }, "Options.Device"},
		{func(o *Options) { o.HostBytes = 0 }, "Options.HostBytes"},
		{func(o *Options) { o.HostBytes = 100 }, "Options.HostBytes"},
		{func(o *Options) { o.NVMeBytes = 1 << 20 }, "Options.NVMeBytes"},
		{func(o *Options) { o.NVMeDirs = []string{t.TempDir()} }, "Options.NVMeBytes"},
		{func(o *Options) { o.NVMeDirs, o.NVMeBytes = []string{t.TempDir()}, 100 }, "Options.NVMeBytes"},
		{func(o *Options) { o.GPU.NumBlocks = 0 }, "Options.GPU"},
		{func(o *Options) { o.BlockTokens = 0 }, "Options.BlockTokens"},
		{func(o *Options) { o.MaxHoleBlocks = -1 }, "Options.MaxHoleBlocks"},
		{func(o *Options) { o.EventBuffer = -1 }, "Options.EventBuffer"},
		{func(o *Options) { o.GatherStaging = -1 }, "Options.GatherStaging"},
		{func(o *Options) { o.NVMeGate = refuseAll }, "Options.NVMeGate"},
		{func(o *Options) {
			o.NVMeDirs, o.NVMeBytes = []string{t.TempDir()}, 1<<20
			o.NVMeGate = func(*devmover.Mover) (kvtier.WriteGate, error) { return nil, errors.New("no model") }
		}, "no model"},
		{func(o *Options) { o.GatherStaging = 4096 }, "Options.GatherStaging"},
		{func(o *Options) { o.GatherStaging = 64 << 20 }, "GatherStaging 67108864"}, // more than the device has
		{func(o *Options) { o.NVMeDirs, o.NVMeBytes = []string{"/nonexistent/kvtier"}, 1<<20 }, "nonexistent"},
		{func(o *Options) { o.Model = Model{Shape: "tiny", DType: "bf16"} }, "Options.Model.Weights"},
		{func(o *Options) { o.NVMeReformat = true }, "Options.NVMeReformat"},
		{func(o *Options) { o.Remote = &RemoteOptions{} }, "Options.Remote.Addrs"},
		{func(o *Options) { o.Remote = &RemoteOptions{Addrs: []string{"127.0.0.1:1"}, OpTimeout: -time.Second} }, "Options.Remote.OpTimeout"},
	} {
		openRefuses(t, good, tc.edit, tc.want)
	}
	staged := good
	staged.GatherStaging = 6 * 8192 // 3 buffers of 8 KiB each way
	c, err := Open(context.Background(), staged)
	if err != nil {
		t.Fatal(err)
	}
	if got := c.CapacitySlots(kvtier.Host); got != 8 {
		t.Errorf("host tier of 8 4-KiB slots has %d", got)
	}
	if got := c.Engine.GatherBytes(); got != 6*8192 {
		t.Errorf("GatherStaging 48 KiB: the engine's rings take %d bytes", got)
	}
	if err := c.Close(); err != nil {
		t.Fatal(err)
	}
}

// openRefuses checks that Open refuses good changed by edit, with an error
// naming want (wrapping ErrConfig when want names an option), and leaves
// nothing open.
func openRefuses(t *testing.T, good Options, edit func(*Options), want string) {
	t.Helper()
	o := good
	edit(&o)
	c, err := Open(context.Background(), o)
	if err == nil {
		c.Close()
		t.Errorf("%s: Open succeeded", want)
		return
	}
	if !strings.Contains(err.Error(), want) {
		t.Errorf("Open: %v, want an error naming %s", err, want)
	}
	if strings.HasPrefix(want, "Options.") && !errors.Is(err, kvtier.ErrConfig) {
		t.Errorf("Open: %v does not wrap ErrConfig", err)
	}
}

// simShard makes a simulated GPU with a KV region of 8 blocks of 4 KiB (2
// layers, K and V) for Open's tests; the sim is closed at the test's end.
func simShard(t *testing.T, blocks int) (Shard, cudastream.DevicePtr) {
	t.Helper()
	sim, err := cudastream.NewSim(cudastream.SimConfig{MemoryBytes: 1 << 20, Link: cudastream.H200Link()})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { sim.Close() })
	region, err := sim.Alloc(int64(blocks) << 12)
	if err != nil {
		t.Fatal(err)
	}
	gpu, err := transfer.BlockFirstLayout(region, 2, 2, blocks, 1<<10)
	if err != nil {
		t.Fatal(err)
	}
	return Shard{Device: sim, GPU: gpu}, region
}

// TestOpenShards opens a cache over four simulated GPUs, each with its own
// link, pinned pool and NVMe store: a prefix written with other bytes on
// each GPU goes to NVMe on all of them and comes back to each GPU byte for
// byte, each GPU's stream waiting for its own layers only.
func TestOpenShards(t *testing.T) {
	const tp = 4
	ctx := context.Background()
	var shards []Shard
	var regions []cudastream.DevicePtr
	for range tp {
		sh, region := simShard(t, 8)
		shards, regions = append(shards, sh), append(regions, region)
	}
	dir := t.TempDir()
	c, err := Open(ctx, Options{Shards: shards, BlockTokens: 4, HostBytes: 8 << 12,
		NVMeDirs: []string{dir}, NVMeBytes: 32 << 12, Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	defer func() {
		if err := c.Close(); err != nil {
			t.Error(err)
		}
	}()
	if len(c.Ranks) != tp || c.GPUParts != c.Ranks[0] {
		t.Fatalf("%d ranks, the embedded parts are rank 0's: %v", len(c.Ranks), c.GPUParts == c.Ranks[0])
	}
	for r := range tp {
		st, err := os.Stat(filepath.Join(dir, fmt.Sprintf("rank%d", r)))
		if err != nil || st.Mode().Perm() != 0o700 {
			t.Fatalf("rank %d's NVMe directory: %v, %v", r, st, err)
		}
	}
	blockBytes := shards[0].GPU.BlockBytes()
	kv := func(r int, k kvtier.Key) []byte { return bytes.Repeat([]byte{byte(k) + byte(r)*64}, int(blockBytes)) }
	at := func(r int, s kvtier.Slot) cudastream.DevicePtr {
		return regions[r] + cudastream.DevicePtr(int64(s)*blockBytes)
	}
	streams := make([]cudastream.Stream, tp)
	for r, sh := range shards {
		if streams[r], err = sh.Device.NewStream(0); err != nil {
			t.Fatal(err)
		}
		defer streams[r].Destroy()
	}

	prompt := []int32{1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12}
	var w kvtier.Lease
	if err := c.Insert(7, prompt, kvtier.GPU, &w); err != nil {
		t.Fatal(err)
	}
	for _, b := range w.Blocks {
		for r := range tp {
			if err := streams[r].CopyHtoD(at(r, b.Slot), kv(r, b.Key)); err != nil {
				t.Fatal(err)
			}
			if err := streams[r].Synchronize(); err != nil {
				t.Fatal(err)
			}
		}
	}
	if err := c.Commit(&w, nil); err != nil {
		t.Fatal(err)
	}
	c.Release(&w)
	if n, err := c.Evict(ctx, 7, prompt, kvtier.NVMe); n != 3 || err != nil {
		t.Fatalf("Evict to NVMe: %d blocks, %v; want 3", n, err)
	}
	for r, p := range c.Ranks {
		if got := p.Store.Stats(); got.Writes != 3 {
			t.Errorf("rank %d's store wrote %d blocks, want 3", r, got.Writes)
		}
	}

	var l kvtier.Lease
	if err := c.Lookup(7, prompt, &l); err != nil || l.Len() != 3 {
		t.Fatalf("lookup: %d blocks, %v", l.Len(), err)
	}
	defer c.Release(&l)
	if err := c.Plan(&l); err != nil {
		t.Fatal(err)
	}
	if err := c.Onboard(&l); err != nil {
		t.Fatal(err)
	}
	for r := range tp {
		for layer := range shards[r].GPU.Layers {
			evs, err := l.ShardLayerEvents(r, layer, nil)
			if err != nil || len(evs) == 0 {
				t.Fatalf("rank %d layer %d: %d events, %v", r, layer, len(evs), err)
			}
			for _, ev := range evs {
				if err := streams[r].WaitEvent(ev.(cudastream.Event)); err != nil {
					t.Fatal(err)
				}
			}
		}
		for _, b := range l.Blocks {
			if !b.Loading || b.Tier != kvtier.NVMe {
				t.Fatalf("block %+v: want loading from nvme", b)
			}
			got := make([]byte, blockBytes)
			if err := streams[r].CopyDtoH(got, at(r, b.GPUSlot)); err != nil {
				t.Fatal(err)
			}
			if err := streams[r].Synchronize(); err != nil {
				t.Fatal(err)
			}
			if !bytes.Equal(got, kv(r, b.Key)) {
				t.Errorf("rank %d, block at position %d: other bytes on the GPU", r, b.Position)
			}
		}
	}
	if err := c.Wait(ctx, &l); err != nil {
		t.Fatal(err)
	}
	// With an NVMe tier the engines sum on the device: the blocks went to
	// NVMe with the GPU's sums, and came back checked there.
	for r, p := range c.Ranks {
		if !p.Engine.Sums() || !p.Bounce.Sums() {
			t.Errorf("rank %d: engines sum %v, bounce %v; want both", r, p.Engine.Sums(), p.Bounce.Sums())
		}
		if got := p.Store.Stats(); got.DeferredChecks != 3 {
			t.Errorf("rank %d's store left %d payload checks to the GPU, want 3", r, got.DeferredChecks)
		}
	}
}

// TestOpenShardsErrors: a bad shard is refused with an error naming it, and
// nothing is left open.
func TestOpenShardsErrors(t *testing.T) {
	a, _ := simShard(t, 8)
	b, _ := simShard(t, 8)
	small, _ := simShard(t, 4)
	good := Options{Shards: []Shard{a, b}, BlockTokens: 4, HostBytes: 8 << 12, Logger: slog.New(slog.DiscardHandler)}
	for _, tc := range []struct {
		edit func(*Options)
		want string
	}{
		{func(o *Options) { o.Device = a.Device }, "Options.Shards"},
		{func(o *Options) { o.GPU = a.GPU }, "Options.Shards"},
		{func(o *Options) { o.Shards = []Shard{a, {GPU: b.GPU}} }, "Options.Shards[1].Device"},
		{func(o *Options) { o.Shards = []Shard{a, {Device: b.Device}} }, "Options.Shards[1].GPU"},
		{func(o *Options) { o.Shards = []Shard{a, small} }, "Options.Shards[1].GPU: 4 blocks"},
		{func(o *Options) { o.KeepNVMe, o.NVMeDirs, o.NVMeBytes = true, []string{t.TempDir()}, 32<<12 }, "Options.KeepNVMe"},
		{func(o *Options) { o.NVMeDirs, o.NVMeBytes = []string{"/nonexistent/kvtier"}, 32<<12 }, "rank 0"},
	} {
		openRefuses(t, good, tc.edit, tc.want)
	}
	c, err := Open(context.Background(), good)
	if err != nil {
		t.Fatal(err)
	}
	if err := c.Close(); err != nil {
		t.Fatal(err)
	}
}

// TestOpenHostTierAcrossRegistrations: the host tier starts after the
// staging and bounce slots, inside the pinned pool's first registration;
// an offload of consecutive blocks into consecutive host slots across the
// next registration boundary must be split there (the driver, and the
// sim, refuse a copy that spans two registrations). Found on the H200,
// where 2 MiB blocks in a 1 GiB chunk failed 10% of write-throughs.
func TestOpenHostTierAcrossRegistrations(t *testing.T) {
	chunkBytes = 2 << 20 // 512 host slots of 4 KiB a registration
	defer func() { chunkBytes = 0 }()
	const blocks = 600
	sim, err := cudastream.NewSim(cudastream.SimConfig{MemoryBytes: 8 << 20})
	if err != nil {
		t.Fatal(err)
	}
	defer sim.Close()
	region, err := sim.Alloc(blocks << 12)
	if err != nil {
		t.Fatal(err)
	}
	gpu, err := transfer.BlockFirstLayout(region, 2, 2, blocks, 1<<10)
	if err != nil {
		t.Fatal(err)
	}
	c, err := Open(context.Background(), Options{Device: sim, GPU: gpu, BlockTokens: 1, HostBytes: blocks << 12,
		Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if err := c.Drain(context.Background()); err != nil {
		t.Fatal(err)
	}
	// The pool registers in the background; WaitHostPinned waits for all
	// of it.
	if err := c.WaitHostPinned(context.Background()); err != nil {
		t.Fatal(err)
	}
	if n := c.Ranks[0].readyHostSlots(); c.CapacitySlots(kvtier.Host) < blocks || n < blocks {
		t.Fatalf("after WaitHostPinned: capacity %d, %d slots registered; want %d", c.CapacitySlots(kvtier.Host), n, blocks)
	}
	tokens := make([]int32, blocks)
	for i := range tokens {
		tokens[i] = int32(i)
	}
	var w kvtier.Lease
	if err := c.Insert(1, tokens, kvtier.GPU, &w); err != nil {
		t.Fatal(err)
	}
	if err := c.Commit(&w, nil); err != nil {
		t.Fatal(err)
	}
	if err := c.Offload(&w, kvtier.Host); err != nil {
		t.Fatal(err)
	}
	if err := c.Wait(context.Background(), &w); err != nil {
		t.Fatalf("offload of %d consecutive blocks across a registration boundary: %v", blocks, err)
	}
	c.Release(&w)
	if got := c.Metrics().Tiers[kvtier.Host].ResidentBlocks; got != blocks {
		t.Errorf("%d blocks in the host tier, want %d", got, blocks)
	}
}

// TestOpenChecksumsOnTheCPUWithoutDeviceSums: a device that cannot sum (a
// TimingOnly simulator has no bytes) still gets its NVMe tier, with the
// store checksumming payloads on the CPU.
func TestOpenChecksumsOnTheCPUWithoutDeviceSums(t *testing.T) {
	sim, err := cudastream.NewSim(cudastream.SimConfig{MemoryBytes: 1 << 20, TimingOnly: true})
	if err != nil {
		t.Fatal(err)
	}
	defer sim.Close()
	region, _ := sim.Alloc(8 << 12)
	gpu, err := transfer.BlockFirstLayout(region, 2, 2, 8, 1<<10)
	if err != nil {
		t.Fatal(err)
	}
	c, err := Open(context.Background(), Options{Shards: []Shard{{Device: sim, GPU: gpu}}, BlockTokens: 4, HostBytes: 8 << 12,
		NVMeDirs: []string{t.TempDir()}, NVMeBytes: 32 << 12, Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if c.Engine.Sums() || c.Bounce.Sums() {
		t.Error("the engines of a device that cannot sum say they sum")
	}
}

// refuseAll is an NVMeGate whose gate refuses every write as not worth it.
func refuseAll(*devmover.Mover) (kvtier.WriteGate, error) { return refusing{}, nil }

type refusing struct{}

func (refusing) AllowWrite(int, int64) kvtier.Refusal { return kvtier.NotWorth }

// TestOpenNVMeGate: the NVMe tier's gate and admitter decide the manager's
// writes into it, and the gate is built over the mover's drive.
func TestOpenNVMeGate(t *testing.T) {
	sh, _ := simShard(t, 8)
	var built *devmover.Mover
	o := Options{Device: sh.Device, GPU: sh.GPU, BlockTokens: 4, HostBytes: 8 << 12, WriteThrough: true,
		NVMeDirs: []string{t.TempDir()}, NVMeBytes: 8 << 12, Logger: slog.New(slog.DiscardHandler),
		NVMeGate: func(d *devmover.Mover) (kvtier.WriteGate, error) { built = d; return refusing{}, nil }}
	c, err := Open(context.Background(), o)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if built != c.Mover {
		t.Error("the gate was not built over the cache's mover")
	}
	var w kvtier.Lease
	if err := c.Insert(1, make([]int32, 8), kvtier.GPU, &w); err != nil {
		t.Fatal(err)
	}
	if err := c.Commit(&w, nil); err != nil {
		t.Fatal(err)
	}
	c.Release(&w)
	if err := c.Drain(context.Background()); err != nil {
		t.Fatal(err)
	}
	mt := c.Metrics()
	if n := mt.Tiers[kvtier.NVMe]; n.ResidentBlocks != 0 || n.Refused[kvtier.NotWorth] != 2 || mt.Tiers[kvtier.Host].ResidentBlocks != 2 {
		t.Errorf("after a write-through of 2 blocks: host %d, nvme %d, refused %v", mt.Tiers[kvtier.Host].ResidentBlocks, n.ResidentBlocks, n.Refused)
	}
}
