package kvdrift

import (
	"bytes"
	"math"
	"math/rand/v2"
	"slices"
	"strings"
	"testing"

	"kvtier.dev/cudastream"
	"kvtier.dev/examples/server/internal/model"
	"kvtier.dev/kvtier/codec"
)

func TestCompare(t *testing.T) {
	ref := []float32{1, -3, 2, 0}      // mean 0, std sqrt(14/4)
	got := []float32{1.5, -3, 2, 0.25} // largest difference 0.5
	d := Compare(ref, got)
	std := math.Sqrt(14.0 / 4)
	if d.Abs != 0.5 || d.OfMax != 0.5/3 || math.Abs(d.OfStd-0.5/std) > 1e-12 {
		t.Fatalf("Compare = %+v, want abs 0.5, of max %g, of std %g", d, 0.5/3, 0.5/std)
	}
	if d := Compare(ref, ref); d != (Drift{}) {
		t.Fatalf("equal logits: %+v", d)
	}
	nan := []float32{1, float32(math.NaN()), 2, 0}
	for _, d := range []Drift{Compare(ref, nan), Compare(nan, ref)} {
		if d != (Drift{Unbounded, Unbounded, Unbounded}) {
			t.Fatalf("a NaN logit: %+v, want every field Unbounded", d)
		}
	}
	flat := []float32{2, 2, 2, 2}
	if d := Compare(flat, []float32{2, 2, 2, 3}); d.Abs != 1 || d.OfMax != 0.5 || d.OfStd != Unbounded {
		t.Fatalf("over flat logits: %+v, want abs 1, of max 0.5, of std Unbounded", d)
	}
	if m := (Drift{1, 5, 2}).Max(Drift{3, 4, 2.5}); m != (Drift{3, 5, 2.5}) {
		t.Fatalf("Max = %+v", m)
	}
}

func TestLogprob(t *testing.T) {
	l := []float32{0, float32(math.Log(3)), -100}
	if got, want := logprob(l, 1), math.Log(3.0/4); math.Abs(got-want) > 1e-6 {
		t.Fatalf("logprob = %g, want %g", got, want)
	}
	if got := logprob(l, 2); math.Abs(got-(-100-math.Log(4))) > 1e-4 {
		t.Fatalf("a far token's logprob = %g", got)
	}
}

func TestSummarize(t *testing.T) {
	rs := []Result{
		{CachedTokens: 64, Agree: true, Compared: 32, Prefill: Drift{Abs: 0.5}, LogprobDrift: 0.01},
		{CachedTokens: 16, Tie: true, Gap: 0.05, FirstDiff: 3, Compared: 4, Continuation: Drift{OfStd: 0.2}},
		{CachedTokens: 32, Gap: 2, FirstDiff: 0, Compared: 1, Noise: Drift{Abs: 0.1}},
		{CachedTokens: 48, Agree: true, Compared: 32, Prefill: Drift{Abs: 0.25, OfStd: 0.1}},
	}
	s := Summarize(rs)
	want := Summary{Prompts: 4, Agree: 2, Ties: 1, Differences: 1, Agreement: 0.5, AgreementWithTies: 0.75, Tokens: 69,
		CachedMin: 16, CachedMax: 64, Noise: Drift{Abs: 0.1}, Prefill: Drift{Abs: 0.5, OfStd: 0.1}, Continuation: Drift{OfStd: 0.2},
		LogprobDrift: 0.01, LargestGap: 2}
	if s != want {
		t.Fatalf("Summarize = %+v\nwant        %+v", s, want)
	}
	if s := Summarize(nil); s != (Summary{}) {
		t.Fatalf("no results: %+v", s)
	}
}

// tinyCPU is the CPU reference at the tiny shape with 16-token blocks.
func tinyCPU(t *testing.T, slots int) (model.Config, *model.CPU) {
	t.Helper()
	c, err := model.Lookup("tiny", 16)
	if err != nil {
		t.Fatal(err)
	}
	m, err := model.NewCPU(c, 42, slots)
	if err != nil {
		t.Fatal(err)
	}
	return c, m
}

func randomTokens(r *rand.Rand, n, vocab int) []int32 {
	tok := make([]int32, n)
	for i := range tok {
		tok[i] = int32(r.IntN(vocab))
	}
	return tok
}

