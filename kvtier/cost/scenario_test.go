package cost

import (
	"errors"
	"math"
	"strings"
	"testing"
	"time"
)

func seed70B(tp int) Scenario {
	return Scenario{
		Model: Model{Name: "70b", Layers: 80, QHeads: 64, KVHeads: 8, HeadDim: 128, Dtype: BF16, TotalParams: 70e9, ActiveParams: 70e9},
		GPU:   GPU{Name: "600T", PeakFLOPS: 600e12, Efficiency: 1},
		TP:    tp,
		Path:  DirectPath(Link{Name: "pcie5", BandwidthBytesPerS: 50e9}),
	}
}

// TestSeedExercise2Times: 32K tokens reload over 50 GB/s in about 0.21 s;
// recompute at 600 TFLOP/s about 7.6 s linear-only, about 1 s with TP 8.
func TestSeedExercise2Times(t *testing.T) {
	s := seed70B(1)
	if err := s.Validate(); err != nil {
		t.Fatal(err)
	}
	if got := s.ReloadTime(32768).Seconds(); math.Abs(got-0.2147) > 0.001 {
		t.Errorf("reload %.4f s, want ~0.21", got)
	}
	if got := s.RecomputeTime(32768, 0, false).Seconds(); math.Abs(got-7.646) > 0.01 {
		t.Errorf("linear recompute %.3f s, want ~7.6", got)
	}
	s8 := seed70B(8)
	if got := s8.RecomputeTime(32768, 0, false).Seconds(); math.Abs(got-0.956) > 0.01 {
		t.Errorf("linear recompute TP 8 %.3f s, want ~1", got)
	}
	// Attention adds 4 × 80 × 64 × 128 × (32768·32769/2) FLOPs.
	att := 4.0 * 80 * 64 * 128 * (32768.0 * 32769 / 2)
	want := (2*70e9*32768 + att) / 600e12
	if got := s.RecomputeTime(32768, 0, true).Seconds(); math.Abs(got-want) > 1e-6 {
		t.Errorf("recompute with attention %.4f s, want %.4f", got, want)
	}
	d, err := s.Decide(32768, 0)
	if err != nil {
		t.Fatal(err)
	}
	if d.Choice != Reload || d.KVBytes != 32768*327680 {
		t.Errorf("decision %+v", d)
	}
}

// TestAttentionFLOPsBySum checks the closed form n·p + n(n+1)/2 against the
// sum over new tokens of the positions each attends to.
func TestAttentionFLOPsBySum(t *testing.T) {
	m := seed70B(1).Model
	for _, c := range [][2]int{{1, 0}, {7, 0}, {5, 9}, {100, 1000}} {
		n, p := c[0], c[1]
		pairs := 0
		for i := 1; i <= n; i++ {
			pairs += p + i
		}
		_, att := m.RecomputeFLOPs(n, p)
		if want := m.attentionFLOPsPerPair() * float64(pairs); att != want {
			t.Errorf("n=%d p=%d: %g, want %g", n, p, att, want)
		}
	}
}

func TestBestSplitAgainstScan(t *testing.T) {
	for _, s := range []Scenario{seed70B(1), seed70B(8), withLatency(seed70B(1), 2*time.Millisecond), slowLink(seed70B(1))} {
		for _, n := range []int{1, 2, 3, 17, 100, 1000, 4097} {
			for _, p := range []int{0, 500} {
				got, err := s.BestSplit(n, p)
				if err != nil {
					t.Fatal(err)
				}
				best := math.Inf(1)
				for k := 0; k <= n; k++ {
					v := math.Max(s.recomputeSeconds(k, p, true), s.reloadSeconds(n-k))
					best = math.Min(best, v)
				}
				if got.RecomputeTokens+got.LoadTokens != n {
					t.Fatalf("split %+v of %d", got, n)
				}
				if math.Abs(got.Time.Seconds()-best) > 1e-9 {
					t.Errorf("n=%d p=%d: split %v, scan finds %g s", n, p, got, best)
				}
				full := math.Min(s.recomputeSeconds(n, p, true), s.reloadSeconds(n))
				if got.Time.Seconds() > full+1e-9 {
					t.Errorf("split %v worse than either alone (%g)", got.Time, full)
				}
			}
		}
	}
}

func withLatency(s Scenario, l time.Duration) Scenario { s.Path.Ingress.Latency = l; return s }

