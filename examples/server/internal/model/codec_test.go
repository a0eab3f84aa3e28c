package model_test

import (
	"encoding/binary"
	"math"
	"math/rand/v2"
	"testing"

	"kvtier.dev/examples/server/internal/kvdrift"
	"kvtier.dev/examples/server/internal/model"
	"kvtier.dev/internal/benchserve"
	"kvtier.dev/kvtier/codec"
)

// Bounds of TestReusedFP8KV, from its prompts under seven seeds. The
// drift that reused FP8 blocks cause, as a share of the logits' standard
// deviation over the vocabulary: the real codec moves the tail's and the
// continuations' logits by up to 0.085 of it; decoding with every scale
// 1.25 times too large moves the tail's by 0.8 or more, a zeroed block by
// 0.6 or more. The near-tie gap (benchserve.TieGap) of a continuation's
// first differing token: up to 0.37 nats with the real codec, which flips
// only close choices; 2 or more with the broken ones.
const (
	fp8DriftBound = 0.15
	fp8GapBound   = 1.0
)

// codecPrompts are TestReusedFP8KV's prompts: 4 to 11 cached blocks of 16
// tokens and a tail of 16, tokens drawn at random.
func codecPrompts(c model.Config, n int) []kvdrift.Prompt {
	r := rand.New(rand.NewPCG(37, 4))
	ps := make([]kvdrift.Prompt, n)
	for i := range ps {
		cached := c.BlockTokens * (4 + r.IntN(8))
		tok := make([]int32, cached+c.BlockTokens)
		for j := range tok {
			tok[j] = int32(r.IntN(c.Vocab))
		}
		ps[i] = kvdrift.Prompt{Tokens: tok, Cached: cached}
	}
	return ps
}

// tamperRecoder is the FP8 round trip with a defect: scale multiplies
// every decoded scale, zero clears the destination of the middle block.
type tamperRecoder struct {
	m     *model.CPU
	scale float32
	zero  bool
}

func (r tamperRecoder) Recode(src, dst []int32) error {
	s := kvdrift.ShapeOf(r.m.Config())
	enc := make([]byte, s.ScaleBytes()+s.BlockBytes()/2)
	for i := range src {
		if err := codec.Encode(codec.FP8E4M3PerHead, s, enc, r.m.Slot(src[i])); err != nil {
			return err
		}
		for g := range s.Layers * s.Parts * s.Heads {
			v := math.Float32frombits(binary.LittleEndian.Uint32(enc[4*g:]))
			binary.LittleEndian.PutUint32(enc[4*g:], math.Float32bits(v*r.scale))
		}
		if err := codec.Decode(codec.FP8E4M3PerHead, s, r.m.Slot(dst[i]), enc); err != nil {
			return err
		}
		if r.zero && i == len(src)/2 {
			clear(r.m.Slot(dst[i]))
		}
	}
	return nil
}

// copyRecoder moves blocks unchanged: reuse without a codec.
type copyRecoder struct{ m *model.CPU }

func (r copyRecoder) Recode(src, dst []int32) error {
	for i := range src {
		copy(r.m.Slot(dst[i]), r.m.Slot(src[i]))
	}
	return nil
}

