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

// fixture is a simulated device with a GPU KV region and a host pool.
type fixture struct {
	sim    *cudastream.Sim
	gpu    GPULayout
	host   HostLayout
	region cudastream.DevicePtr
}

const (
	fxLayers = 4
	fxParts  = 2
	fxPart   = 4096
	fxBlocks = 64
	fxSlots  = 32
)

func newFixture(t *testing.T, layout string, link cudastream.LinkModel) *fixture {
	t.Helper()
	return newFixtureClock(t, layout, link, cudastream.SimVirtualClock)
}

// newFixtureClock is newFixture on the given clock; a wall-clock fixture
// belongs inside synctest.Test, whose fake time stands still while the test
// goroutine runs.
func newFixtureClock(t *testing.T, layout string, link cudastream.LinkModel, clock cudastream.SimClockKind) *fixture {
	t.Helper()
	sim, err := cudastream.NewSim(cudastream.SimConfig{MemoryBytes: 64 << 20, Link: link, Clock: clock})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { sim.Close() })
	f := &fixture{sim: sim}
	blockBytes := int64(fxLayers * fxParts * fxPart)
	if f.region, err = sim.Alloc(fxBlocks * blockBytes); err != nil {
		t.Fatal(err)
	}
	switch layout {
	case "layer-first":
		f.gpu, err = LayerFirstLayout(f.region, fxLayers, fxParts, fxBlocks, fxPart)
	case "block-first":
		f.gpu, err = BlockFirstLayout(f.region, fxLayers, fxParts, fxBlocks, fxPart)
	default:
		t.Fatalf("unknown layout %q", layout)
	}
	if err != nil {
		t.Fatal(err)
	}
	pool, err := sim.HostAlloc(fxSlots * blockBytes)
	if err != nil {
		t.Fatal(err)
	}
	f.host = HostLayout{Pool: pool, SlotBytes: blockBytes}
	return f
}

func (f *fixture) engine(t *testing.T, cfg Config) *Engine {
	t.Helper()
	cfg.GPU, cfg.Host = f.gpu, f.host
	if cfg.Now == nil {
		cfg.Now = f.sim.Clock().Now
	}
	return newTestEngine(t, f.sim, cfg)
}

// newTestEngine is New on dev, closed when t ends (a failed Close fails t).
func newTestEngine(t testing.TB, dev cudastream.Device, cfg Config) *Engine {
	t.Helper()
	e, err := New(dev, cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := e.Close(); err != nil {
			t.Errorf("Close: %v", err)
		}
	})
	return e
}

func fill(rng *rand.Rand, b []byte) {
	for i := range b {
		b[i] = byte(rng.Uint32())
	}
}

func wait(t *testing.T, tr *Transfer) {
	t.Helper()
	if err := tr.Wait(context.Background()); err != nil {
		t.Fatal(err)
	}
	tr.Release()
}

// TestRoundTrip onboards random slots into scattered GPU blocks, offloads
// them into other slots, and compares every byte, for both GPU layouts.
func TestRoundTrip(t *testing.T) {
	for _, layout := range []string{"layer-first", "block-first"} {
		t.Run(layout, func(t *testing.T) {
			f := newFixture(t, layout, cudastream.H200Link())
			e := f.engine(t, Config{MaxBatch: 7})
			rng := rand.New(rand.NewPCG(1, 1))
			fill(rng, f.host.Pool[:8*f.host.SlotBytes])
			in, out := roundTripPairs(rng)
			tr, err := e.Onboard(context.Background(), in)
			if err != nil {
				t.Fatal(err)
			}
			if tr.Layers() != fxLayers {
				t.Errorf("onboard has %d layer events, want %d", tr.Layers(), fxLayers)
			}
			wait(t, tr)
			tr, err = e.Offload(context.Background(), out, nil)
			if err != nil {
				t.Fatal(err)
			}
			<-tr.Done()
			if tr.Bytes() != 8*f.gpu.BlockBytes() {
				t.Errorf("offload issued %d bytes, want %d", tr.Bytes(), 8*f.gpu.BlockBytes())
			}
			if layout == "block-first" && tr.Copies() > 8 {
				t.Errorf("block-first offload of 8 blocks used %d copies; whole blocks should coalesce", tr.Copies())
			}
			wait(t, tr)
			for i := range 8 {
				if !bytes.Equal(f.host.Slot(int32(i)), f.host.Slot(int32(16+i))) {
					t.Fatalf("slot %d came back different", i)
				}
			}
		})
	}
}