// slowLink makes reload dearer per token than linear recompute, so reload
// wins only once attention's quadratic term catches up.
func slowLink(s Scenario) Scenario { s.Path.Ingress.BandwidthBytesPerS = 0.05e9; return s }

func TestBreakEvenAgainstScan(t *testing.T) {
	for i, s := range []Scenario{withLatency(seed70B(1), 2*time.Millisecond), withLatency(seed70B(8), 50*time.Microsecond), slowLink(seed70B(1)), seed70B(1)} {
		for _, attn := range []bool{false, true} {
			n, ok := s.BreakEven(attn)
			// The smallest n with reload <= recompute, by scanning.
			want := -1
			for k := 1; k <= 1<<20; k++ {
				if s.reloadSeconds(k) <= s.recomputeSeconds(k, 0, attn) {
					want = k
					break
				}
			}
			if want == -1 {
				if ok && n <= 1<<20 {
					t.Errorf("case %d attn=%v: break-even %d, scan finds none below 2^20", i, attn, n)
				}
				continue
			}
			if !ok || n != want {
				t.Errorf("case %d attn=%v: break-even %d (ok %v), scan %d", i, attn, n, ok, want)
			}
		}
	}
	// A 70B at 600 TFLOP/s prefills a token in 0.233 ms and a 50 GB/s link
	// moves one in 6.6 us, so a 2 ms latency breaks even at
	// 2 ms / (0.233 - 0.0066) ms = 8.8, i.e. 9 tokens.
	s := withLatency(seed70B(1), 2*time.Millisecond)
	if n, _ := s.BreakEven(true); n != 9 {
		t.Errorf("break-even %d tokens for 2 ms latency on a 70B at 600 TFLOP/s", n)
	}
}

func TestDecideRejects(t *testing.T) {
	s := seed70B(1)
	for _, c := range []struct {
		tokens, prefix int
		field          string
	}{{0, 0, "tokens"}, {-5, 0, "tokens"}, {1 << 31, 0, "tokens"}, {10, -1, "prefix"}, {1 << 29, 1<<30 - 1, "tokens"}} {
		_, err := s.Decide(c.tokens, c.prefix)
		var fe *FieldError
		if !errors.As(err, &fe) || fe.Field != c.field {
			t.Errorf("%d/%d: %v", c.tokens, c.prefix, err)
		}
		if _, err := s.BestSplit(c.tokens, c.prefix); err == nil {
			t.Errorf("BestSplit %d/%d accepted", c.tokens, c.prefix)
		}
	}
	bad := s
	bad.TP = 0
	var fe *FieldError
	if err := bad.Validate(); !errors.As(err, &fe) || fe.Field != "tp" {
		t.Errorf("tp 0: %v", err)
	}
	bad = s
	bad.Path.Ingress.BandwidthBytesPerS = 0
	if err := bad.Validate(); !errors.As(err, &fe) || fe.Field != "bandwidth" {
		t.Errorf("bandwidth 0: %v", err)
	}
}

// TestCheckFits: 70B's 141 GB of bf16 weights leave no room on one H200,
// fit at tp 8 beside 40 GiB of KV; 8B fits with 100 GB of KV, not 130.
func TestCheckFits(t *testing.T) {
	m70, _ := LookupModel("llama-3.1-70b")
	m8, _ := LookupModel("llama-3.1-8b")
	g, _ := LookupGPU("h200")
	cases := []struct {
		m    Model
		tp   int
		kv   int64
		fits bool
	}{
		{m70, 1, 40 << 30, false},
		{m70, 1, 0, false},
		{m70, 8, 40 << 30, true},
		{m8, 1, 40 << 30, true},
		{m8, 1, 100e9, true},
		{m8, 1, 130e9, false},
	}
	for _, c := range cases {
		s := Scenario{Model: c.m, GPU: g, TP: c.tp}
		err := s.CheckFits(c.kv)
		if (err == nil) != c.fits || (err != nil && (!errors.Is(err, ErrDoesNotFit) || !strings.Contains(err.Error(), "KV fits"))) {
			t.Errorf("%s tp %d with %d bytes of KV: %v, want fits %v", c.m.Name, c.tp, c.kv, err, c.fits)
		}
	}
	g.MemoryBytes = 0 // unknown: unchecked
	s := Scenario{Model: m70, GPU: g, TP: 1}
	if err := s.CheckFits(1 << 40); err != nil {
		t.Errorf("unknown memory: %v", err)
	}
}
