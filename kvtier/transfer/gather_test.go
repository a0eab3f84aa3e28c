package transfer

import (
	"bytes"
	"context"
	"errors"
	"math/rand/v2"
	"strings"
	"testing"
	"testing/synctest"
	"time"

	"kvtier.dev/cudastream"
)

// gatherConfig is a ring small enough that a transfer of a few blocks
// needs several chunks, and a chunk ends inside a block and inside a layer
// (5 pieces of 4 KiB: a block holds 8).
func gatherConfig(m Method) Config {
	return Config{Method: m, GatherBuffers: 2, GatherBufferBytes: 5 * fxPart, MaxBatch: 3}
}

// roundTrip onboards 8 random host slots into scattered GPU blocks and
// offloads them into 8 other slots, and reports whether every byte came
// back, with the two transfers' gather chunks.
func roundTrip(t *testing.T, f *fixture, e *Engine, seed uint64) (same bool, chunks [2]int) {
	t.Helper()
	rng := rand.New(rand.NewPCG(seed, 3))
	fill(rng, f.host.Pool[:8*f.host.SlotBytes])
	clear(f.host.Pool[16*f.host.SlotBytes : 24*f.host.SlotBytes])
	in, out := make([]Pair, 8), make([]Pair, 8)
	for i, b := range rng.Perm(fxBlocks)[:8] {
		in[i] = Pair{GPUBlock: int32(b), HostSlot: int32(i)}
		out[i] = Pair{GPUBlock: int32(b), HostSlot: int32(16 + i)}
	}
	tr, err := e.Onboard(context.Background(), in)
	if err != nil {
		t.Fatal(err)
	}
	<-tr.Done()
	chunks[0] = tr.GatherChunks()
	wait(t, tr)
	if tr, err = e.Offload(context.Background(), out, nil); err != nil {
		t.Fatal(err)
	}
	<-tr.Done()
	chunks[1] = tr.GatherChunks()
	wait(t, tr)
	return bytes.Equal(f.host.Pool[:8*f.host.SlotBytes], f.host.Pool[16*f.host.SlotBytes:24*f.host.SlotBytes]), chunks
}

// TestGatherRoundTrip moves blocks through the device staging ring both
// ways, for both GPU layouts, with chunks that end inside blocks and layers.
func TestGatherRoundTrip(t *testing.T) {
	for _, layout := range []string{"layer-first", "block-first"} {
		t.Run(layout, func(t *testing.T) {
			link := cudastream.H200Link()
			link.DtoDBytesPerSec = 2000 << 30
			f := newFixture(t, layout, link)
			e := f.engine(t, gatherConfig(MethodGather))
			same, chunks := roundTrip(t, f, e, 1)
			if !same {
				t.Fatal("blocks came back different through the gather/scatter path")
			}
			// 8 blocks of 8 pieces in chunks of 5 pieces: 13 chunks each way.
			if chunks != [2]int{13, 13} {
				t.Errorf("gather chunks: onboard %d, offload %d; want 13 each", chunks[0], chunks[1])
			}
			s := e.Stats()
			if s.GatherTransfers != 2 || s.GatherChunks != 26 {
				t.Errorf("stats: %d gather transfers, %d chunks; want 2 and 26", s.GatherTransfers, s.GatherChunks)
			}
			if s.KernelDescriptors != 0 {
				t.Errorf("the copy kernel moved %d descriptors over the link; the gather path's kernel copies only on the device", s.KernelDescriptors)
			}
			if got, want := e.GatherBytes(), int64(2*2*5*fxPart); got != want {
				t.Errorf("GatherBytes %d, want %d", got, want)
			}
		})
	}
}