// TestLayerEventsCompleteInOrder checks that layer l is ready before layer
// l+1 on the modelled link, that layer 0 is ready well before the last
// layer (so that a compute stream waiting on layer 0's event starts while
// later layers still load), and that the host-side WaitLayer returns when
// its layer lands, not when the transfer does. It runs on synctest's fake
// clock: time stands still while the test issues, so the timeline is exact.
func TestLayerEventsCompleteInOrder(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		f := newFixtureClock(t, "layer-first", cudastream.H200Link(), cudastream.SimWallClock)
		e := f.engine(t, Config{})
		compute, err := f.sim.NewStream(0)
		if err != nil {
			t.Fatal(err)
		}
		defer compute.Destroy()
		started, _ := f.sim.NewEvent(cudastream.EventOptions{})
		defer started.Destroy()

		issued := f.sim.Clock().Now()
		tr, err := e.Onboard(context.Background(), []Pair{{1, 0}, {5, 1}, {9, 2}})
		if err != nil {
			t.Fatal(err)
		}
		if err := compute.WaitEvent(tr.LayerEvent(0)); err != nil {
			t.Fatal(err)
		}
		if err := started.Record(compute); err != nil {
			t.Fatal(err)
		}
		if err := tr.WaitLayer(context.Background(), 0); err != nil {
			t.Fatal(err)
		}
		layer0 := f.sim.Clock().Now()
		if ready, _ := tr.LayerReady(tr.Layers() - 1); ready {
			t.Errorf("WaitLayer(0) returned at %v, after the last layer had landed", layer0)
		}
		<-tr.Done()
		if err := compute.Synchronize(); err != nil {
			t.Fatal(err)
		}
		times := make([]time.Duration, tr.Layers())
		for l := range times {
			end, ok := f.sim.EventTime(tr.LayerEvent(l))
			if !ok {
				t.Fatalf("layer %d event has no time after the transfer is done", l)
			}
			if l > 0 && end <= times[l-1] {
				t.Fatalf("layer %d ready at %v, not after layer %d at %v", l, end, l-1, times[l-1])
			}
			times[l] = end
		}
		first, last := times[0]-issued, times[len(times)-1]-issued
		// Equal layers on one link: layer 0 lands after about 1/Layers of
		// the transfer. Half is "well before"; a transfer that readied its
		// layers together (as one event) fails here.
		if first > last/2 {
			t.Errorf("layer 0 ready %v after issue, the last layer %v: not well before", first, last)
		}
		if layer0 != times[0] {
			t.Errorf("WaitLayer(0) returned at %v, layer 0 landed at %v", layer0, times[0])
		}
		s, _ := f.sim.EventTime(started)
		if s < times[0] || s >= times[len(times)-1] {
			t.Errorf("compute started at %v; layer 0 ready at %v, last layer at %v", s, times[0], times[len(times)-1])
		}
		if err := tr.WaitLayer(context.Background(), tr.Layers()); err == nil {
			t.Error("WaitLayer past the last layer returned nil")
		}
		tr.Release()
	})
}

