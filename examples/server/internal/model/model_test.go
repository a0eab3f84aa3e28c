package model

import (
	"bytes"
	"math"
	"strings"
	"testing"

	"kvtier.dev/kvtier/cost"
)

const testSeed = 42

func newTiny(t *testing.T, slots int) *CPU {
	t.Helper()
	m, err := NewCPU(Tiny(), testSeed, slots)
	if err != nil {
		t.Fatal(err)
	}
	return m
}

// testTokens is a deterministic prompt of n tokens.
func testTokens(n, vocab int) []int32 {
	tok := make([]int32, n)
	for i := range tok {
		tok[i] = int32((i*7919 + 13) % vocab)
	}
	return tok
}

// allPositions is [from, n).
func allPositions(from, n int) []int32 {
	p := make([]int32, 0, n-from)
	for i := from; i < n; i++ {
		p = append(p, int32(i))
	}
	return p
}

// scatteredSlots gives block b slot (b*5+3) mod slots: not in order, so a
// layout bug that assumes contiguous blocks shows.
func scatteredSlots(blocks, slots int) []int32 {
	s := make([]int32, blocks)
	for b := range s {
		s[b] = int32((b*5 + 3) % slots)
	}
	return s
}

func TestPresetsAgreeWithCost(t *testing.T) {
	for _, name := range []string{"llama-3.1-8b", "llama-3.2-1b", "qwen2.5-7b"} {
		c, err := Preset(name, 16)
		if err != nil {
			t.Fatal(err)
		}
		m, _ := cost.LookupModel(name)
		if c.KVBytesPerToken() != m.KVBytesPerToken() {
			t.Errorf("%s: KV bytes per token %d, cost says %d", name, c.KVBytesPerToken(), m.KVBytesPerToken())
		}
		if r := float64(c.Params()) / m.TotalParams; math.Abs(r-1) > 0.01 {
			t.Errorf("%s: %d params, cost preset %g", name, c.Params(), m.TotalParams)
		}
	}
	if _, err := Preset("llama-3.1-70b", 16); err == nil || !strings.Contains(err.Error(), "unknown") {
		t.Fatalf("a preset without MLP shape: %v", err)
	}
}

func TestConfigValidate(t *testing.T) {
	cases := []struct {
		edit func(*Config)
		want string
	}{
		{func(c *Config) { c.Layers = 0 }, "Layers"},
		{func(c *Config) { c.Vocab = -1 }, "Vocab"},
		{func(c *Config) { c.KVHeads = 3 }, "KVHeads"},
		{func(c *Config) { c.HeadDim = 63 }, "HeadDim"},
		{func(c *Config) { c.RopeTheta = 0 }, "RopeTheta"},
		{func(c *Config) { c.NormEps = 0 }, "NormEps"},
		{func(c *Config) { c.BlockTokens = 0 }, "BlockTokens"},
	}
	for _, tc := range cases {
		c := Tiny()
		tc.edit(&c)
		if err := c.Validate(); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("want an error naming %s, got %v", tc.want, err)
		}
		if _, err := NewCPU(c, 1, 4); err == nil {
			t.Errorf("NewCPU took a config with a bad %s", tc.want)
		}
	}
	if _, err := NewCPU(Tiny(), 1, 0); err == nil || !strings.Contains(err.Error(), "numSlots") {
		t.Fatalf("NewCPU with no slots: %v", err)
	}
}

// TestValueExactInBF16 checks that every weight survives bf16 unchanged, so
// a backend that stores weights in bf16 sees the reference's values.
func TestValueExactInBF16(t *testing.T) {
	ts := TensorsOf(Tiny())
	for _, tn := range []Tensor{ts.Embed, ts.FinalNorm, ts.LMHead, ts.Layer[1][QKV], ts.Layer[0][MLPNorm]} {
		v := make([]float32, tn.Elems())
		tn.Fill(testSeed, v)
		distinct := map[float32]bool{}
		for i, f := range v {
			if roundBF16(f) != f {
				t.Fatalf("%s[%d] = %g is not a bf16 value", tn.Name, i, f)
			}
			distinct[f] = true
		}
		if len(distinct) < 2*tn.Lim {
			t.Errorf("%s: only %d distinct values", tn.Name, len(distinct))
		}
	}
	if Value(1, 5, 7, 127, 10, 0) == Value(2, 5, 7, 127, 10, 0) && Value(1, 5, 8, 127, 10, 0) == Value(2, 5, 8, 127, 10, 0) {
		t.Fatal("the seed does not change the weights")
	}
}

