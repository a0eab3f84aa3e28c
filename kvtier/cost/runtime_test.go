package cost

import (
	"bytes"
	"math"
	"math/rand/v2"
	"strings"
	"testing"
)

// slowCurve is trueCurve's runtime with an attention kernel a third as
// fast: what a server learned before its kernel changed.
var slowCurve = func() PrefillFit {
	f := trueCurve
	f.AttentionFLOPS /= 3
	f.PrefixAttentionFLOPS /= 3
	return f
}()

// sampleOf is sampleCurve's samples re-timed on curve f (the same shapes
// and noise).
func sampleOf(t *testing.T, rng *rand.Rand, n int, f PrefillFit) []PrefillSample {
	t.Helper()
	g, _ := LookupGPU("h200")
	out := sampleCurve(t, rng, n)
	for i := range out {
		s := &out[i]
		m, err := LookupModel(s.Model)
		if err != nil {
			t.Fatal(err)
		}
		ratio := s.Seconds / curveSeconds(t, s.Model, s.TP, s.Prefix, s.Tokens)
		fit := &Fit{Prefill: f}
		pc := fit.PrefillCost(&m, &g, max(1, s.TP))
		s.Seconds = pc.Seconds(s.Tokens, s.Prefix) * ratio
	}
	return out
}

// gridError is the largest relative error of c's predictions on the grid
// against trueCurve.
func gridError(t *testing.T, c *Calibration) float64 {
	worst := 0.0
	for i, p := range predictGrid(t, c) {
		s := grid[i]
		worst = max(worst, math.Abs(p/curveSeconds(t, s.Model, s.TP, s.Prefix, s.Tokens)-1))
	}
	return worst
}

// TestSetRuntime: a calibration holding 93 samples of the slow curve with
// no runtime named (a file written before samples named theirs), as the
// serve benchmark's starting calibration was when the attention kernel
// changed (serve-fidelity-h200-run7). Fitted beside 150 samples of
// trueCurve they leave the grid more than 10% off (16-51% for these
// seeds); SetRuntime("fast") drops all 93 (and says so), keeps their fit
// as the prior (the same predictions, the width at least the presets'),
// takes later samples without a runtime as "fast"'s (WriteJSON records
// it, a reload under the same runtime drops none), refuses one of another
// runtime naming both, and after the same 150 samples predicts the grid
// within 5% (4.4% at worst). An empty name keeps every sample; a name past
// 256 bytes is refused.
func TestSetRuntime(t *testing.T) {
	g, _ := LookupGPU("h200")
	for seed := range uint64(3) {
		rng := rand.New(rand.NewPCG(seed, 37))
		stale := sampleOf(t, rng, 93, slowCurve)
		fresh := sampleCurve(t, rng, 150)

		mixed, _ := NewCalibration(g)
		if err := mixed.AddPrefillSamples(append(append([]PrefillSample(nil), stale...), fresh...)...); err != nil {
			t.Fatal(err)
		}
		if e := gridError(t, mixed); e < 0.10 {
			t.Errorf("seed %d: stale samples beside fresh ones leave the grid only %.1f%% off: the test shows nothing", seed, 100*e)
		}

		c, _ := NewCalibration(g)
		if err := c.AddPrefillSamples(stale...); err != nil {
			t.Fatal(err)
		}
		before := predictGrid(t, c)
		if n, err := c.SetRuntime(""); n != 0 || err != nil {
			t.Fatalf("SetRuntime(\"\"): dropped %d, %v", n, err)
		}
		n, err := c.SetRuntime("fast")
		if err != nil || n != len(stale) {
			t.Fatalf("seed %d: SetRuntime dropped %d of %d (%v)", seed, n, len(stale), err)
		}
		fit := c.Current().Prefill
		if fit.Samples != 0 || fit.ErrorWidth < PriorPrefillWidth {
			t.Fatalf("seed %d: after the drop: %d samples, width %g", seed, fit.Samples, fit.ErrorWidth)
		}
		for i, p := range predictGrid(t, c) {
			if math.Abs(p/before[i]-1) > 1e-9 {
				t.Fatalf("seed %d: grid point %d moved from %g to %g: the dropped samples' fit is not the prior", seed, i, before[i], p)
			}
		}
		other := fresh[0]
		other.Runtime = "slow"
		if err := c.AddPrefillSamples(other); err == nil || !strings.Contains(err.Error(), "slow") || !strings.Contains(err.Error(), `"fast"`) {
			t.Fatalf("a sample of another runtime: %v", err)
		}
		if err := c.AddPrefillSamples(fresh...); err != nil {
			t.Fatal(err)
		}
		if e := gridError(t, c); e > 0.05 {
			t.Errorf("seed %d: after its own runtime's samples the grid is %.1f%% off", seed, 100*e)
		}
		var buf bytes.Buffer
		if err := c.WriteJSON(&buf); err != nil {
			t.Fatal(err)
		}
		if k := strings.Count(buf.String(), `"runtime": "fast"`); k != len(fresh) {
			t.Fatalf("seed %d: the file names the runtime of %d samples, want %d", seed, k, len(fresh))
		}
		again, err := LoadCalibration(&buf, g)
		if err != nil {
			t.Fatal(err)
		}
		if n, err := again.SetRuntime("fast"); n != 0 || err != nil {
			t.Fatalf("reloaded under the same runtime: dropped %d (%v)", n, err)
		}
	}
	c, _ := NewCalibration(g)
	long := strings.Repeat("x", maxRuntimeLen+1)
	if _, err := c.SetRuntime(long); err == nil || !strings.Contains(err.Error(), "runtime") {
		t.Fatalf("a %d-byte runtime name: %v", len(long), err)
	}
	s := sampleCurve(t, rand.New(rand.NewPCG(1, 1)), 1)[0]
	s.Runtime = long
	if err := c.AddPrefillSamples(s); err == nil || !strings.Contains(err.Error(), "runtime") {
		t.Fatalf("a sample with a %d-byte runtime: %v", len(long), err)
	}
}
