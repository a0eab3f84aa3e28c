package model_test

import (
	"bytes"
	"context"
	"testing"

	"kvtier.dev/cudastream"
	"kvtier.dev/examples/server/internal/model"
	"kvtier.dev/examples/server/internal/roundtrip"
	"kvtier.dev/kvtier/transfer"
)

// TestReuseAfterTierRoundTrip prefills 5 blocks on the CPU backend, sends
// them through the pinned host tier and the NVMe tier with kvtier's copy
// engine and store (on the simulated device, whose memory stands in for the
// GPU region), and prefills the rest of the sequence on top of the blocks
// that came back into other slots. Every copy of the blocks is identical to
// the original bytes, and the logits equal a one-shot prefill's exactly.
func TestReuseAfterTierRoundTrip(t *testing.T) {
	const n, k, slots = 26, 5, 16
	c := model.Tiny()
	tok := make([]int32, n)
	for i := range tok {
		tok[i] = int32((i*31 + 5) % c.Vocab)
	}
	all := func(from, to int) []int32 {
		var p []int32
		for i := from; i < to; i++ {
			p = append(p, int32(i))
		}
		return p
	}
	blocks := c.Blocks(n)
	first := make([]int32, blocks) // slots 0..6
	for b := range first {
		first[b] = int32(b)
	}

	ref, err := model.NewCPU(c, 7, slots)
	if err != nil {
		t.Fatal(err)
	}
	want, wantNext, err := ref.Forward(tok, model.Plan{Slots: first, Compute: all(0, n)})
	if err != nil {
		t.Fatal(err)
	}
	want = append([]float32(nil), want...)

	m, err := model.NewCPU(c, 7, slots)
	if err != nil {
		t.Fatal(err)
	}
	if _, _, err := m.Forward(tok[:k*c.BlockTokens], model.Plan{Slots: first[:k], Compute: all(0, k*c.BlockTokens)}); err != nil {
		t.Fatal(err)
	}

	// The simulated GPU's region mirrors the CPU backend's.
	sim, err := cudastream.NewSim(cudastream.SimConfig{MemoryBytes: 1 << 20})
	if err != nil {
		t.Fatal(err)
	}
	defer sim.Close()
	base, err := sim.Alloc(int64(slots) * c.BlockBytes())
	if err != nil {
		t.Fatal(err)
	}
	st, err := sim.NewStream(0)
	if err != nil {
		t.Fatal(err)
	}
	defer st.Destroy()
	if err := st.CopyHtoD(base, m.Region()); err != nil {
		t.Fatal(err)
	}
	layout, err := transfer.BlockFirstLayout(base, c.Layers, 2, slots, c.PartBytes())
	if err != nil {
		t.Fatal(err)
	}
	src, dst := first[:k], []int32{15, 9, 12, 10, 14} // scattered, away from 0..6
	trip, err := roundtrip.Blocks(context.Background(), sim, layout, t.TempDir(), src, dst)
	if err != nil {
		t.Fatal(err)
	}
	if err := st.CopyDtoH(m.Region(), base); err != nil {
		t.Fatal(err)
	}
	if err := st.Synchronize(); err != nil {
		t.Fatal(err)
	}
	for i := range src {
		orig := ref.Slot(src[i])
		for what, b := range map[string][]byte{"host tier": trip.Host[i], "NVMe tier": trip.NVMe[i], "GPU after the trip": m.Slot(dst[i])} {
			if !bytes.Equal(b, orig) {
				t.Fatalf("block %d differs in the %s", i, what)
			}
		}
		clear(m.Slot(src[i])) // the old copies are gone: only the trip's count
	}

	moved := append(append([]int32(nil), dst...), first[k:]...)
	got, next, err := m.Forward(tok, model.Plan{Slots: moved, Compute: all(k*c.BlockTokens, n)})
	if err != nil {
		t.Fatal(err)
	}
	if next != wantNext {
		t.Fatalf("greedy token %d, want %d", next, wantNext)
	}
	for i := range got {
		if got[i] != want[i] {
			t.Fatalf("logit %d: %g after the round trip, %g in one prefill", i, got[i], want[i])
		}
	}
}