func TestBF16Rounding(t *testing.T) {
	cases := []struct {
		in   float32
		want BF16
	}{
		{1, 0x3f80},
		{1 + 1.0/256, 0x3f80},             // a tie: to even
		{1 + 3.0/256, 0x3f82},             // a tie: to even, up
		{1 + 1.0/256 + 1.0/65536, 0x3f81}, // above the tie
		{-2, 0xc000},
	}
	for _, c := range cases {
		if got := ToBF16(c.in); got != c.want {
			t.Errorf("ToBF16(%g) = %#x, want %#x", c.in, got, c.want)
		}
	}
	if !math.IsNaN(float64(ToBF16(float32(math.NaN())).Float32())) {
		t.Fatal("NaN lost")
	}
}

func TestForwardRejectsBadPlans(t *testing.T) {
	m := newTiny(t, 8)
	tok := testTokens(10, 512) // 3 blocks of 4
	good := Plan{Slots: []int32{0, 1, 2}, Compute: allPositions(0, 10)}
	before := bytes.Clone(m.Region())
	cases := []struct {
		tok  []int32
		p    Plan
		want string
	}{
		{nil, good, "no tokens"},
		{tok, Plan{Slots: []int32{0, 1}, Compute: good.Compute}, "plan has 2 slots"},
		{tok, Plan{Slots: good.Slots, Compute: allPositions(0, 9)}, "last position 9"},
		{tok, Plan{Slots: good.Slots}, "last position 9"},
		{tok, Plan{Slots: []int32{0, 8, 2}, Compute: good.Compute}, "Plan.Slots[1] = 8"},
		{tok, Plan{Slots: []int32{0, -1, 2}, Compute: good.Compute}, "Plan.Slots[1] = -1"},
		{tok, Plan{Slots: good.Slots, Compute: []int32{3, 3, 9}}, "Plan.Compute[1] = 3"},
		{tok, Plan{Slots: good.Slots, Compute: []int32{-2, 9}}, "Plan.Compute[0] = -2"},
		{append(testTokens(9, 512), 512), good, "token 512 at position 9"},
	}
	for _, c := range cases {
		_, _, err := m.Forward(c.tok, c.p)
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("want an error with %q, got %v", c.want, err)
		}
	}
	if !bytes.Equal(before, m.Region()) {
		t.Fatal("a rejected plan changed the KV region")
	}
}

// prefillAll computes the whole sequence into slots.
func prefillAll(t *testing.T, m *CPU, tok []int32, slots []int32) ([]float32, int32) {
	t.Helper()
	logits, next, err := m.Forward(tok, Plan{Slots: slots, Compute: allPositions(0, len(tok))})
	if err != nil {
		t.Fatal(err)
	}
	return append([]float32(nil), logits...), next
}

// decode runs steps greedy steps after a prefilled sequence, adding blocks
// from free as the sequence grows, and returns the tokens chosen.
func decode(t *testing.T, m *CPU, tok []int32, slots []int32, next int32, steps int, free func() int32) []int32 {
	t.Helper()
	bt := m.Config().BlockTokens
	var out []int32
	for range steps {
		out = append(out, next)
		tok = append(tok, next)
		if len(tok) > len(slots)*bt {
			slots = append(slots, free())
		}
		var err error
		_, next, err = m.Forward(tok, Plan{Slots: slots, Compute: []int32{int32(len(tok) - 1)}})
		if err != nil {
			t.Fatal(err)
		}
	}
	return out
}