// TestRunRejects: a bad setup, prompt or slots is named, and nothing runs.
func TestRunRejects(t *testing.T) {
	c, m := tinyCPU(t, 16)
	h, err := NewHostRecoder(c, codec.FP8E4M3PerHead, m.Slot)
	if err != nil {
		t.Fatal(err)
	}
	good := Setup{Config: c, Model: m, Recoder: h, Steps: 4, Tolerance: 0.1}
	tok := randomTokens(rand.New(rand.NewPCG(1, 1)), 40, c.Vocab) // 2 cached blocks and 8 more
	before := bytes.Clone(m.Region())
	ref, rec := span(0, 3), span(3, 6) // 40 tokens and 4 steps: 3 blocks a side
	cases := []struct {
		s        Setup
		p        Prompt
		ref, rec []int32
		want     string
	}{
		{Setup{Config: c, Recoder: h, Steps: 4}, Prompt{tok, 32}, ref, rec, "needs a Model and a Recoder"},
		{Setup{Config: c, Model: m, Steps: 4}, Prompt{tok, 32}, ref, rec, "needs a Model and a Recoder"},
		{Setup{Config: c, Model: m, Recoder: h}, Prompt{tok, 32}, ref, rec, "Setup.Steps"},
		{Setup{Config: c, Model: m, Recoder: h, Steps: 4, Tolerance: -1}, Prompt{tok, 32}, ref, rec, "Setup.Tolerance"},
		{Setup{Config: c, Model: m, Recoder: h, Steps: 4, Tolerance: math.NaN()}, Prompt{tok, 32}, ref, rec, "Setup.Tolerance"},
		{good, Prompt{tok, 0}, ref, rec, "Prompt.Cached 0"},
		{good, Prompt{tok, 24}, ref, rec, "Prompt.Cached 24"},
		{good, Prompt{tok[:32], 32}, ref, rec, "below the prompt's 32 tokens"},
		{good, Prompt{tok, 32}, ref[:2], rec, "needs 3"},
		{good, Prompt{tok, 32}, ref, rec[:2], "needs 3"},
		{good, Prompt{tok, 32}, ref, []int32{3, 4, 0}, "slot 0 given twice"},
	}
	for _, tc := range cases {
		if _, err := Run(tc.s, tc.p, tc.ref, tc.rec); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("want an error with %q, got %v", tc.want, err)
		}
	}
	if !bytes.Equal(before, m.Region()) {
		t.Fatal("a rejected run changed the KV region")
	}
}

// TestHostRecoder: the destination slots hold codec.Decode(codec.Encode)
// of the sources, which stay as they were; mismatched slot lists and a bad
// codec are refused.
func TestHostRecoder(t *testing.T) {
	c, m := tinyCPU(t, 8)
	r := rand.New(rand.NewPCG(2, 2))
	for i := range m.Region() {
		m.Region()[i] = byte(r.IntN(256)) &^ 0x40 // no Inf or NaN bf16 patterns
	}
	src := bytes.Clone(m.Slot(1))
	h, err := NewHostRecoder(c, codec.FP8E4M3PerHead, m.Slot)
	if err != nil {
		t.Fatal(err)
	}
	if err := h.Recode([]int32{1, 2}, []int32{5, 6}); err != nil {
		t.Fatal(err)
	}
	want := make([]byte, len(src))
	if err := roundTrip(codec.FP8E4M3PerHead, ShapeOf(c), want, make([]byte, len(h.enc)), src); err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(m.Slot(5), want) || !bytes.Equal(m.Slot(1), src) {
		t.Fatal("slot 5 is not slot 1's round trip, or slot 1 changed")
	}
	if bytes.Equal(want, src) {
		t.Fatal("the round trip changed nothing: not a lossy codec")
	}
	if err := h.Recode([]int32{1}, nil); err == nil || !strings.Contains(err.Error(), "1 source slots, 0 destinations") {
		t.Fatalf("mismatched slots: %v", err)
	}
	if _, err := NewHostRecoder(c, codec.Codec(9), m.Slot); err == nil || !strings.Contains(err.Error(), "unknown codec") {
		t.Fatalf("a bad codec: %v", err)
	}
}

// simRegion is a simulated device of memory bytes, a region of size bytes
// on it and a stream, released when t ends.
func simRegion(t *testing.T, memory, size int64) (cudastream.Device, cudastream.DevicePtr, cudastream.Stream) {
	t.Helper()
	sim, err := cudastream.NewSim(cudastream.SimConfig{MemoryBytes: memory})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { sim.Close() })
	base, err := sim.Alloc(size)
	if err != nil {
		t.Fatal(err)
	}
	st, err := sim.NewStream(0)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Destroy() })
	return sim, base, st
}

