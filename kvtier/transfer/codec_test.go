package transfer

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"strings"
	"sync"
	"testing"
	"time"

	"kvtier.dev/cudastream"
	"kvtier.dev/kvtier/codec"
)

// fxShape is the fixture's block as the codec sees it: 4 layers of K and
// V, each 4 tokens × 2 heads × 256 values of bf16 (fxPart bytes).
var fxShape = codec.Shape{Layers: fxLayers, Parts: fxParts, Tokens: 4, Heads: 2, HeadDim: 256}

func codecConfig(chunk int) Config {
	return Config{Codec: codec.FP8E4M3PerHead, CodecShape: fxShape, CodecChunkBlocks: chunk, MaxBatch: 5}
}

func encodedBytes(t testing.TB) int64 {
	t.Helper()
	n, err := codec.EncodedBytes(codec.FP8E4M3PerHead, fxShape)
	if err != nil {
		t.Fatal(err)
	}
	return n
}

// putGPUBlock writes b into GPU block blk of f's layout, piece by piece.
func (f *fixture) putGPUBlock(t *testing.T, blk int32, b []byte) {
	t.Helper()
	s, _ := f.sim.NewStream(0)
	defer s.Destroy()
	for lp := range fxLayers * fxParts {
		dst := cudastream.DevicePtr(f.gpu.addr(blk, lp/fxParts, lp%fxParts))
		if err := s.CopyHtoD(dst, b[lp*fxPart:(lp+1)*fxPart]); err != nil {
			t.Fatal(err)
		}
	}
	if err := s.Synchronize(); err != nil {
		t.Fatal(err)
	}
}

// getGPUBlock reads GPU block blk of f's layout, in (layer, part) order.
func (f *fixture) getGPUBlock(t *testing.T, blk int32) []byte {
	t.Helper()
	got := make([]byte, f.gpu.BlockBytes())
	s, _ := f.sim.NewStream(0)
	defer s.Destroy()
	for lp := range fxLayers * fxParts {
		src := cudastream.DevicePtr(f.gpu.addr(blk, lp/fxParts, lp%fxParts))
		if err := s.CopyDtoH(got[lp*fxPart:(lp+1)*fxPart], src); err != nil {
			t.Fatal(err)
		}
	}
	if err := s.Synchronize(); err != nil {
		t.Fatal(err)
	}
	return got
}

// codedBlock is one random bf16 block, encoded, and what decoding gives.
type codedBlock struct{ raw, enc, back []byte }

func newCodedBlock(t *testing.T, rng *rand.Rand) codedBlock {
	t.Helper()
	c := codedBlock{raw: make([]byte, fxShape.BlockBytes()), enc: make([]byte, encodedBytes(t)), back: make([]byte, fxShape.BlockBytes())}
	fill(rng, c.raw)
	if err := codec.Encode(codec.FP8E4M3PerHead, fxShape, c.enc, c.raw); err != nil {
		t.Fatal(err)
	}
	if err := codec.Decode(codec.FP8E4M3PerHead, fxShape, c.back, c.enc); err != nil {
		t.Fatal(err)
	}
	return c
}

// codecRoundTrip offloads n random blocks from scattered GPU blocks into
// scattered host slots, checks each slot holds codec.Encode of its block,
// onboards the slots into other GPU blocks, and checks each holds
// codec.Decode(codec.Encode(block)).
func codecRoundTrip(t *testing.T, f *fixture, e *Engine, n int, seed uint64) {
	t.Helper()
	rng := rand.New(rand.NewPCG(seed, 37))
	blocks := make([]codedBlock, n)
	gpu := rng.Perm(fxBlocks)
	slots := rng.Perm(f.host.Slots())
	out, in := make([]Pair, n), make([]Pair, n)
	for i := range blocks {
		blocks[i] = newCodedBlock(t, rng)
		f.putGPUBlock(t, int32(gpu[i]), blocks[i].raw)
		out[i] = Pair{GPUBlock: int32(gpu[i]), HostSlot: int32(slots[i])}
		in[i] = Pair{GPUBlock: int32(gpu[n+i]), HostSlot: int32(slots[i])}
	}
	tr, err := e.Offload(context.Background(), out)
	if err != nil {
		t.Fatal(err)
	}
	if want := int64(n) * encodedBytes(t); tr.Bytes() != want {
		t.Errorf("offload moved %d bytes over the link, want %d (encoded)", tr.Bytes(), want)
	}
	wait(t, tr)
	for i, p := range out {
		if got := f.host.Slot(p.HostSlot)[:len(blocks[i].enc)]; !bytes.Equal(got, blocks[i].enc) {
			t.Fatalf("host slot %d (GPU block %d) differs from codec.Encode of the block at byte %d", p.HostSlot, p.GPUBlock, firstDiff(got, blocks[i].enc))
		}
	}
	tr, err = e.Onboard(context.Background(), in)
	if err != nil {
		t.Fatal(err)
	}
	if tr.Layers() != fxLayers {
		t.Errorf("onboard has %d layer events, want %d", tr.Layers(), fxLayers)
	}
	wait(t, tr)
	for i, p := range in {
		if got := f.getGPUBlock(t, p.GPUBlock); !bytes.Equal(got, blocks[i].back) {
			t.Fatalf("GPU block %d (from slot %d) differs from codec.Decode(codec.Encode(block)) at byte %d", p.GPUBlock, p.HostSlot, firstDiff(got, blocks[i].back))
		}
	}
}

