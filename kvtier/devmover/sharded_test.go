package devmover

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"strings"
	"testing"

	"kvtier.dev/cudastream"
	"kvtier.dev/kvtier"
	"kvtier.dev/kvtier/nvme"
)

// shardedFixture is a tensor-parallel server in miniature: one device
// fixture per GPU (its own device, host pool, NVMe store and Mover),
// and one Manager over a ShardedMover of their movers. Each shard's KV for a
// block differs (each GPU holds other heads), so a copy that went to the
// wrong GPU, or a shard left behind, shows as wrong bytes.
type shardedFixture struct {
	shards []*devFixture
	m      *kvtier.Manager
}

func newShardedFixture(t *testing.T, tp int, o devOpts) *shardedFixture {
	t.Helper()
	sf := &shardedFixture{}
	movers := make([]kvtier.Mover, tp)
	var cfg kvtier.Config
	for r := range tp {
		f, c := newDevShard(t, o)
		f.rng = rand.New(rand.NewPCG(uint64(r), 7))
		sf.shards = append(sf.shards, f)
		movers[r] = f.mover
		if r == 0 {
			cfg = c
		}
	}
	sm, err := kvtier.NewShardedMover(movers...)
	if err != nil {
		t.Fatal(err)
	}
	cfg.Mover = sm
	sf.m = mustNew(t, cfg)
	for _, f := range sf.shards {
		f.m = sf.m
	}
	return sf
}

// prefill inserts tokens into the GPUs, writes each shard's KV of the new
// blocks on its own GPU and commits. The caller releases w.
func (sf *shardedFixture) prefill(t *testing.T, tokens []int32, w *kvtier.Lease) {
	t.Helper()
	prefillOn(t, sf.m, tokens, w, func(b kvtier.Block) {
		for _, f := range sf.shards {
			f.writeGPU(t, b.Key, b.Slot)
		}
	})
}

// offload moves w's blocks down to tier `to` and waits.
func (sf *shardedFixture) offload(t *testing.T, w *kvtier.Lease, to kvtier.Tier) {
	t.Helper()
	if err := sf.m.Offload(w, to); err != nil {
		t.Fatal(err)
	}
	if err := sf.m.Wait(context.Background(), w); err != nil {
		t.Fatal(err)
	}
}

// checkAll compares every ready copy on every shard with that shard's KV.
func (sf *shardedFixture) checkAll(t *testing.T) {
	t.Helper()
	for r, f := range sf.shards {
		if bad := f.checkAll(t); len(bad) > 0 {
			t.Fatalf("shard %d: %v", r, bad)
		}
	}
	verify(t, sf.m)
}

// TestShardedDeviceMover runs a manager over 2 and 4 simulated GPUs: each
// block's per-GPU parts go down to the host and NVMe tiers of their own GPU
// and come back into the same GPU slot on every GPU, byte for byte, with
// per-layer events for each GPU; a part corrupted on one GPU's NVMe store
// fails the load on all of them and the block is forgotten everywhere.
// TestDeviceMoverGPU runs it with every shard on the real GPU 0 (its own
// context, streams, host pool and store each).
func TestShardedDeviceMover(t *testing.T) { testShardedDeviceMover(t, false) }

func testShardedDeviceMover(t *testing.T, real bool) {
	for _, tp := range []int{2, 4} {
		t.Run(fmt.Sprintf("tp=%d", tp), func(t *testing.T) {
			t.Run("roundtrip", func(t *testing.T) { shardedRoundTrip(t, tp, real) })
			t.Run("corrupt", func(t *testing.T) { shardedCorrupt(t, tp, real) })
		})
	}
}

func shardedOpts(real bool) devOpts {
	return devOpts{gpu: 4, host: 4, nvme: 32, real: real,
		simCfg: cudastream.SimConfig{Link: cudastream.H200Link(), Clock: cudastream.SimVirtualClock}}
}