// TestReusedFP8KV: on the CPU reference at the tiny shape (16-token
// blocks), 8 prompts reuse their cached blocks after a round trip through
// the FP8 codec (package codec's Go reference) into other slots, and are
// compared with the same prompts over the original blocks (kvdrift.Run):
// the tail's and the 32-token greedy continuations' logits stay within
// fp8DriftBound of the logits' spread, and a continuation that differs
// does so at a choice closer than fp8GapBound. (The tiny model's choices
// are often that close: about half of its continuations differ somewhere
// in 32 tokens; agreement is measured at real shapes on the GPU, by
// examples/server/internal/codecacc.) A codec that decodes with wrong
// scales, or loses a block, breaks both bounds; blocks moved unchanged
// give the one-shot prefill's logits bit for bit.
func TestReusedFP8KV(t *testing.T) {
	c, err := model.Lookup("tiny", 16)
	if err != nil {
		t.Fatal(err)
	}
	const steps, prompts = 32, 8
	run := func(name string, rc func(m *model.CPU) kvdrift.Recoder) kvdrift.Summary {
		m, err := model.NewCPU(c, 42, 64)
		if err != nil {
			t.Fatal(err)
		}
		s := kvdrift.Setup{Config: c, Model: m, Recoder: rc(m), Steps: steps, Tolerance: benchserve.DefaultVerifyTolerance}
		var rs []kvdrift.Result
		for _, p := range codecPrompts(c, prompts) {
			r, err := kvdrift.Run(s, p, slotRange(0, 32), slotRange(32, 32))
			if err != nil {
				t.Fatalf("%s: %v", name, err)
			}
			if r.Noise != (kvdrift.Drift{}) {
				t.Fatalf("%s: the tail over the original blocks differs from a one-shot prefill by %+v; the CPU reference computes both alike", name, r.Noise)
			}
			rs = append(rs, r)
		}
		sum := kvdrift.Summarize(rs)
		t.Logf("%s: %d of %d continuations agree (%d near ties); drift of the tail %.3g of the logits' spread (%.3g abs), of the continuations %.3g; largest gap of a flip %.3g nats",
			name, sum.Agree, sum.Prompts, sum.Ties, sum.Prefill.OfStd, sum.Prefill.Abs, sum.Continuation.OfStd, sum.LargestGap)
		return sum
	}

	fp8 := run("fp8", func(m *model.CPU) kvdrift.Recoder {
		h, err := kvdrift.NewHostRecoder(c, codec.FP8E4M3PerHead, m.Slot)
		if err != nil {
			t.Fatal(err)
		}
		return h
	})
	if d := max(fp8.Prefill.OfStd, fp8.Continuation.OfStd); d > fp8DriftBound || d == 0 || fp8.LargestGap > fp8GapBound {
		t.Errorf("FP8: drift %.3g of the logits' spread (bound %g; 0 means the codec did nothing), a continuation flipped at a gap of %.3g nats (bound %g)",
			d, fp8DriftBound, fp8.LargestGap, fp8GapBound)
	}
	for _, bad := range []struct {
		name string
		r    func(m *model.CPU) tamperRecoder
	}{
		{"scales 2x", func(m *model.CPU) tamperRecoder { return tamperRecoder{m: m, scale: 2} }},
		{"scales 1.25x", func(m *model.CPU) tamperRecoder { return tamperRecoder{m: m, scale: 1.25} }},
		{"a zeroed block", func(m *model.CPU) tamperRecoder { return tamperRecoder{m: m, scale: 1, zero: true} }},
	} {
		s := run(bad.name, func(m *model.CPU) kvdrift.Recoder { return bad.r(m) })
		if s.Prefill.OfStd <= fp8DriftBound || s.LargestGap <= fp8GapBound {
			t.Errorf("a broken codec (%s) passes a bound: drift %.3g of the logits' spread (bound %g), largest gap of a flip %.3g nats (bound %g)",
				bad.name, s.Prefill.OfStd, fp8DriftBound, s.LargestGap, fp8GapBound)
		}
	}
	same := run("no codec", func(m *model.CPU) kvdrift.Recoder { return copyRecoder{m} })
	if same.Prefill != (kvdrift.Drift{}) || same.Continuation != (kvdrift.Drift{}) || same.Agree != prompts {
		t.Errorf("blocks moved unchanged: %+v; want no drift and every continuation equal", same)
	}
}

// slotRange is n slots from from.
func slotRange(from, n int) []int32 {
	s := make([]int32, n)
	for i := range s {
		s[i] = int32(from + i)
	}
	return s
}