func firstDiff(a, b []byte) int {
	for i := range min(len(a), len(b)) {
		if a[i] != b[i] {
			return i
		}
	}
	return min(len(a), len(b))
}

// TestCodecRoundTrip: GPU -> host -> GPU through the codec path equals
// the Go reference byte for byte, for both layouts, chunks that divide
// the transfer or not, padded slots and slots of exactly the encoded size
// (whose copies merge), and onboards in 1, 2 or 4 groups of layers (each
// group after the first copying the blocks' scales again).
func TestCodecRoundTrip(t *testing.T) {
	for _, layout := range []string{"layer-first", "block-first"} {
		for _, chunk := range []int{1, 3, 8} {
			for _, exact := range []bool{false, true} {
				for _, groups := range []int{1, 2, fxLayers} {
					name := fmt.Sprintf("%s/chunk%d/groups%d", layout, chunk, groups)
					if exact {
						name += "/exact-slots"
					}
					t.Run(name, func(t *testing.T) {
						f := newFixture(t, layout, cudastream.H200Link())
						if exact {
							f.host.SlotBytes = encodedBytes(t)
						}
						cfg := codecConfig(chunk)
						cfg.CodecLayerGroups = groups
						e := f.engine(t, cfg)
						if e.CodecKernels() != "go" {
							t.Errorf("CodecKernels() = %q on the simulator, want go", e.CodecKernels())
						}
						before := e.Stats().OnboardBytes
						codecRoundTrip(t, f, e, 10, uint64(chunk))
						chunks := int64((10 + chunk - 1) / chunk)
						if got, want := e.Stats().CodecChunks, chunks*int64(1+groups); got != want {
							t.Errorf("CodecChunks = %d, want %d (%d chunks out, %d in each of %d groups)", got, want, chunks, chunks, groups)
						}
						want := 10 * (encodedBytes(t) + int64(groups-1)*fxShape.ScaleBytes())
						if got := e.Stats().OnboardBytes - before; got != want {
							t.Errorf("the onboard moved %d bytes, want %d (encoded blocks, the scales again for each group after the first)", got, want)
						}
					})
				}
			}
		}
	}
}