// TestOffloadWaitsForProducer: the offload must copy what the server's
// step produced, so it waits on the step's event, not on the host.
func TestOffloadWaitsForProducer(t *testing.T) {
	for _, waitForProducer := range []bool{true, false} {
		f := newFixture(t, "block-first", cudastream.H200Link())
		e := f.engine(t, Config{})
		// The "step" writes block 3 on the compute stream: a slow copy of
		// fresh KV from a scratch allocation.
		scratch, err := f.sim.Alloc(f.gpu.BlockBytes())
		if err != nil {
			t.Fatal(err)
		}
		fresh := make([]byte, f.gpu.BlockBytes())
		fill(rand.New(rand.NewPCG(2, 2)), fresh)
		compute, _ := f.sim.NewStream(0)
		if err := compute.CopyHtoD(scratch, fresh); err != nil { // pageable: slow
			t.Fatal(err)
		}
		if err := compute.CopyDtoD(f.gpu.Base[0]+3*cudastream.DevicePtr(f.gpu.BlockStride), scratch, f.gpu.BlockBytes()); err != nil {
			t.Fatal(err)
		}
		step, _ := f.sim.NewEvent(cudastream.EventOptions{})
		if err := step.Record(compute); err != nil {
			t.Fatal(err)
		}
		var after cudastream.Event
		if waitForProducer {
			after = step
		}
		tr, err := e.Offload(context.Background(), []Pair{{3, 0}}, after)
		if err != nil {
			t.Fatal(err)
		}
		wait(t, tr)
		got := bytes.Equal(f.host.Slot(0), fresh)
		if waitForProducer && !got {
			t.Error("offload waiting on the step's event copied stale KV")
		}
		if !waitForProducer && got {
			t.Error("an offload that does not wait saw the step's KV: the test cannot tell the difference")
		}
		compute.Synchronize()
		compute.Destroy()
		step.Destroy()
	}
}

// blockSource serves deterministic blocks and can cancel mid-way.
type blockSource struct {
	size     int64
	cancelAt int
	cancel   context.CancelFunc
	reads    int
}

func blockBytes(i int, size int64) []byte {
	b := make([]byte, size)
	fill(rand.New(rand.NewPCG(uint64(i), 99)), b)
	return b
}

func (s *blockSource) ReadBlock(ctx context.Context, i int, dst []byte) error {
	if s.cancel != nil && i == s.cancelAt {
		s.cancel()
	}
	if err := ctx.Err(); err != nil {
		return err
	}
	s.reads++
	copy(dst, blockBytes(i, s.size))
	return nil
}

func (f *fixture) stagingEngine(t *testing.T, depth, slotsEach int) *Engine {
	t.Helper()
	var staging [][]byte
	for range depth {
		b, err := f.sim.HostAlloc(int64(slotsEach) * f.host.SlotBytes)
		if err != nil {
			t.Fatal(err)
		}
		staging = append(staging, b)
	}
	return f.engine(t, Config{Staging: staging})
}

func (f *fixture) gpuBlock(t *testing.T, b int32) []byte {
	t.Helper()
	got := make([]byte, f.gpu.BlockBytes())
	s, _ := f.sim.NewStream(0)
	defer s.Destroy()
	if err := s.CopyDtoH(got, f.gpu.Base[0]+cudastream.DevicePtr(int64(b)*f.gpu.BlockStride)); err != nil {
		t.Fatal(err)
	}
	if err := s.Synchronize(); err != nil {
		t.Fatal(err)
	}
	return got
}

// TestStagingReuseWaitsForTheCopy is invariant 3 for the staging ring: the
// simulator moves bytes at the copy's modelled end, so a buffer overwritten
// before then corrupts the GPU block. The same test with the wait removed
// must see the corruption, or it proves nothing.
func TestStagingReuseWaitsForTheCopy(t *testing.T) {
	for _, skip := range []bool{false, true} {
		f := newFixture(t, "block-first", cudastream.H200Link())
		e := f.stagingEngine(t, 2, 1)
		e.skipStagingWait = skip
		src := &blockSource{size: f.host.SlotBytes}
		blocks := []int32{10, 3, 7, 20, 1, 40}
		tr, err := e.OnboardStaged(context.Background(), src, blocks)
		if err != nil {
			t.Fatal(err)
		}
		if tr.Layers() != fxLayers {
			t.Fatalf("a staged onboard has %d layer events, want %d", tr.Layers(), fxLayers)
		}
		for l := range tr.Layers() { // every layer lands with the last block
			if err := tr.WaitLayer(context.Background(), l); err != nil {
				t.Fatalf("staged WaitLayer(%d): %v", l, err)
			}
		}
		if ready, err := tr.LayerReady(fxLayers - 1); !ready || err != nil {
			t.Fatalf("staged: last layer ready %v (%v) after WaitLayer", ready, err)
		}
		wait(t, tr)
		corrupt := 0
		for i, b := range blocks {
			if !bytes.Equal(f.gpuBlock(t, b), blockBytes(i, f.host.SlotBytes)) {
				corrupt++
			}
		}
		switch {
		case !skip && corrupt > 0:
			t.Errorf("%d of %d staged blocks corrupt with the wait in place", corrupt, len(blocks))
		case skip && corrupt == 0:
			t.Error("without the wait no block was corrupt: the test would not catch the overwrite bug")
		}
		if !skip && e.Stats().StagingWaits == 0 {
			t.Error("a 6-block staged onboard through 2 one-slot buffers never waited")
		}
	}
}