// TestGatherStagingReuseWaits is invariant 3 for the device staging ring:
// the simulator moves bytes at a copy's modelled end, so a buffer refilled
// before the step that reads it has ended corrupts the blocks. Offloads
// are at risk when the link is slower than the gather kernel, onboards when
// the scatter kernel is slower than the link. With the waits removed the
// test must see the corruption, or it proves nothing.
func TestGatherStagingReuseWaits(t *testing.T) {
	slowLink := cudastream.LinkModel{HtoDBytesPerSec: 1 << 30, DtoHBytesPerSec: 1 << 30, DtoDBytesPerSec: 1000 << 30, KernelLaunch: time.Microsecond}
	slowKernel := cudastream.LinkModel{HtoDBytesPerSec: 50 << 30, DtoHBytesPerSec: 50 << 30, DtoDBytesPerSec: 1 << 30, KernelLaunch: 50 * time.Microsecond}
	for _, c := range []struct {
		name string
		link cudastream.LinkModel
	}{{"offload behind a slow link", slowLink}, {"onboard behind a slow scatter", slowKernel}} {
		for _, skip := range []bool{false, true} {
			f := newFixture(t, "block-first", c.link)
			e := f.engine(t, gatherConfig(MethodGather))
			e.skipGatherWait = skip
			same, _ := roundTrip(t, f, e, 2)
			switch {
			case !skip && !same:
				t.Errorf("%s: blocks corrupt with the waits in place", c.name)
			case skip && same:
				t.Errorf("%s: without the waits no block was corrupt: the test would not catch the overwrite", c.name)
			}
		}
	}
}

// TestGatherLayerEvents: through the scatter path, layer l's event
// completes after layer l-1's, layer 0's well before the last, and each
// layer's bytes are on the GPU when its event completes (a reader stream
// waits on the event and copies the layer out). With the events recorded
// after the DMAs instead of the scatters, the readers must see stale bytes.
// It runs on synctest's fake clock, which stands still while the test
// enqueues the readers (on the virtual clock the engine's completer would
// move time on as it waits for the layers).
func TestGatherLayerEvents(t *testing.T) {
	for _, early := range []bool{false, true} {
		synctest.Test(t, func(t *testing.T) { gatherLayerEvents(t, early) })
	}
}

func gatherLayerEvents(t *testing.T, early bool) {
	// A slow scatter, so that a reader let in after the DMAs would
	// find the layer's last chunk not yet in place.
	link := cudastream.H200Link()
	link.DtoDBytesPerSec = 1 << 30
	f := newFixtureClock(t, "layer-first", link, cudastream.SimWallClock)
	cfg := gatherConfig(MethodGather)
	cfg.GatherBufferBytes = 4 * fxPart
	e := f.engine(t, cfg)
	e.earlyLayerEvents = early
	rng := rand.New(rand.NewPCG(9, 9))
	fill(rng, f.host.Pool[:6*f.host.SlotBytes])
	pairs := make([]Pair, 6)
	for i, b := range rng.Perm(fxBlocks)[:6] {
		pairs[i] = Pair{GPUBlock: int32(b), HostSlot: int32(i)}
	}
	issued := f.sim.Clock().Now()
	tr, err := e.Onboard(context.Background(), pairs)
	if err != nil {
		t.Fatal(err)
	}
	// One reader per layer copies that layer of every block back once
	// the layer's event has completed, the last blocks first (the
	// layer's last chunk is scattered last).
	got := make([][]byte, fxLayers)
	readers := make([]cudastream.Stream, fxLayers)
	for l := range fxLayers {
		s, err := f.sim.NewStream(0)
		if err != nil {
			t.Fatal(err)
		}
		readers[l] = s
		if err := s.WaitEvent(tr.LayerEvent(l)); err != nil {
			t.Fatal(err)
		}
		got[l] = make([]byte, len(pairs)*fxParts*fxPart)
		for i := len(pairs) - 1; i >= 0; i-- {
			p := pairs[i]
			for part := range fxParts {
				off := (i*fxParts + part) * fxPart
				if err := s.CopyDtoH(got[l][off:off+fxPart], cudastream.DevicePtr(f.gpu.addr(p.GPUBlock, l, part))); err != nil {
					t.Fatal(err)
				}
			}
		}
	}
	<-tr.Done()
	stale := 0
	for l, s := range readers {
		if err := s.Synchronize(); err != nil {
			t.Fatal(err)
		}
		s.Destroy()
		for i, p := range pairs {
			for part := range fxParts {
				off := (i*fxParts + part) * fxPart
				host := f.host.Slot(p.HostSlot)[(l*fxParts+part)*fxPart:][:fxPart]
				if !bytes.Equal(got[l][off:off+fxPart], host) {
					stale++
				}
			}
		}
	}
	times := make([]time.Duration, fxLayers)
	for l := range times {
		times[l], _ = f.sim.EventTime(tr.LayerEvent(l))
	}
	tr.Release()
	if early {
		if stale == 0 {
			t.Error("layer events recorded after the DMAs: no reader saw stale bytes, so the test would not catch it")
		}
		return
	}
	if stale > 0 {
		t.Errorf("%d layer pieces were read stale after their layer's event", stale)
	}
	for l := 1; l < fxLayers; l++ {
		if times[l] <= times[l-1] {
			t.Errorf("layer %d ready at %v, not after layer %d at %v", l, times[l], l-1, times[l-1])
		}
	}
	if first, last := times[0]-issued, times[fxLayers-1]-issued; first > last/2 {
		t.Errorf("layer 0 ready %v after issue, the last layer %v: not well before", first, last)
	}
}