// TestCodecLayersLandInGroups: on the virtual clock, an onboard in groups
// of layers makes each group's layers ready together, group after group,
// the first well before the transfer ends; in one group every layer is
// ready only at the end.
func TestCodecLayersLandInGroups(t *testing.T) {
	for _, groups := range []int{1, 2, fxLayers} {
		f := newFixture(t, "block-first", cudastream.H200Link())
		cfg := codecConfig(4)
		cfg.Polled, cfg.CodecLayerGroups = true, groups
		e := f.engine(t, cfg)
		rng := rand.New(rand.NewPCG(7, uint64(groups)))
		var in []Pair
		for i := range 12 {
			b := newCodedBlock(t, rng)
			copy(f.host.Slot(int32(i)), b.enc)
			in = append(in, Pair{GPUBlock: int32(20 + i), HostSlot: int32(i)})
		}
		start := f.sim.Clock().Now()
		tr, err := e.Onboard(context.Background(), in)
		if err != nil {
			t.Fatal(err)
		}
		f.settle(t, e, tr)
		ready := make([]time.Duration, fxLayers)
		for l := range ready {
			at, ok := f.sim.EventTime(tr.LayerEvent(l))
			if !ok {
				t.Fatalf("%d groups: layer %d's event has no time once the device is idle", groups, l)
			}
			ready[l] = at - start
		}
		tr.Release()
		// A group's layer events are recorded one after another, each
		// taking the link model's event cost: together, not at once.
		end, together := ready[fxLayers-1], 4*cudastream.H200Link().EventCost
		for g, lr := range layerGroups(fxLayers, groups) {
			for l := lr.First; l < lr.First+lr.Count; l++ {
				if d := ready[l] - ready[lr.First]; d < 0 || d > together {
					t.Errorf("%d groups: layer %d ready at %v, layer %d of its group at %v", groups, l, ready[l], lr.First, ready[lr.First])
				}
			}
			if g > 0 && !(ready[lr.First]-ready[lr.First-1] > together) {
				t.Errorf("%d groups: group %d ready at %v, not after the one before (%v)", groups, g, ready[lr.First], ready[lr.First-1])
			}
		}
		if share := float64(ready[0]) / float64(end); groups > 1 && !(share < 1/float64(groups)+0.25) {
			t.Errorf("%d groups: layer 0 ready at %v of the transfer's %v (%.2f), want before %.2f", groups, ready[0], end, share, 1/float64(groups)+0.25)
		}
		if groups == 1 && end-ready[0] > together {
			t.Errorf("one group: layer 0 ready at %v, want with the last at %v", ready[0], end)
		}
	}
}

// TestCodecPolledRoundTrip: the same on a polled engine, stepped on the
// virtual clock as the replay does.
func TestCodecPolledRoundTrip(t *testing.T) {
	f := newFixture(t, "layer-first", cudastream.H200Link())
	cfg := codecConfig(3)
	cfg.Polled = true
	e := f.engine(t, cfg)
	rng := rand.New(rand.NewPCG(5, 5))
	b := newCodedBlock(t, rng)
	f.putGPUBlock(t, 9, b.raw)
	tr, err := e.Offload(context.Background(), []Pair{{GPUBlock: 9, HostSlot: 4}})
	if err != nil {
		t.Fatal(err)
	}
	for {
		if _, ok := f.step(t, e); !ok {
			break
		}
	}
	select {
	case <-tr.Done():
	default:
		t.Fatal("a polled offload is not done once the device has nothing left")
	}
	if err := tr.Err(); err != nil {
		t.Fatal(err)
	}
	tr.Release()
	if !bytes.Equal(f.host.Slot(4)[:len(b.enc)], b.enc) {
		t.Fatal("host slot 4 differs from codec.Encode of the block")
	}
}

// TestCodecPricedOnTheClock: on the simulator, the Go codec's time is its
// bf16 bytes at the configured rates, on the virtual clock.
func TestCodecPricedOnTheClock(t *testing.T) {
	durations := map[float64]time.Duration{}
	for _, rate := range []float64{0, 1e9} {
		f := newFixture(t, "block-first", cudastream.H200Link())
		cfg := codecConfig(8)
		cfg.GoCodecEncodeBytesPerS = rate
		e := f.engine(t, cfg)
		tr, err := e.Offload(context.Background(), []Pair{{GPUBlock: 1, HostSlot: 1}})
		if err != nil {
			t.Fatal(err)
		}
		wait(t, tr)
		durations[rate] = tr.Duration()
	}
	coding := time.Duration(float64(fxShape.BlockBytes()) / 1e9 * 1e9)
	if got := durations[1e9] - durations[0]; got != coding {
		t.Errorf("an offload with the Go codec at 1e9 B/s took %v longer than unpriced, want %v (%d bf16 bytes)", got, coding, fxShape.BlockBytes())
	}
}

// TestCodecStagedOnboard: encoded blocks read through the staging ring
// land on the GPU decoded.
func TestCodecStagedOnboard(t *testing.T) {
	f := newFixture(t, "layer-first", cudastream.H200Link())
	var staging [][]byte
	for range 2 {
		b, err := f.sim.HostAlloc(3 * f.host.SlotBytes)
		if err != nil {
			t.Fatal(err)
		}
		staging = append(staging, b)
	}
	cfg := codecConfig(2)
	cfg.Staging = staging
	e := f.engine(t, cfg)
	rng := rand.New(rand.NewPCG(3, 3))
	src := &encodedSource{}
	gpu := []int32{40, 3, 17, 22, 8, 61, 0}
	for range gpu {
		src.blocks = append(src.blocks, newCodedBlock(t, rng))
	}
	tr, err := e.OnboardStaged(context.Background(), src, gpu)
	if err != nil {
		t.Fatal(err)
	}
	wait(t, tr)
	for i, b := range gpu {
		if !bytes.Equal(f.getGPUBlock(t, b), src.blocks[i].back) {
			t.Fatalf("GPU block %d (staged block %d) differs from codec.Decode(codec.Encode(block))", b, i)
		}
	}
}