// TestSuffixOnCachedPrefix: prefilling 37 tokens at once, and prefilling
// the first 5 blocks and then the rest on top of their KV, give the same
// logits and the same greedy tokens. Each token's arithmetic is the same in
// both (the CPU reference computes token by token), so the tolerance is
// zero: the logits are bit for bit equal.
func TestSuffixOnCachedPrefix(t *testing.T) {
	const n, k, slots = 37, 5, 16
	tok := testTokens(n, 512)
	bt := Tiny().BlockTokens
	sl := scatteredSlots(Tiny().Blocks(n), slots)

	a := newTiny(t, slots)
	wantLogits, wantNext := prefillAll(t, a, tok, sl)
	freeA := int32(slots - 1)
	wantTok := decode(t, a, tok, sl, wantNext, 8, func() int32 { freeA--; return freeA + 1 })

	b := newTiny(t, slots)
	prefillAll(t, b, tok[:k*bt], sl[:k])
	logits, next, err := b.Forward(tok, Plan{Slots: sl, Compute: allPositions(k*bt, n)})
	if err != nil {
		t.Fatal(err)
	}
	sameLogits(t, "suffix on a cached prefix", logits, wantLogits, 0)
	freeB := int32(slots - 1)
	gotTok := decode(t, b, tok, sl, next, 8, func() int32 { freeB--; return freeB + 1 })
	if !slicesEqual(gotTok, wantTok) {
		t.Fatalf("greedy tokens %v, want %v", gotTok, wantTok)
	}
}

// TestHolesRecomputed: after a full prefill, two blocks in the middle lose
// their KV; a plan that recomputes them and the last block while keeping
// the others restores their bytes exactly and gives the same logits.
func TestHolesRecomputed(t *testing.T) {
	const n, slots = 30, 8 // 8 blocks, the last one short
	c := Tiny()
	tok := testTokens(n, c.Vocab)
	sl := scatteredSlots(c.Blocks(n), slots)
	m := newTiny(t, slots)
	want, _ := prefillAll(t, m, tok, sl)
	saved := bytes.Clone(m.Region())

	compute := make([]bool, c.Blocks(n))
	compute[2], compute[5], compute[len(compute)-1] = true, true, true
	for b, h := range compute {
		if h {
			clear(m.Slot(sl[b]))
		}
	}
	got, _, err := m.Forward(tok, Plan{Slots: sl, Compute: AppendBlockPositions(nil, c.BlockTokens, n, compute)})
	if err != nil {
		t.Fatal(err)
	}
	sameLogits(t, "holes recomputed", got, want, 0)
	if !bytes.Equal(m.Region(), saved) {
		t.Fatal("recomputed blocks' KV differs from the first prefill's")
	}
}

// TestPrefixChangesLogits guards the tests above: if attention ignored the
// cached blocks, a different prefix would not change the suffix's logits.
func TestPrefixChangesLogits(t *testing.T) {
	const n = 20
	tok := testTokens(n, 512)
	m := newTiny(t, 8)
	sl := scatteredSlots(5, 8)
	want, _ := prefillAll(t, m, tok, sl)
	tok2 := append([]int32{tok[0] + 1}, tok[1:]...)
	got, _ := prefillAll(t, m, tok2, sl)
	if maxAbsDiff(got, want) == 0 {
		t.Fatal("changing the first token did not change the last token's logits")
	}
}

func slicesEqual(a, b []int32) bool {
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

func maxAbsDiff(a, b []float32) float64 {
	var d float64
	for i := range a {
		d = max(d, math.Abs(float64(a[i]-b[i])))
	}
	return d
}

func sameLogits(t *testing.T, what string, got, want []float32, tol float64) {
	t.Helper()
	if len(got) != len(want) {
		t.Fatalf("%s: %d logits, want %d", what, len(got), len(want))
	}
	if d := maxAbsDiff(got, want); d > tol || math.IsNaN(d) {
		t.Fatalf("%s: logits differ by up to %g (tolerance %g)", what, d, tol)
	}
}

// TestDecodeAllocatesNothing: once its scratch has grown, a decode step of
// the CPU backend allocates nothing (design.md, invariant 5).
func TestDecodeAllocatesNothing(t *testing.T) {
	m := newTiny(t, 8)
	tok := testTokens(20, 512)
	sl := scatteredSlots(5, 8)
	prefillAll(t, m, tok, sl)
	p := Plan{Slots: sl, Compute: []int32{19}}
	if n := testing.AllocsPerRun(5, func() {
		if _, _, err := m.Forward(tok, p); err != nil {
			t.Fatal(err)
		}
	}); n != 0 {
		t.Fatalf("a decode step allocates %v times", n)
	}
}
