package gpu_test

import (
	"bytes"
	"context"
	"math"
	"testing"

	"kvtier.dev/cudastream"
	"kvtier.dev/examples/server/internal/gpu"
	"kvtier.dev/examples/server/internal/model"
	"kvtier.dev/examples/server/internal/roundtrip"
	"kvtier.dev/internal/gputest"
	"kvtier.dev/kvtier/transfer"
)

const seed = 42

// cpuTolerance is how far GPU logits may be from the CPU reference's: 2%
// of the largest reference logit. Both compute in fp32 and round to bf16 at
// the same places; they differ by summation order, which now and then moves
// a value across a bf16 rounding boundary (one bf16 step is 0.4-0.8%
// relative), and by the GPU's approximate exp.
const cpuTolerance = 0.02

type fixture struct {
	dev    cudastream.Device
	st     cudastream.Stream
	region cudastream.DevicePtr
	slots  int
	m      *gpu.Model
	c      model.Config
}

func newFixture(t *testing.T, slots int, o gpu.Options) *fixture {
	t.Helper()
	o.MaxTokens, o.MaxContext = 128, 256
	return newFixtureOf(t, model.Tiny(), slots, o)
}

// newFixtureOf is newFixture for config c and options o as given.
func newFixtureOf(t *testing.T, c model.Config, slots int, o gpu.Options) *fixture {
	t.Helper()
	dev := gputest.Device(t)
	f := &fixture{dev: dev, slots: slots, c: c}
	var err error
	if f.st, err = dev.NewStream(0); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { f.st.Destroy() })
	if f.region, err = dev.Alloc(int64(slots) * f.c.BlockBytes()); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { dev.Free(f.region) })
	f.m, err = gpu.New(f.c, seed, f.region, slots, o)
	gputest.SkipOrFail(t, err) // cuBLAS may be missing where the driver is not
	t.Cleanup(func() {
		if err := f.m.Close(); err != nil {
			t.Error(err)
		}
	})
	t.Logf("cuBLAS: %s; attention: %s", f.m.Library(), f.m.AttentionKernel())
	return f
}

func (f *fixture) slot(t *testing.T, s int32) []byte {
	t.Helper()
	b := make([]byte, f.c.BlockBytes())
	if err := f.st.CopyDtoH(b, f.region+cudastream.DevicePtr(int64(s)*f.c.BlockBytes())); err != nil {
		t.Fatal(err)
	}
	if err := f.st.Synchronize(); err != nil {
		t.Fatal(err)
	}
	return b
}

type forwarder interface {
	Forward([]int32, model.Plan) ([]float32, int32, error)
}

func tokens(n, vocab int) []int32 {
	tok := make([]int32, n)
	for i := range tok {
		tok[i] = int32((i*7919 + 13) % vocab)
	}
	return tok
}

func span(from, to int) []int32 {
	var p []int32
	for i := from; i < to; i++ {
		p = append(p, int32(i))
	}
	return p
}

func slotRange(from, n int) []int32 { return span(from, from+n) }

func fwd(t *testing.T, m forwarder, tok []int32, p model.Plan) ([]float32, int32) {
	t.Helper()
	l, next, err := m.Forward(tok, p)
	if err != nil {
		t.Fatal(err)
	}
	return append([]float32(nil), l...), next
}

func maxAbs(v []float32) float64 {
	var m float64
	for _, x := range v {
		m = max(m, math.Abs(float64(x)))
	}
	return m
}

func maxDiff(a, b []float32) float64 {
	var d float64
	for i := range a {
		d = max(d, math.Abs(float64(a[i]-b[i])))
	}
	return d
}

// TestAgreesWithCPU: at the tiny shape, the GPU's logits are within
// cpuTolerance of the CPU reference's after a prefill and at each of 64
// greedy decode steps, and the greedy tokens are identical; with the fused
// attention kernel for the prefill only (the default), for every pass, and
// for none.
func TestAgreesWithCPU(t *testing.T) {
	for _, tc := range []struct {
		name  string
		n     int
		fused int
	}{{"fused prefill", 100, 0}, {"fused everywhere", 37, 1}, {"products everywhere", 100, 1 << 30}} {
		t.Run(tc.name, func(t *testing.T) { agrees(t, tc.n, gpu.Options{FusedMinTokens: tc.fused}) })
	}
}