// TestGoDeviceRecoder: on the simulated device, the round trip in chunks
// of 3 over 7 blocks writes what HostRecoder writes; bad arguments are
// refused, by the kernels' recoder too, whose Check tells the Go round
// trip from a block with one byte changed.
func TestGoDeviceRecoder(t *testing.T) {
	c, m := tinyCPU(t, 16)
	r := rand.New(rand.NewPCG(3, 3))
	for i := range m.Region() {
		m.Region()[i] = byte(r.IntN(256)) &^ 0x40
	}
	sim, base, st := simRegion(t, 1<<22, int64(len(m.Region())))
	if err := st.CopyHtoD(base, m.Region()); err != nil {
		t.Fatal(err)
	}
	reg := DeviceRegion{Base: base, BlockBytes: c.BlockBytes()}
	g, err := NewGoDeviceRecoder(st, reg, c, 3)
	if err != nil {
		t.Fatal(err)
	}
	src, dst := span(0, 7), []int32{15, 9, 8, 14, 10, 13, 12}
	if err := g.Recode(src, dst); err != nil {
		t.Fatal(err)
	}
	got := make([]byte, len(m.Region()))
	if err := st.CopyDtoH(got, base); err != nil {
		t.Fatal(err)
	}
	if err := st.Synchronize(); err != nil {
		t.Fatal(err)
	}
	h, _ := NewHostRecoder(c, codec.FP8E4M3PerHead, m.Slot)
	if err := h.Recode(src, dst); err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(got, m.Region()) {
		t.Fatal("the device round trip differs from the host's")
	}
	if err := g.Recode(src, dst[:2]); err == nil || !strings.Contains(err.Error(), "7 source slots, 2 destinations") {
		t.Fatalf("mismatched slots: %v", err)
	}
	if _, err := NewGoDeviceRecoder(st, reg, c, 0); err == nil || !strings.Contains(err.Error(), "chunk 0") {
		t.Fatalf("chunk 0: %v", err)
	}
	if _, err := NewGoDeviceRecoder(st, DeviceRegion{Base: base, BlockBytes: 4096}, c, 1); err == nil || !strings.Contains(err.Error(), "blocks of 4096 bytes") {
		t.Fatalf("a region of other blocks: %v", err)
	}
	if _, err := NewKernelRecoder(sim, nil, st, reg, c, 0); err == nil || !strings.Contains(err.Error(), "chunk 0") {
		t.Fatalf("kernels, chunk 0: %v", err)
	}
	if _, err := NewKernelRecoder(sim, nil, st, DeviceRegion{Base: base, BlockBytes: 4096}, c, 1); err == nil || !strings.Contains(err.Error(), "blocks of 4096 bytes") {
		t.Fatalf("kernels, a region of other blocks: %v", err)
	}

	// KernelRecoder.Check holds a destination to the Go reference's round
	// trip of its source (here the Go path's, on the simulator).
	kr, err := NewKernelRecoder(sim, nil, st, reg, c, 2)
	if err != nil {
		t.Fatal(err)
	}
	defer kr.Close()
	if err := kr.Recode(src, dst[:1]); err == nil || !strings.Contains(err.Error(), "7 source slots, 1 destinations") {
		t.Fatalf("kernels, mismatched slots: %v", err)
	}
	if err := kr.Check(src[2], dst[2]); err != nil {
		t.Fatalf("Check of the Go round trip: %v", err)
	}
	if err := st.CopyHtoD(base+cudastream.DevicePtr(int64(dst[2])*c.BlockBytes()+100), []byte{^got[int64(dst[2])*c.BlockBytes()+100]}); err != nil {
		t.Fatal(err)
	}
	if err := kr.Check(src[2], dst[2]); err == nil || !strings.Contains(err.Error(), "differs from the Go reference's at byte 100") {
		t.Fatalf("Check of a block with a byte changed: %v", err)
	}
}

// TestRunCountsAFlip: Run on the CPU reference with a recoder that writes
// the first block into every destination (wrong KV, but KV of this
// prompt; a permutation of whole blocks would not do: attention sums over
// keys in any order, and their rotation travels with them): the drift and
// the continuation's first difference are reported, the near-tie rule
// applied at it, and the tail over the original blocks equals the one-shot
// prefill.
func TestRunCountsAFlip(t *testing.T) {
	c, m := tinyCPU(t, 16)
	swap := recodeFunc(func(src, dst []int32) error {
		for i := range src {
			copy(m.Slot(dst[i]), m.Slot(src[0]))
		}
		return nil
	})
	s := Setup{Config: c, Model: m, Recoder: swap, Steps: 8, Tolerance: 0.1}
	p := Prompt{Tokens: randomTokens(rand.New(rand.NewPCG(4, 4)), 80, c.Vocab), Cached: 64}
	res, err := Run(s, p, span(0, 8), span(8, 16))
	if err != nil {
		t.Fatal(err)
	}
	if res.Noise != (Drift{}) || res.Prefill.Abs == 0 || res.Agree || res.FirstDiff < 0 || res.Compared != res.FirstDiff+1 ||
		res.Gap <= 0 || res.Tie != (res.Gap <= 0.1) || res.CachedTokens != 64 || res.Tokens != 80 {
		t.Fatalf("the first block everywhere: %+v", res)
	}
}