type encodedSource struct{ blocks []codedBlock }

func (s *encodedSource) ReadBlock(_ context.Context, i int, dst []byte) error {
	copy(dst, s.blocks[i].enc)
	return nil
}

// TestCodecScratchReuseWaits is invariant 3 for the codec's scratch: the
// simulator moves bytes at each step's modelled end, so a buffer refilled
// before its DMA has read it sends another chunk's bytes. With the wait
// removed the test must see it, or it proves nothing.
func TestCodecScratchReuseWaits(t *testing.T) {
	slow := cudastream.H200Link()
	slow.DtoHBytesPerSec = 1e8 // the DMAs are slower than the coding
	for _, skip := range []bool{false, true} {
		f := newFixture(t, "block-first", slow)
		e := f.engine(t, codecConfig(1))
		e.skipCodecWait = skip
		rng := rand.New(rand.NewPCG(8, 8))
		var out []Pair
		var want [][]byte
		for i := range 6 {
			b := newCodedBlock(t, rng)
			f.putGPUBlock(t, int32(i), b.raw)
			out = append(out, Pair{GPUBlock: int32(i), HostSlot: int32(i)})
			want = append(want, b.enc)
		}
		tr, err := e.Offload(context.Background(), out)
		if err != nil {
			t.Fatal(err)
		}
		wait(t, tr)
		same := true
		for i := range out {
			same = same && bytes.Equal(f.host.Slot(int32(i))[:len(want[i])], want[i])
		}
		if same == skip {
			t.Errorf("skip wait %v: slots hold their blocks' encodings: %v", skip, same)
		}
	}
}

// TestCodecConfigErrors: bad codec settings fail New, naming the field.
func TestCodecConfigErrors(t *testing.T) {
	f := newFixture(t, "layer-first", cudastream.LinkModel{})
	bad := func(edit func(*Config)) Config { c := codecConfig(0); edit(&c); return c }
	for _, c := range []struct {
		name string
		cfg  Config
		want string
	}{
		{"unknown codec", bad(func(c *Config) { c.Codec = 9 }), "Config.Codec"},
		{"bad shape", bad(func(c *Config) { c.CodecShape.HeadDim = 100 }), "Config.CodecShape"},
		{"other layers", bad(func(c *Config) { c.CodecShape.Layers = 3 }), "Config.CodecShape has 3 layers"},
		{"other part size", bad(func(c *Config) { c.CodecShape.Tokens = 8 }), "Config.GPU.PartBytes"},
		{"chunk", bad(func(c *Config) { c.CodecChunkBlocks = -1 }), "Config.CodecChunkBlocks"},
		{"buffers", bad(func(c *Config) { c.CodecBuffers = 65 }), "Config.CodecBuffers"},
		{"layer groups below 0", bad(func(c *Config) { c.CodecLayerGroups = -1 }), "Config.CodecLayerGroups"},
		{"layer groups past the layers", bad(func(c *Config) { c.CodecLayerGroups = fxLayers + 1 }), "Config.CodecLayerGroups"},
		{"rate", bad(func(c *Config) { c.GoCodecDecodeBytesPerS = -1 }), "Config.GoCodecDecodeBytesPerS"},
		{"sums", bad(func(c *Config) { c.Sums = true }), "Config.Sums with Config.Codec"},
	} {
		cfg := c.cfg
		cfg.GPU, cfg.Host = f.gpu, f.host
		e, err := New(f.sim, cfg)
		if err == nil {
			e.Close()
			t.Errorf("%s: New succeeded", c.name)
			continue
		}
		if !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s: New = %v, want it to name %q", c.name, err, c.want)
		}
	}
	// A slot that holds the encoded block but not the bf16 one is enough
	// with the codec, and refused without it.
	f.host.SlotBytes = encodedBytes(t)
	cfg := Config{GPU: f.gpu, Host: f.host}
	if e, err := New(f.sim, cfg); err == nil || !strings.Contains(err.Error(), "Config.Host.SlotBytes") {
		if e != nil {
			e.Close()
		}
		t.Errorf("New without a codec, slots of the encoded size = %v, want Config.Host.SlotBytes refused", err)
	}
}