func agrees(t *testing.T, n int, o gpu.Options) {
	f := newFixture(t, 64, o)
	cpu, err := model.NewCPU(f.c, seed, 64)
	if err != nil {
		t.Fatal(err)
	}
	const steps = 64
	tok := tokens(n, f.c.Vocab)
	sl := slotRange(0, f.c.Blocks(n+steps))
	gl, gnext := fwd(t, f.m, tok, model.Plan{Slots: sl[:f.c.Blocks(n)], Compute: span(0, n)})
	cl, cnext := fwd(t, cpu, tok, model.Plan{Slots: sl[:f.c.Blocks(n)], Compute: span(0, n)})
	worst := maxDiff(gl, cl) / maxAbs(cl)
	t.Logf("prefill of %d: logits differ by %.3g of the largest", n, worst)
	if gnext != cnext {
		t.Fatalf("prefill: GPU picks %d, CPU %d", gnext, cnext)
	}
	for s := range steps {
		tok = append(tok, gnext)
		p := model.Plan{Slots: sl[:f.c.Blocks(len(tok))], Compute: []int32{int32(len(tok) - 1)}}
		gl, gnext = fwd(t, f.m, tok, p)
		cl, cnext = fwd(t, cpu, tok, p)
		worst = max(worst, maxDiff(gl, cl)/maxAbs(cl))
		if gnext != cnext {
			t.Fatalf("decode step %d: GPU picks %d, CPU %d", s, gnext, cnext)
		}
	}
	t.Logf("largest logit difference over the prefill and %d decode steps: %.3g of the largest logit", steps, worst)
	if worst > cpuTolerance {
		t.Fatalf("GPU logits differ from the CPU reference's by %.3g of the largest logit (tolerance %g)", worst, cpuTolerance)
	}
}

// TestReuseOnGPU (every pass through the fused attention kernel): a
// one-shot prefill (A), the first k blocks and then the
// rest on top of their KV (B), and the same after the k blocks made a round
// trip through the pinned host tier and the NVMe tier with kvtier's copy
// engine and store into other slots (C). B is within cpuTolerance of A and
// picks the same greedy tokens for 16 steps (the products have other shapes,
// so other summation orders); the blocks' bytes are identical after the trip
// and C's logits equal B's bit for bit.
func TestReuseOnGPU(t *testing.T) {
	f := newFixture(t, 128, gpu.Options{FusedMinTokens: 1})
	const n, k, steps = 100, 5, 16
	c := f.c
	bt := c.BlockTokens
	tok := tokens(n, c.Vocab)
	blocks := c.Blocks(n + steps)
	a, b, cs, d := slotRange(0, blocks), slotRange(blocks, blocks), slotRange(2*blocks, k), slotRange(2*blocks+k, blocks)

	la, nextA := fwd(t, f.m, tok, model.Plan{Slots: a[:c.Blocks(n)], Compute: span(0, n)})
	wantTok := decode(t, f.m, tok, a, nextA, steps)

	fwd(t, f.m, tok[:k*bt], model.Plan{Slots: b[:k], Compute: span(0, k*bt)})
	prefix := make([][]byte, k)
	for i := range k {
		prefix[i] = f.slot(t, b[i])
	}
	lb, nextB := fwd(t, f.m, tok, model.Plan{Slots: b[:c.Blocks(n)], Compute: span(k*bt, n)})
	if r := maxDiff(la, lb) / maxAbs(la); r > cpuTolerance {
		t.Fatalf("prefix then rest: logits differ by %.3g of the largest (tolerance %g)", r, cpuTolerance)
	} else {
		t.Logf("prefix then rest vs one shot: logits differ by %.3g of the largest", r)
	}
	if got := decode(t, f.m, tok, b, nextB, steps); !equal(got, wantTok) {
		t.Fatalf("prefix then rest: greedy tokens %v, one shot %v", got, wantTok)
	}

	layout, err := transfer.BlockFirstLayout(f.region, c.Layers, 2, f.slots, c.PartBytes())
	if err != nil {
		t.Fatal(err)
	}
	trip, err := roundtrip.Blocks(context.Background(), f.dev, layout, t.TempDir(), b[:k], cs)
	if err != nil {
		t.Fatal(err)
	}
	for i := range k {
		for what, got := range map[string][]byte{"host tier": trip.Host[i], "NVMe tier": trip.NVMe[i], "GPU after the trip": f.slot(t, cs[i])} {
			if !bytes.Equal(got, prefix[i]) {
				t.Fatalf("block %d differs in the %s", i, what)
			}
		}
	}
	slotsC := append(append([]int32(nil), cs...), d[k:c.Blocks(n)]...)
	lc, nextC := fwd(t, f.m, tok, model.Plan{Slots: slotsC, Compute: span(k*bt, n)})
	if nextC != nextB || maxDiff(lc, lb) != 0 {
		t.Fatalf("after the round trip: next %d (want %d), logits differ by up to %g", nextC, nextB, maxDiff(lc, lb))
	}
}