// TestCancelStopsIssuingAndWaitsForInFlight cancels a staged onboard half way.
func TestCancelStopsIssuingAndWaitsForInFlight(t *testing.T) {
	f := newFixture(t, "block-first", cudastream.H200Link())
	e := f.stagingEngine(t, 2, 1)
	ctx, cancel := context.WithCancel(context.Background())
	src := &blockSource{size: f.host.SlotBytes, cancelAt: 3, cancel: cancel}
	tr, err := e.OnboardStaged(ctx, src, []int32{0, 1, 2, 3, 4, 5})
	if err != nil {
		t.Fatal(err)
	}
	<-tr.Done()
	if !errors.Is(tr.Err(), context.Canceled) {
		t.Fatalf("cancelled transfer reports %v", tr.Err())
	}
	if src.reads != 3 {
		t.Errorf("read %d blocks after cancelling at the 4th", src.reads)
	}
	// What was issued completed before Done: the three blocks are there.
	for i := range 3 {
		if !bytes.Equal(f.gpuBlock(t, int32(i)), blockBytes(i, f.host.SlotBytes)) {
			t.Errorf("block %d, issued before the cancel, is not on the device", i)
		}
	}
	tr.Release()

	// An onboard whose context is already done issues nothing.
	before := e.Stats().Descriptors
	tr, err = e.Onboard(ctx, []Pair{{0, 0}})
	if err != nil {
		t.Fatal(err)
	}
	if err := tr.Wait(context.Background()); !errors.Is(err, context.Canceled) {
		t.Errorf("onboard with a done context: %v", err)
	}
	if n := e.Stats().Descriptors; n != before {
		t.Errorf("onboard with a done context issued %d descriptors", n-before)
	}
	tr.Release()
}

func TestBadInputChangesNothing(t *testing.T) {
	f := newFixture(t, "layer-first", cudastream.H200Link())
	e := f.engine(t, Config{})
	if _, err := e.Onboard(context.Background(), []Pair{{0, 0}, {fxBlocks, 1}}); err == nil || !strings.Contains(err.Error(), "pair 1") {
		t.Errorf("onboard of a block outside the layout: %v", err)
	}
	if _, err := e.Offload(context.Background(), []Pair{{0, fxSlots}}, nil); err == nil || !strings.Contains(err.Error(), "host slot") {
		t.Errorf("offload into a slot outside the pool: %v", err)
	}
	if _, err := e.OnboardStaged(context.Background(), &blockSource{}, []int32{1}); err == nil || !strings.Contains(err.Error(), "staging") {
		t.Errorf("staged onboard without staging buffers: %v", err)
	}
	if n := e.Stats().Descriptors + e.Stats().Transfers; n != 0 {
		t.Errorf("rejected input issued work: %d", n)
	}

	for _, tc := range []struct {
		name string
		cfg  Config
		want string
	}{
		{"small slots", Config{GPU: f.gpu, Host: HostLayout{Pool: f.host.Pool, SlotBytes: 16}}, "SlotBytes"},
		{"empty pool", Config{GPU: f.gpu, Host: HostLayout{SlotBytes: f.host.SlotBytes}}, "holds no slot"},
		{"small staging", Config{GPU: f.gpu, Host: f.host, Staging: [][]byte{make([]byte, 8)}}, "Staging[0]"},
		{"negative batch", Config{GPU: f.gpu, Host: f.host, MaxBatch: -1}, "MaxBatch"},
		{"slot straddles a registration", Config{GPU: f.gpu, Host: HostLayout{Pool: f.host.Pool, SlotBytes: f.host.SlotBytes, RegistrationBytes: f.host.SlotBytes + 4096}}, "RegistrationBytes"},
		{"pool starts mid-slot in its registration", Config{GPU: f.gpu, Host: HostLayout{Pool: f.host.Pool, SlotBytes: f.host.SlotBytes, RegistrationBytes: 2 * f.host.SlotBytes, RegistrationOffset: 4096}}, "RegistrationOffset"},
		{"offset past the registration", Config{GPU: f.gpu, Host: HostLayout{Pool: f.host.Pool, SlotBytes: f.host.SlotBytes, RegistrationBytes: 2 * f.host.SlotBytes, RegistrationOffset: 2 * f.host.SlotBytes}}, "RegistrationOffset"},
		{"bad layout", Config{Host: f.host}, "Layers"},
	} {
		if _, err := New(f.sim, tc.cfg); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: New = %v, want an error naming %q", tc.name, err, tc.want)
		}
	}
}

