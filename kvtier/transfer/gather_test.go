package transfer

import (
	"bytes"
	"context"
	"errors"
	"math/rand/v2"
	"slices"
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

// roundTripPairs maps 8 random GPU blocks to host slots 0-7 (in) and
// 16-23 (out).
func roundTripPairs(rng *rand.Rand) (in, out []Pair) {
	in, out = make([]Pair, 8), make([]Pair, 8)
	for i, b := range rng.Perm(fxBlocks)[:8] {
		in[i] = Pair{GPUBlock: int32(b), HostSlot: int32(i)}
		out[i] = Pair{GPUBlock: int32(b), HostSlot: int32(16 + i)}
	}
	return in, out
}

// roundTrip onboards 8 random host slots into scattered GPU blocks and
// offloads them into 8 other slots, and reports whether every byte came
// back, with the two transfers' gather chunks.
func roundTrip(t *testing.T, f *fixture, e *Engine, seed uint64) (same bool, chunks [2]int) {
	t.Helper()
	rng := rand.New(rand.NewPCG(seed, 3))
	fill(rng, f.host.Pool[:8*f.host.SlotBytes])
	clear(f.host.Pool[16*f.host.SlotBytes : 24*f.host.SlotBytes])
	in, out := roundTripPairs(rng)
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
			// Offload: 8 whole blocks of 8 pieces, longer than a chunk of 5
			// pieces, cut to fill each: 13 chunks. Onboard: 32 rows of
			// one layer's 2 pieces, which are not cut: 2 per chunk, 16.
			if chunks != [2]int{16, 13} {
				t.Errorf("gather chunks: onboard %d, offload %d; want 16 and 13", chunks[0], chunks[1])
			}
			s := e.Stats()
			if s.GatherTransfers != 2 || s.GatherChunks != 29 {
				t.Errorf("stats: %d gather transfers, %d chunks; want 2 and 29", s.GatherTransfers, s.GatherChunks)
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
// coalesces into long runs (whole blocks to consecutive slots; one layer's
// pieces of consecutive slots, strided by the slot, as one strided copy),
// and copies directly where it does not (scattered slots).
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
		copies  int // link copies, where checked
	}{
		// 512 KiB in two chunks, one DMA each.
		{"offload to 16 consecutive slots", true, consecutive(16), true, 2},
		{"offload to 16 scattered slots", true, scattered(16), false, 0},
		{"offload of 2 blocks (a 64 KiB run)", true, consecutive(2), false, 0},
		// Each layer's 16 pieces of 8 KiB, 32 KiB apart on the host: one
		// strided copy per layer.
		{"onboard of 4-layer blocks from consecutive slots", false, consecutive(16), true, 4},
		{"onboard of 4-layer blocks from scattered slots", false, scattered(16), false, 0},
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
		if c.copies > 0 && tr.Copies() != c.copies {
			t.Errorf("%s: %d link copies, want %d", c.name, tr.Copies(), c.copies)
		}
		wait(t, tr)
	}

	// Large GPU pieces go to batches (here 32 KiB blocks against a 16 KiB
	// switch), however long the host runs.
	big := f.engine(t, Config{GatherBuffers: 2, GatherBufferBytes: 256 << 10, GatherMinRunBytes: 128 << 10, GatherBelowBytes: 16 << 10})
	tr, err := big.Offload(context.Background(), consecutive(16))
	if err != nil {
		t.Fatal(err)
	}
	<-tr.Done()
	if tr.GatherChunks() != 0 {
		t.Errorf("an offload of 32 KiB blocks with GatherBelowBytes 16 KiB gathered (%d chunks)", tr.GatherChunks())
	}
	wait(t, tr)

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
	tr, err = e1.Onboard(context.Background(), consecutive(16))
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
		{Config{GatherBelowBytes: -1}, "Config.GatherBelowBytes must not be negative"},
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

// TestLinkOpsMerge: a chunk's link copies merge a row that continues the
// last into a longer one, and a row of the same width one slot further
// into one more row of a strided copy; nothing merges across a split (a
// new registration), a gap other than the slot, or a change of width.
func TestLinkOpsMerge(t *testing.T) {
	const slot = 1 << 20
	type row struct {
		host  uint64
		n     int64
		split bool
	}
	for _, c := range []struct {
		name    string
		offload bool
		rows    []row
		want    []cudastream.Copy2D
	}{
		{"contiguous rows make one", false, []row{{0, 100, false}, {100, 50, false}},
			[]cudastream.Copy2D{{Dst: 1 << 40, Src: 0, DstPitch: 150, SrcPitch: 150, Width: 150, Height: 1}}},
		{"rows a slot apart make a strided copy", false, []row{{0, 64, false}, {slot, 64, false}, {2 * slot, 64, false}},
			[]cudastream.Copy2D{{Dst: 1 << 40, Src: 0, DstPitch: 64, SrcPitch: slot, Width: 64, Height: 3}}},
		{"offload: the host pitch is the destination's", true, []row{{0, 64, false}, {slot, 64, false}},
			[]cudastream.Copy2D{{Dst: 0, Src: 1 << 40, DstPitch: slot, SrcPitch: 64, Width: 64, Height: 2}}},
		{"a split starts a new copy", false, []row{{0, 64, false}, {slot, 64, true}},
			[]cudastream.Copy2D{{Dst: 1 << 40, Src: 0, DstPitch: 64, SrcPitch: 64, Width: 64, Height: 1}, {Dst: 1<<40 + 64, Src: slot, DstPitch: 64, SrcPitch: 64, Width: 64, Height: 1}}},
		{"two slots apart is not a row", false, []row{{0, 64, false}, {2 * slot, 64, false}},
			[]cudastream.Copy2D{{Dst: 1 << 40, Src: 0, DstPitch: 64, SrcPitch: 64, Width: 64, Height: 1}, {Dst: 1<<40 + 64, Src: 2 * slot, DstPitch: 64, SrcPitch: 64, Width: 64, Height: 1}}},
		{"another width is not a row", false, []row{{0, 64, false}, {slot, 32, false}},
			[]cudastream.Copy2D{{Dst: 1 << 40, Src: 0, DstPitch: 64, SrcPitch: 64, Width: 64, Height: 1}, {Dst: 1<<40 + 64, Src: slot, DstPitch: 32, SrcPitch: 32, Width: 32, Height: 1}}},
	} {
		l := linkOps{offload: c.offload, slot: slot}
		stage := uint64(1 << 40)
		for i, r := range c.rows {
			l.add(stage, r.host, r.n, i, r.split)
			stage += uint64(r.n)
		}
		if !slices.Equal(l.ops, c.want) {
			t.Errorf("%s: ops %+v, want %+v", c.name, l.ops, c.want)
		}
		var want int64
		for _, r := range c.rows {
			want += r.n
		}
		if l.bytes() != want {
			t.Errorf("%s: %d bytes, want %d", c.name, l.bytes(), want)
		}
	}
	// Without strided copies (slot 0), rows a slot apart stay apart.
	l := linkOps{}
	l.add(1<<40, 0, 64, 0, false)
	l.add(1<<40+64, slot, 64, 1, false)
	if len(l.ops) != 2 {
		t.Errorf("without strided copies: %d ops, want 2", len(l.ops))
	}
}

// TestGatherPairsReusable: the gather path submits on a goroutine of its
// own, but the caller may reuse its pairs as soon as Onboard or Offload
// returns: overwriting them at once changes nothing that moves.
func TestGatherPairsReusable(t *testing.T) {
	f := newFixture(t, "block-first", cudastream.H200Link())
	e := f.engine(t, gatherConfig(MethodGather))
	rng := rand.New(rand.NewPCG(4, 4))
	fill(rng, f.host.Pool[:8*f.host.SlotBytes])
	pairs := make([]Pair, 8)
	blocks := rng.Perm(fxBlocks)[:8]
	for i, b := range blocks {
		pairs[i] = Pair{GPUBlock: int32(b), HostSlot: int32(i)}
	}
	tr, err := e.Onboard(context.Background(), pairs)
	if err != nil {
		t.Fatal(err)
	}
	for i := range pairs {
		pairs[i] = Pair{GPUBlock: 0, HostSlot: 31}
	}
	wait(t, tr)
	for i, b := range blocks {
		pairs[i] = Pair{GPUBlock: int32(b), HostSlot: int32(16 + i)}
	}
	if tr, err = e.Offload(context.Background(), pairs); err != nil {
		t.Fatal(err)
	}
	for i := range pairs {
		pairs[i] = Pair{GPUBlock: 1, HostSlot: 30}
	}
	wait(t, tr)
	if !bytes.Equal(f.host.Pool[:8*f.host.SlotBytes], f.host.Pool[16*f.host.SlotBytes:24*f.host.SlotBytes]) {
		t.Fatal("pairs overwritten after Onboard and Offload returned changed what moved")
	}
}