func decode(t *testing.T, m forwarder, tok, slots []int32, next int32, steps int) []int32 {
	t.Helper()
	tok = append([]int32(nil), tok...)
	var out []int32
	bt := model.Tiny().BlockTokens
	for range steps {
		out = append(out, next)
		tok = append(tok, next)
		_, next = fwd(t, m, tok, model.Plan{Slots: slots[:(len(tok)+bt-1)/bt], Compute: []int32{int32(len(tok) - 1)}})
	}
	return out
}

func equal(a, b []int32) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}

// TestRejects: bad options and plans are refused before any work.
func TestRejects(t *testing.T) {
	f := newFixture(t, 8, gpu.Options{})
	if _, err := gpu.New(f.c, seed, f.region, 8, gpu.Options{MaxTokens: 10, MaxContext: 5}); err == nil {
		t.Fatal("MaxTokens above MaxContext accepted")
	}
	if _, err := gpu.New(f.c, seed, 0, 8, gpu.Options{MaxTokens: 4, MaxContext: 8}); err == nil {
		t.Fatal("a null region accepted")
	}
	tok := tokens(200, f.c.Vocab)
	if _, _, err := f.m.Forward(tok[:9], model.Plan{Slots: []int32{0, 1}, Compute: span(0, 9)}); err == nil {
		t.Fatal("a plan with too few slots accepted")
	}
	if _, err := gpu.New(f.c, seed, f.region, 8, gpu.Options{MaxTokens: 4, MaxContext: 8, FusedMinTokens: -1}); err == nil {
		t.Fatal("a negative FusedMinTokens accepted")
	}
}

// TestHolesOnGPU: after a one-shot prefill, three blocks in the middle lose
// their KV; a plan that recomputes them and the last block, keeping the
// rest, gives logits within cpuTolerance of the one-shot prefill's and the
// same greedy token, through the fused kernel (scattered positions in one
// row tile) and through the products.
func TestHolesOnGPU(t *testing.T) {
	for _, fused := range []int{1, 1 << 30} {
		f := newFixture(t, 64, gpu.Options{FusedMinTokens: fused})
		c := f.c
		const n = 100
		tok := tokens(n, c.Vocab)
		sl := slotRange(3, c.Blocks(n))
		want, wantNext := fwd(t, f.m, tok, model.Plan{Slots: sl, Compute: span(0, n)})
		compute := make([]bool, c.Blocks(n))
		compute[2], compute[7], compute[8], compute[len(compute)-1] = true, true, true, true
		zero := make([]byte, c.BlockBytes())
		for b, h := range compute {
			if h {
				if err := f.st.CopyHtoD(f.region+cudastream.DevicePtr(int64(sl[b])*c.BlockBytes()), zero); err != nil {
					t.Fatal(err)
				}
			}
		}
		if err := f.st.Synchronize(); err != nil {
			t.Fatal(err)
		}
		got, next := fwd(t, f.m, tok, model.Plan{Slots: sl, Compute: model.AppendBlockPositions(nil, c.BlockTokens, n, compute)})
		r := maxDiff(got, want) / maxAbs(want)
		t.Logf("FusedMinTokens %d: holes recomputed vs one shot: logits differ by %.3g of the largest", fused, r)
		if r > cpuTolerance || next != wantNext {
			t.Fatalf("holes recomputed: next %d (want %d), logits differ by %.3g of the largest (tolerance %g)", next, wantNext, r, cpuTolerance)
		}
	}
}