// TestCopyErrorNamesTheDescriptor: a pool the device does not know (not
// registered) makes the batched copy fail, and the error says where.
func TestCopyErrorNamesTheDescriptor(t *testing.T) {
	f := newFixture(t, "block-first", cudastream.H200Link())
	f.host.Pool = make([]byte, len(f.host.Pool)) // pageable, unregistered
	e := f.engine(t, Config{})
	tr, err := e.Onboard(context.Background(), []Pair{{2, 0}})
	if err != nil {
		t.Fatal(err)
	}
	err = tr.Wait(context.Background())
	if !errors.Is(err, cudastream.ErrNotRegistered) || !strings.Contains(err.Error(), "descriptors 0..0 (from pair 0)") {
		t.Errorf("error = %v", err)
	}
	tr.Release()
}

// TestSubmissionAllocatesPerTransferNotPerBlock: a transfer of 32 blocks
// allocates no more than a transfer of 1.
func TestSubmissionAllocatesPerTransferNotPerBlock(t *testing.T) {
	f := newFixture(t, "layer-first", cudastream.LinkModel{})
	e := f.engine(t, Config{})
	measure := func(n int) float64 {
		pairs := make([]Pair, n)
		for i := range pairs {
			pairs[i] = Pair{GPUBlock: int32(i), HostSlot: int32(i)}
		}
		run := func() {
			tr, err := e.Onboard(context.Background(), pairs)
			if err != nil {
				t.Fatal(err)
			}
			<-tr.Done()
			tr.Release()
		}
		run() // grow the reusable buffers first
		return testing.AllocsPerRun(20, run)
	}
	one, many := measure(1), measure(fxSlots)
	if many > one {
		t.Errorf("allocations per onboard: %v for 1 block, %v for %d blocks", one, many, fxSlots)
	}
}

// TestSubmissionsAfterCloseAreRefused: every way in returns ErrClosed and
// issues nothing once the engine is closed.
func TestSubmissionsAfterCloseAreRefused(t *testing.T) {
	f := newFixture(t, "block-first", cudastream.H200Link())
	e := f.stagingEngine(t, 2, 1)
	if err := e.Close(); err != nil {
		t.Fatal(err)
	}
	if _, err := e.Onboard(context.Background(), []Pair{{0, 0}}); !errors.Is(err, ErrClosed) {
		t.Errorf("Onboard after Close: %v", err)
	}
	if _, err := e.Offload(context.Background(), []Pair{{0, 0}}, nil); !errors.Is(err, ErrClosed) {
		t.Errorf("Offload after Close: %v", err)
	}
	if _, err := e.OnboardStaged(context.Background(), &blockSource{size: f.host.SlotBytes}, []int32{0}); !errors.Is(err, ErrClosed) {
		t.Errorf("OnboardStaged after Close: %v", err)
	}
	if n := e.Stats().Transfers; n != 0 {
		t.Errorf("%d transfers issued after Close", n)
	}
}