// TestCodecCorruptScaleFaults: an encoded block whose scale Decode
// rejects fails the onboard (the Go kernel faults the stream) instead of
// landing as some block.
func TestCodecCorruptScaleFaults(t *testing.T) {
	f := newFixture(t, "layer-first", cudastream.LinkModel{})
	e := f.engine(t, codecConfig(0))
	slot := f.host.Slot(2)
	clear(slot)
	copy(slot, []byte{0, 0, 0xC0, 0x7F}) // scale 0 is NaN
	tr, err := e.Onboard(context.Background(), []Pair{{GPUBlock: 5, HostSlot: 2}})
	if err != nil {
		t.Fatal(err)
	}
	err = tr.Wait(context.Background())
	tr.Release()
	if !errors.Is(err, codec.ErrCorrupt) && (err == nil || !strings.Contains(err.Error(), "corrupt encoded block")) {
		t.Fatalf("onboard of a block with a NaN scale = %v, want the codec's corrupt-block fault", err)
	}
}

// TestCodecSubmissionAllocatesPerChunkNotPerBlock: a chunk of 32 blocks
// allocates no more to submit than a chunk of one (invariant 5: nothing
// per block; on the simulator each Go kernel launch allocates its work).
func TestCodecSubmissionAllocatesPerChunkNotPerBlock(t *testing.T) {
	f := newFixture(t, "layer-first", cudastream.LinkModel{})
	e := f.engine(t, codecConfig(fxSlots))
	measure := func(n int, offload bool) float64 {
		pairs := make([]Pair, n)
		for i := range pairs {
			pairs[i] = Pair{GPUBlock: int32(i), HostSlot: int32(i)}
		}
		run := func() {
			submit := e.Onboard
			if offload {
				submit = func(ctx context.Context, p []Pair) (*Transfer, error) { return e.Offload(ctx, p) }
			}
			tr, err := submit(context.Background(), pairs)
			if err != nil {
				t.Fatal(err)
			}
			<-tr.Done()
			tr.Release()
		}
		run()
		return testing.AllocsPerRun(20, run)
	}
	for _, offload := range []bool{false, true} {
		if one, many := measure(1, offload), measure(fxSlots, offload); many > one {
			t.Errorf("offload %v: allocations per transfer: %v for 1 block, %v for %d blocks in one chunk", offload, one, many, fxSlots)
		}
	}
}

// TestCodecOnboardScratchReuseWaits is TestCodecScratchReuseWaits for
// onboards: with a slow decode, a buffer refilled by the next DMA before
// its dequantize has read it would land another chunk's block.
func TestCodecOnboardScratchReuseWaits(t *testing.T) {
	for _, skip := range []bool{false, true} {
		f := newFixture(t, "block-first", cudastream.H200Link())
		cfg := codecConfig(1)
		cfg.GoCodecDecodeBytesPerS = 1e6 // the decodes are slower than the DMAs
		e := f.engine(t, cfg)
		e.skipCodecWait = skip
		rng := rand.New(rand.NewPCG(9, 9))
		var in []Pair
		var want [][]byte
		for i := range 6 {
			b := newCodedBlock(t, rng)
			copy(f.host.Slot(int32(i)), b.enc)
			in = append(in, Pair{GPUBlock: int32(10 + i), HostSlot: int32(i)})
			want = append(want, b.back)
		}
		tr, err := e.Onboard(context.Background(), in)
		if err != nil {
			t.Fatal(err)
		}
		wait(t, tr)
		same := true
		for i, p := range in {
			same = same && bytes.Equal(f.getGPUBlock(t, p.GPUBlock), want[i])
		}
		if same == skip {
			t.Errorf("skip wait %v: GPU blocks hold their slots' decodings: %v", skip, same)
		}
	}
}