// TestRowBucketsOnGPU: padding a pass's products to its row bucket changes
// nothing in its own rows. Passes of 97 and of 100 positions (one bucket:
// 112 rows), with a pass of other tokens between them so that the padding
// rows hold something else, write the same bytes into the blocks of their
// first 96 positions. Against products at exact rows (another Model, the
// same weights), a prefill's logits are within cpuTolerance and pick the
// same token. WarmUp runs one pass per bucket into its own slots and leaves
// the model as it was: the pass after it repeats the one before bit for
// bit.
func TestRowBucketsOnGPU(t *testing.T) {
	f := newFixture(t, 128, gpu.Options{})
	c := f.c
	tok := tokens(128, c.Vocab)
	other := make([]int32, 128)
	for i := range other {
		other[i] = int32((i*104729 + 5) % c.Vocab)
	}
	// Tiny's blocks hold 4 tokens: a in slots 0-24, the other pass in
	// 32-63, b in 64-88, the warm-up in 96-127.
	a, b := slotRange(0, c.Blocks(97)), slotRange(64, c.Blocks(100))
	fwd(t, f.m, tok[:97], model.Plan{Slots: a, Compute: span(0, 97)})
	fwd(t, f.m, other, model.Plan{Slots: slotRange(32, c.Blocks(128)), Compute: span(0, 128)})
	want, wantNext := fwd(t, f.m, tok[:100], model.Plan{Slots: b, Compute: span(0, 100)})
	for i := range 96 / c.BlockTokens {
		if !bytes.Equal(f.slot(t, a[i]), f.slot(t, b[i])) {
			t.Fatalf("block %d: a pass of 97 positions and one of 100 (one bucket) wrote different KV", i)
		}
	}

	exact := newFixture(t, 128, gpu.Options{ExactRows: true})
	got, next := fwd(t, exact.m, tok[:100], model.Plan{Slots: b, Compute: span(0, 100)})
	r := maxDiff(got, want) / maxAbs(want)
	t.Logf("100 positions, products at 112 rows against at 100: logits differ by %.3g of the largest", r)
	if r > cpuTolerance || next != wantNext {
		t.Fatalf("exact rows: next %d (padded: %d), logits differ by %.3g of the largest (tolerance %g)", next, wantNext, r, cpuTolerance)
	}
	warm := slotRange(96, 32)
	if n, err := exact.m.WarmUp(warm); n != 0 || err != nil {
		t.Fatalf("WarmUp with ExactRows: %d passes, %v; want none", n, err)
	}

	// 9 buckets (1, 16, ..., 128), then 1, 8, 16 and 32 rows and 63
	// (FusedMinTokens 64, less one) after 128 keys.
	n, err := f.m.WarmUp(warm)
	if n != 14 || err != nil {
		t.Fatalf("WarmUp: %d passes, %v; want 14", n, err)
	}
	// 10 slots hold 40 positions: the buckets 1, 16 and 32, and no
	// attention pass (none of 128 keys fits).
	if n, err := f.m.WarmUp(slotRange(96, 10)); n != 3 || err != nil {
		t.Fatalf("WarmUp in 10 slots: %d passes, %v; want 3", n, err)
	}
	again, againNext := fwd(t, f.m, tok[:100], model.Plan{Slots: b, Compute: span(0, 100)})
	if againNext != wantNext || maxDiff(again, want) != 0 {
		t.Fatalf("after WarmUp: next %d (want %d), logits differ by up to %g", againNext, wantNext, maxDiff(again, want))
	}
}

// tinyHD128 is model.Tiny with heads of 128, the head dim of the Hopper
// attention kernel.
func tinyHD128() model.Config {
	c := model.Tiny()
	c.Name, c.HeadDim, c.Hidden = "tiny-hd128", 128, 512
	return c
}