type recodeFunc func(src, dst []int32) error

func (f recodeFunc) Recode(src, dst []int32) error { return f(src, dst) }

// TestAdjacentRuns: the kernels' launches cover runs adjacent on both
// sides, cut at the chunk.
func TestAdjacentRuns(t *testing.T) {
	src := []int32{0, 1, 2, 3, 7, 8, 9, 10, 11}
	dst := []int32{20, 21, 22, 30, 31, 32, 33, 34, 35}
	var got [][2]int
	for i, j := range adjacentRuns(src, dst, 3) {
		got = append(got, [2]int{i, j})
	}
	want := [][2]int{{0, 3}, {3, 4}, {4, 7}, {7, 9}} // dst breaks at 3, src at 4, the chunk at 7
	if !slices.Equal(got, want) {
		t.Fatalf("runs %v, want %v", got, want)
	}
	for range adjacentRuns(nil, nil, 3) {
		t.Fatal("a run of nothing")
	}
}

// TestOneShotReference: with the reference continuing from the one-shot
// prefill, blocks copied as they are agree with it everywhere on the CPU
// reference (whose passes of any shape give the same logits), and the
// first block written everywhere still flips a token: the comparison is
// of the round trip's side against the one-shot prefill's.
func TestOneShotReference(t *testing.T) {
	c, m := tinyCPU(t, 16)
	same := recodeFunc(func(src, dst []int32) error {
		for i := range src {
			copy(m.Slot(dst[i]), m.Slot(src[i]))
		}
		return nil
	})
	p := Prompt{Tokens: randomTokens(rand.New(rand.NewPCG(4, 4)), 80, c.Vocab), Cached: 64}
	s := Setup{Config: c, Model: m, Recoder: same, Steps: 8, Tolerance: 0.1, OneShotReference: true}
	res, err := Run(s, p, span(0, 8), span(8, 16))
	if err != nil {
		t.Fatal(err)
	}
	if !res.Agree || res.Prefill != (Drift{}) || res.Noise != (Drift{}) || res.Compared != 8 {
		t.Fatalf("blocks copied as they are, against the one-shot prefill: %+v", res)
	}
	s.Recoder = recodeFunc(func(src, dst []int32) error {
		for i := range src {
			copy(m.Slot(dst[i]), m.Slot(src[0]))
		}
		return nil
	})
	if res, err = Run(s, p, span(0, 8), span(8, 16)); err != nil {
		t.Fatal(err)
	}
	if res.Agree || res.Prefill.Abs == 0 || res.FirstDiff < 0 {
		t.Fatalf("the first block everywhere, against the one-shot prefill: %+v", res)
	}
}

// TestCopyRecoder: on the simulated device, the destinations hold their
// sources' bytes; mismatched slots are refused.
func TestCopyRecoder(t *testing.T) {
	const block = 256
	_, base, st := simRegion(t, 1<<16, 8*block)
	want := make([]byte, 8*block)
	for i := range want {
		want[i] = byte(i * 7)
	}
	if err := st.CopyHtoD(base, want); err != nil {
		t.Fatal(err)
	}
	cr := CopyRecoder{St: st, Region: DeviceRegion{Base: base, BlockBytes: block}}
	if err := cr.Recode([]int32{0, 1}, []int32{6, 4}); err != nil {
		t.Fatal(err)
	}
	copy(want[6*block:7*block], want[0:block])
	copy(want[4*block:5*block], want[block:2*block])
	got := make([]byte, 8*block)
	if err := st.CopyDtoH(got, base); err != nil {
		t.Fatal(err)
	}
	if err := st.Synchronize(); err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(got, want) {
		t.Fatal("the copied slots differ from their sources")
	}
	if err := cr.Recode([]int32{0, 1}, []int32{6}); err == nil || !strings.Contains(err.Error(), "2 source slots, 1 destinations") {
		t.Fatalf("mismatched slots: %v", err)
	}
}