// TestCodecKernelsTimed: with OnCodecKernel, each coded transfer reports
// one launch, its first chunk's, timed between events on the device: a
// quantize of whole blocks, and a dequantize of the first group's layers,
// each as long as the Go codec's price on the virtual clock, plus the
// simulator's kernel launch and the events' cost at most.
func TestCodecKernelsTimed(t *testing.T) {
	const encRate, decRate = 1e9, 2e9
	link := cudastream.H200Link()
	for _, groups := range []int{1, 2} {
		f := newFixture(t, "block-first", link)
		cfg := codecConfig(4)
		cfg.Polled, cfg.CodecLayerGroups = true, groups
		cfg.GoCodecEncodeBytesPerS, cfg.GoCodecDecodeBytesPerS = encRate, decRate
		var got []CodecKernel
		cfg.OnCodecKernel = func(k CodecKernel) { got = append(got, k) }
		e := f.engine(t, cfg)
		var pairs []Pair
		for i := range 6 {
			pairs = append(pairs, Pair{GPUBlock: int32(i), HostSlot: int32(i)})
		}
		offload := func(ctx context.Context, p []Pair) (*Transfer, error) { return e.Offload(ctx, p) }
		for _, submit := range []func(context.Context, []Pair) (*Transfer, error){offload, e.Onboard} {
			tr, err := submit(context.Background(), pairs)
			if err != nil {
				t.Fatal(err)
			}
			f.settle(t, e, tr)
			tr.Release()
		}
		if len(got) != 2 {
			t.Fatalf("%d groups: %d launches reported for an offload and an onboard, want 2: %+v", groups, len(got), got)
		}
		block := fxShape.BlockBytes()
		for i, want := range []CodecKernel{
			{Encode: true, Blocks: 4, RawBytes: 4 * block},
			{Encode: false, Blocks: 4, RawBytes: 4 * block / int64(groups)},
		} {
			k := got[i]
			rate := map[bool]float64{true: encRate, false: decRate}[want.Encode]
			price := time.Duration(float64(want.RawBytes) / rate * 1e9)
			if k.Encode != want.Encode || k.Blocks != want.Blocks || k.RawBytes != want.RawBytes ||
				k.Elapsed < price || k.Elapsed > price+link.KernelLaunch+2*link.EventCost {
				t.Errorf("%d groups: launch %d is %+v, want %+v taking %v (+ %v at most)", groups, i, k, want, price, link.KernelLaunch+2*link.EventCost)
			}
		}
	}
}

// TestCodecKernelsUntimed: with OnCodecKernel unset, no transfer holds a
// timer.
func TestCodecKernelsUntimed(t *testing.T) {
	f := newFixture(t, "block-first", cudastream.H200Link())
	cfg := codecConfig(4)
	e := f.engine(t, cfg)
	tr, err := e.Offload(context.Background(), []Pair{{GPUBlock: 1, HostSlot: 1}})
	if err != nil {
		t.Fatal(err)
	}
	if tr.timer != nil {
		t.Error("a transfer holds a timer without Config.OnCodecKernel")
	}
	wait(t, tr)
}

// TestCodecKernelsTimedConcurrently: transfers submitted from several
// goroutines at once share each direction's few timers; every launch
// reported is whole, and once all are done every timer is free again.
func TestCodecKernelsTimedConcurrently(t *testing.T) {
	f := newFixture(t, "block-first", cudastream.H200Link())
	cfg := codecConfig(2)
	cfg.GoCodecEncodeBytesPerS, cfg.GoCodecDecodeBytesPerS = 1e10, 1e10
	var mu sync.Mutex
	var got []CodecKernel
	cfg.OnCodecKernel = func(k CodecKernel) {
		mu.Lock()
		got = append(got, k)
		mu.Unlock()
	}
	e := f.engine(t, cfg)
	const workers, each = 4, 6
	var wg sync.WaitGroup
	errs := make(chan error, workers*each)
	for w := range workers {
		wg.Go(func() {
			for i := range each {
				p := []Pair{{GPUBlock: int32(w), HostSlot: int32(w)}, {GPUBlock: int32(workers + w), HostSlot: int32(workers + w)}}
				var tr *Transfer
				var err error
				if i%2 == 0 {
					tr, err = e.Offload(context.Background(), p)
				} else {
					tr, err = e.Onboard(context.Background(), p)
				}
				if err == nil {
					err = tr.Wait(context.Background())
					tr.Release()
				}
				if err != nil {
					errs <- err
				}
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	mu.Lock()
	defer mu.Unlock()
	if len(got) == 0 || len(got) > workers*each {
		t.Errorf("%d launches reported for %d transfers", len(got), workers*each)
	}
	for _, k := range got {
		if k.Blocks != 2 || k.RawBytes != 2*fxShape.BlockBytes() || k.Elapsed <= 0 {
			t.Errorf("launch %+v, want 2 whole blocks timed", k)
		}
	}
	for _, d := range []*direction{&e.on, &e.off} {
		if n := len(d.cring.free); n != codecTimers {
			t.Errorf("%d of %d timers free once every transfer is done", n, codecTimers)
		}
	}
}