// TestHopperAttentionOnGPU: on a compute capability 9.x device, the wgmma
// attention kernel (kvm_flash_h128 over kvm_gather_t's transposed V) for
// every pass, decode steps included: a 300-token prefill (three row tiles,
// three key tiles, the diagonal masked) and 16 decode steps within
// cpuTolerance of the CPU reference with the same greedy tokens; within
// cpuTolerance of the mma kernel's pass; a prefix of 200 tokens then the
// rest, and a pass that recomputes scattered blocks, within cpuTolerance
// of the one-shot prefill with the same token. Elsewhere New refuses
// Options.Attention = AttentionWGMMA and names why.
func TestHopperAttentionOnGPU(t *testing.T) {
	dev := gputest.Device(t)
	c := tinyHD128()
	const slots, n, steps = 512, 300, 16
	o := gpu.Options{MaxTokens: 512, MaxContext: 512, FusedMinTokens: 1, Attention: gpu.AttentionWGMMA}
	if info := dev.Info(); info.CCMajor != 9 {
		region, err := dev.Alloc(int64(slots) * c.BlockBytes())
		if err != nil {
			t.Fatal(err)
		}
		defer dev.Free(region)
		m, err := gpu.New(c, seed, region, slots, o)
		if err == nil {
			m.Close()
			t.Fatalf("AttentionWGMMA accepted on compute capability %d.%d", info.CCMajor, info.CCMinor)
		}
		t.Skipf("compute capability %d.%d: %v", info.CCMajor, info.CCMinor, err)
	}
	f := newFixtureOf(t, c, slots, o)
	if f.m.Attention() != gpu.AttentionWGMMA {
		t.Fatalf("Options.Attention wgmma: the model runs %v (%s)", f.m.Attention(), f.m.AttentionKernel())
	}
	cpu, err := model.NewCPU(c, seed, slots)
	if err != nil {
		t.Fatal(err)
	}
	tok := tokens(n, c.Vocab)
	sl := slotRange(0, c.Blocks(n+steps))
	one := model.Plan{Slots: sl[:c.Blocks(n)], Compute: span(0, n)}
	gl, gnext := fwd(t, f.m, tok, one)
	cl, cnext := fwd(t, cpu, tok, one)
	worst := maxDiff(gl, cl) / maxAbs(cl)
	if gnext != cnext || worst > cpuTolerance {
		t.Fatalf("prefill of %d: GPU picks %d, CPU %d; logits differ by %.3g of the largest (tolerance %g)", n, gnext, cnext, worst, cpuTolerance)
	}
	want := decode(t, cpu, tok, sl, cnext, steps)
	if got := decode(t, f.m, tok, sl, gnext, steps); !equal(got, want) {
		t.Fatalf("decode: GPU tokens %v, CPU %v", got, want)
	}
	t.Logf("prefill of %d vs the CPU: logits differ by %.3g of the largest", n, worst)

	mma := newFixtureOf(t, c, slots, gpu.Options{MaxTokens: 512, MaxContext: 512, FusedMinTokens: 1, Attention: gpu.AttentionMMA})
	if mma.m.Attention() != gpu.AttentionMMA {
		t.Fatalf("Options.Attention mma: the model runs %v", mma.m.Attention())
	}
	ml, mnext := fwd(t, mma.m, tok, one)
	if r := maxDiff(gl, ml) / maxAbs(ml); mnext != gnext || r > cpuTolerance {
		t.Fatalf("wgmma vs mma kernel: next %d vs %d, logits differ by %.3g of the largest", gnext, mnext, r)
	} else {
		t.Logf("wgmma vs mma kernel: logits differ by %.3g of the largest", r)
	}

	// A prefix of 50 blocks, then the rest on top of its KV.
	const k = 50
	b := slotRange(c.Blocks(n+steps), c.Blocks(n))
	fwd(t, f.m, tok[:k*c.BlockTokens], model.Plan{Slots: b[:k], Compute: span(0, k*c.BlockTokens)})
	rl, rnext := fwd(t, f.m, tok, model.Plan{Slots: b, Compute: span(k*c.BlockTokens, n)})
	if r := maxDiff(gl, rl) / maxAbs(gl); rnext != gnext || r > cpuTolerance {
		t.Fatalf("prefix then rest: next %d (want %d), logits differ by %.3g of the largest (tolerance %g)", rnext, gnext, r, cpuTolerance)
	}
	// Blocks 2, 7, 8, 40 and the last recomputed, the rest kept.
	compute := make([]bool, c.Blocks(n))
	compute[2], compute[7], compute[8], compute[40], compute[len(compute)-1] = true, true, true, true, true
	hl, hnext := fwd(t, f.m, tok, model.Plan{Slots: b, Compute: model.AppendBlockPositions(nil, c.BlockTokens, n, compute)})
	if r := maxDiff(gl, hl) / maxAbs(gl); hnext != gnext || r > cpuTolerance {
		t.Fatalf("holes recomputed: next %d (want %d), logits differ by %.3g of the largest (tolerance %g)", hnext, gnext, r, cpuTolerance)
	}
}

// TestStageTimesOnGPU: with Options.StageTimes, a pass reports device
// time for each of its stages, attention among them, and none without.
func TestStageTimesOnGPU(t *testing.T) {
	f := newFixture(t, 64, gpu.Options{StageTimes: true})
	tok := tokens(100, f.c.Vocab)
	fwd(t, f.m, tok, model.Plan{Slots: slotRange(0, f.c.Blocks(100)), Compute: span(0, 100)})
	st := f.m.Stages()
	seen := map[string]float64{}
	for _, s := range st {
		seen[s.Name] = s.Seconds
	}
	// Each of these runs at least one kernel: it takes time. (Waiting for
	// the layers' KV, with no events to wait for, may take none.)
	for _, name := range []string{"embed", "norms", "qkv product", "rotary + KV store", "gather", "attention", "out product", "gate/up product", "SiLU", "down product", "final norm + lm head + argmax"} {
		if seen[name] <= 0 {
			t.Errorf("stage %q: %g s (got %v)", name, seen[name], st)
		}
	}
	if again := f.m.Stages(); again != nil {
		t.Fatalf("Stages reported %v twice", again)
	}
	plain := newFixture(t, 64, gpu.Options{})
	fwd(t, plain.m, tok, model.Plan{Slots: slotRange(0, f.c.Blocks(100)), Compute: span(0, 100)})
	if st := plain.m.Stages(); st != nil {
		t.Fatalf("stage times without Options.StageTimes: %v", st)
	}
}