// TestAutoGathers: MethodAuto takes the gather path where the host side
// coalesces into long runs (whole blocks to consecutive slots, or one-layer
// blocks onboarded), and copies directly where it does not (scattered
// slots, or a multi-layer onboard, whose host pieces are strided).
func TestAutoGathers(t *testing.T) {
	consecutive := func(n int) []Pair {
		p := make([]Pair, n)
		for i := range p {
			p[i] = Pair{GPUBlock: int32(2 * i), HostSlot: int32(i)}
		}
		return p
	}
	scattered := func(n int) []Pair {
		p := consecutive(n)
		for i := range p {
			p[i].HostSlot = int32(2 * i)
		}
		return p
	}
	f := newFixture(t, "block-first", cudastream.H200Link())
	cfg := Config{GatherBuffers: 2, GatherBufferBytes: 256 << 10, GatherMinRunBytes: 128 << 10}
	e := f.engine(t, cfg)
	for _, c := range []struct {
		name    string
		offload bool
		pairs   []Pair
		gather  bool
	}{
		{"offload to 16 consecutive slots", true, consecutive(16), true},
		{"offload to 16 scattered slots", true, scattered(16), false},
		{"offload of 2 blocks (a 64 KiB run)", true, consecutive(2), false},
		{"onboard of 4-layer blocks from consecutive slots", false, consecutive(16), false},
	} {
		var tr *Transfer
		var err error
		if c.offload {
			tr, err = e.Offload(context.Background(), c.pairs, nil)
		} else {
			tr, err = e.Onboard(context.Background(), c.pairs)
		}
		if err != nil {
			t.Fatal(err)
		}
		<-tr.Done()
		if got := tr.GatherChunks() > 0; got != c.gather {
			t.Errorf("%s: gathered %v (%d chunks), want %v", c.name, got, tr.GatherChunks(), c.gather)
		}
		wait(t, tr)
	}

	// One layer of one part: an onboard's host pieces are whole slots, so
	// consecutive slots make one run.
	sim, err := cudastream.NewSim(cudastream.SimConfig{MemoryBytes: 8 << 20, Link: cudastream.H200Link()})
	if err != nil {
		t.Fatal(err)
	}
	defer sim.Close()
	region, _ := sim.Alloc(64 * 16 << 10)
	g, err := BlockFirstLayout(region, 1, 1, 64, 16<<10)
	if err != nil {
		t.Fatal(err)
	}
	pool, _ := sim.HostAlloc(32 * 16 << 10)
	cfg.GPU, cfg.Host = g, HostLayout{Pool: pool, SlotBytes: 16 << 10}
	e1, err := New(sim, cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer e1.Close()
	tr, err := e1.Onboard(context.Background(), consecutive(16))
	if err != nil {
		t.Fatal(err)
	}
	<-tr.Done()
	if tr.GatherChunks() == 0 {
		t.Error("a one-layer onboard of 16 consecutive slots (a 256 KiB run of 16 KiB pieces) did not gather")
	}
	wait(t, tr)
}

// TestGatherCancelled: a gather transfer whose context has ended issues
// nothing, still completes, and reports the context's error on every layer.
func TestGatherCancelled(t *testing.T) {
	f := newFixture(t, "block-first", cudastream.H200Link())
	e := f.engine(t, gatherConfig(MethodGather))
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	pairs := []Pair{{GPUBlock: 3, HostSlot: 0}, {GPUBlock: 9, HostSlot: 1}}
	for _, offload := range []bool{false, true} {
		var tr *Transfer
		var err error
		if offload {
			tr, err = e.Offload(ctx, pairs, nil)
		} else {
			tr, err = e.Onboard(ctx, pairs)
		}
		if err != nil {
			t.Fatal(err)
		}
		if err := tr.Wait(context.Background()); !errors.Is(err, context.Canceled) {
			t.Errorf("offload %v: Wait: %v, want context.Canceled", offload, err)
		}
		for l := range tr.Layers() {
			if err := tr.WaitLayer(context.Background(), l); !errors.Is(err, context.Canceled) {
				t.Errorf("WaitLayer(%d): %v, want context.Canceled", l, err)
			}
		}
		if tr.Bytes() != 0 || tr.GatherChunks() != 0 {
			t.Errorf("offload %v: a cancelled transfer issued %d bytes in %d chunks", offload, tr.Bytes(), tr.GatherChunks())
		}
		tr.Release()
	}
}

// TestGatherConfigErrors: each bad setting is refused by New, naming it.
func TestGatherConfigErrors(t *testing.T) {
	f := newFixture(t, "block-first", cudastream.LinkModel{})
	for _, c := range []struct {
		cfg  Config
		want string
	}{
		{Config{GatherBuffers: -1}, "Config.GatherBuffers must be in [0, 64]"},
		{Config{GatherBuffers: 65}, "Config.GatherBuffers must be in [0, 64]"},
		{Config{GatherBuffers: 2, GatherBufferBytes: -1}, "Config.GatherBufferBytes must not be negative"},
		{Config{GatherBuffers: 2, GatherBufferBytes: fxPart - 16}, "cannot hold one piece"},
		{Config{GatherMinRunBytes: -1}, "Config.GatherMinRunBytes must not be negative"},
		{Config{Method: MethodGather}, "Config.GatherBuffers is 0"},
		{Config{GatherBuffers: 64, GatherBufferBytes: 1 << 20}, "device staging buffers"},
	} {
		c.cfg.GPU, c.cfg.Host = f.gpu, f.host
		e, err := New(f.sim, c.cfg)
		if err == nil {
			e.Close()
			t.Errorf("%+v: New accepted it", c.cfg)
			continue
		}
		if !strings.Contains(err.Error(), c.want) {
			t.Errorf("%+v: %v; want it to say %q", c.cfg, err, c.want)
		}
	}
	if free, _, _ := f.sim.MemGetInfo(); free < 60<<20 {
		t.Errorf("after the refused configurations %d bytes of the simulator are free: a refusal leaked device memory", free)
	}
}

// TestGatherAllocatesPerTransferNotPerBlock: the ring's descriptors are
// reused, as the direct path's are.
func TestGatherAllocatesPerTransferNotPerBlock(t *testing.T) {
	f := newFixture(t, "layer-first", cudastream.LinkModel{})
	// One chunk holds every transfer here, so that both sizes make the same
	// device calls (the simulator allocates per call).
	e := f.engine(t, Config{Method: MethodGather, GatherBuffers: 2, GatherBufferBytes: fxSlots * f.gpu.BlockBytes()})
	measure := func(n int) float64 {
		pairs := make([]Pair, n)
		for i := range pairs {
			pairs[i] = Pair{GPUBlock: int32(i), HostSlot: int32(i)}
		}
		run := func() {
			for _, tr := range []func() (*Transfer, error){
				func() (*Transfer, error) { return e.Onboard(context.Background(), pairs) },
				func() (*Transfer, error) { return e.Offload(context.Background(), pairs, nil) },
			} {
				x, err := tr()
				if err != nil {
					t.Fatal(err)
				}
				<-x.Done()
				x.Release()
			}
		}
		run()
		return testing.AllocsPerRun(20, run)
	}
	one, many := measure(1), measure(fxSlots)
	if many > one {
		t.Errorf("allocations per gather round trip: %v for 1 block, %v for %d blocks", one, many, fxSlots)
	}
}