func shardedRoundTrip(t *testing.T, tp int, real bool) {
	sf := newShardedFixture(t, tp, shardedOpts(real))
	ctx := context.Background()
	f0 := sf.shards[0]
	var reqs [][]int32
	for i := range 6 {
		tokens := f0.request(2)
		reqs = append(reqs, tokens)
		var w kvtier.Lease
		sf.prefill(t, tokens, &w)
		sf.offload(t, &w, kvtier.Host)
		if i%2 == 0 {
			sf.offload(t, &w, kvtier.NVMe)
		}
		sf.m.Release(&w)
		sf.checkAll(t)
	}
	// Out of the GPU (and, for the even ones, the host) on every shard.
	for i, tokens := range reqs {
		keep := kvtier.Host
		if i%2 == 0 {
			keep = kvtier.NVMe
		}
		if n, err := sf.m.Evict(ctx, 1, tokens, keep); err != nil {
			t.Fatalf("Evict request %d: %d blocks, %v", i, n, err)
		}
	}
	sf.checkAll(t)
	loaded := [kvtier.NumTiers]int{}
	for _, i := range f0.rng.Perm(len(reqs)) {
		var l kvtier.Lease
		if err := sf.m.Lookup(1, reqs[i], &l); err != nil {
			t.Fatal(err)
		}
		loading := planOnboard(t, sf.m, &l, &loaded)
		// Each GPU's stream waits for its own layers only; together they
		// are every event the lease has.
		var all, evs []kvtier.Event
		for layer := range dmLayers {
			var err error
			if all, err = l.LayerEvents(layer, all[:0]); err != nil {
				t.Fatal(err)
			}
			total := 0
			for r, f := range sf.shards {
				if evs, err = l.ShardLayerEvents(r, layer, evs[:0]); err != nil {
					t.Fatal(err)
				}
				if (loading > 0) != (len(evs) > 0) {
					t.Fatalf("request %d, %d blocks loading: shard %d has %d events for layer %d", i, loading, r, len(evs), layer)
				}
				total += len(evs)
				for _, ev := range evs {
					if err := f.st.WaitEvent(ev.(cudastream.Event)); err != nil {
						t.Fatal(err)
					}
				}
			}
			if total != len(all) {
				t.Fatalf("layer %d: the shards have %d events, the lease %d", layer, total, len(all))
			}
		}
		for j, b := range l.Blocks {
			s, ok := gpuSlot(b)
			if !ok {
				continue
			}
			for r, f := range sf.shards {
				if got := f.readGPU(t, s); !bytes.Equal(got, f.want[b.Key]) {
					t.Fatalf("request %d block %d (from %v): shard %d's GPU slot %d holds other bytes", i, j, b.Tier, r, s)
				}
			}
		}
		if err := sf.m.Wait(ctx, &l); err != nil {
			t.Fatal(err)
		}
		sf.m.Release(&l)
		sf.checkAll(t)
	}
	if loaded[kvtier.Host] == 0 || loaded[kvtier.NVMe] == 0 {
		t.Errorf("loads by tier %v: want loads from both the host and NVMe", loaded)
	}
	if _, err := (&kvtier.Lease{}).ShardLayerEvents(0, dmLayers, nil); err != nil {
		t.Errorf("ShardLayerEvents of a lease loading nothing: %v", err)
	}
	if _, err := (&kvtier.Lease{}).ShardLayerEvents(-1, 0, nil); !errors.Is(err, kvtier.ErrBadInput) || !strings.Contains(err.Error(), "shard -1") {
		t.Errorf("ShardLayerEvents(-1, ...) = %v, want ErrBadInput naming shard -1", err)
	}
}

func shardedCorrupt(t *testing.T, tp int, real bool) {
	sf := newShardedFixture(t, tp, shardedOpts(real))
	ctx := context.Background()
	f0 := sf.shards[0]
	a := f0.request(1)
	var w kvtier.Lease
	sf.prefill(t, a, &w)
	sf.offload(t, &w, kvtier.NVMe)
	sf.m.Release(&w)
	if n, err := sf.m.Evict(ctx, 1, a, kvtier.NVMe); n != 1 || err != nil {
		t.Fatalf("Evict to NVMe: %d blocks, %v", n, err)
	}
	var l kvtier.Lease
	if err := sf.m.Lookup(1, a, &l); err != nil {
		t.Fatal(err)
	}
	if len(l.Blocks) != 1 || l.Blocks[0].Tier != kvtier.NVMe {
		t.Fatalf("looked up as %+v, want one block in nvme", l.Blocks)
	}
	last := sf.shards[tp-1]
	last.corrupt(t, l.Blocks[0].Slot)
	if err := sf.m.Plan(&l); err != nil {
		t.Fatal(err)
	}
	if err := sf.m.Onboard(&l); err != nil {
		t.Fatal(err)
	}
	err := sf.m.Wait(ctx, &l)
	if !errors.Is(err, kvtier.ErrMove) || !errors.Is(err, nvme.ErrCorrupt) || !errors.Is(err, kvtier.ErrSourceLost) {
		t.Fatalf("Wait after loading a block corrupt on shard %d = %v, want ErrMove wrapping nvme.ErrCorrupt and ErrSourceLost (blocks %+v, metrics %+v)", tp-1, err, l.Blocks, sf.m.Metrics())
	}
	sf.m.Release(&l)
	if err := sf.m.Lookup(1, a, &l); err != nil {
		t.Fatal(err)
	}
	if len(l.Blocks) != 0 {
		t.Errorf("a block corrupt on one shard is still served: %+v", l.Blocks)
	}
	sf.m.Release(&l)
	for r, f := range sf.shards {
		want := uint64(0)
		if r == tp-1 {
			want = 1
		}
		if got := f.store.Stats().CorruptDrops; got != want {
			t.Errorf("shard %d's store dropped %d corrupt slots, want %d", r, got, want)
		}
	}
	sf.checkAll(t)
}
