package cost

import (
	"bytes"
	"math"
	"math/rand/v2"
	"strings"
	"testing"
)

// h200Wave is the server's wgmma kernel on the H200: 128 query rows a CTA
// × 132 SMs; llama-3.1-8b's 32 heads make it 528 rows.
const h200Wave = 128 * 132

// TestPrefixFullRowsPricesAWave: with PrefixFullRows R, a pass's pairs
// with its prefix count for its rows past R only (rows under R add
// nothing to the prefix term), the blocks of a pass sum to Seconds, and R
// = 0 is the pairs of every row, as MarginalSeconds counts them.
func TestPrefixFullRowsPricesAWave(t *testing.T) {
	m, _ := LookupModel("llama-3.1-8b")
	g, _ := LookupGPU("h200")
	f := &Fit{Prefill: trueCurve}
	f.Prefill.AttentionWave = h200Wave
	c := f.PrefillCost(&m, &g, 1)
	if c.PrefixFullRows != 528 {
		t.Fatalf("PrefixFullRows = %g for 32 heads and a wave of %d, want 528", c.PrefixFullRows, h200Wave)
	}
	flat := c
	flat.PrefixSecondsPerPair = 0
	const p = 8192
	for _, n := range []int{16, 100, 528} {
		if got, want := c.Seconds(n, p), flat.Seconds(n, p); math.Abs(got-want) > 1e-15 {
			t.Errorf("%d rows after %d: %g s, want %g (no pairs below the wave's 528 rows)", n, p, got, want)
		}
	}
	n := 2000
	if got, want := c.Seconds(n, p)-flat.Seconds(n, p), float64(p)*float64(n-528)*c.PrefixSecondsPerPair; math.Abs(got/want-1) > 1e-12 {
		t.Errorf("%d rows after %d: prefix term %g s, want %g (the pairs of the rows past 528)", n, p, got, want)
	}
	// The blocks of one pass, the present ones first, sum to Seconds.
	sum := c.PassEndSeconds(p)
	for done := 0; done < n; done += 16 {
		sum += c.BlockSeconds(min(16, n-done), done, p)
	}
	if want := c.Seconds(n, p); math.Abs(sum/want-1) > 1e-12 {
		t.Errorf("blocks of 16 sum to %g s, Seconds %g", sum, want)
	}
	zero := c
	zero.PrefixFullRows = 0
	if got, want := zero.Seconds(n, p), zero.PassEndSeconds(p)+zero.MarginalSeconds(n, p); math.Abs(got/want-1) > 1e-12 {
		t.Errorf("without a wave: %g s, want %g (every row's pairs)", got, want)
	}
}

// waveCurveSeconds is trueCurve with the H200 wave: what a runtime whose
// short passes sweep the prefix once would measure.
func waveCurveSeconds(t testing.TB, prefix, tokens int) float64 {
	t.Helper()
	m, _ := LookupModel("llama-3.1-8b")
	g, _ := LookupGPU("h200")
	f := &Fit{Prefill: trueCurve}
	f.Prefill.AttentionWave = h200Wave
	f.Prefill.PrefixReadBytesPerS = 60e9 // the sweep: 1 GB of an 8K prefix in 17 ms
	pc := f.PrefillCost(&m, &g, 1)
	return pc.Seconds(tokens, prefix)
}

// TestAttentionWaveFit: passes drawn from a curve with a wave, short ones
// after long prefixes among them, are fitted within 5% everywhere once
// the calibration knows the wave; the same samples fitted without it
// miss a long pass after a prefix by more.
func TestAttentionWaveFit(t *testing.T) {
	g, _ := LookupGPU("h200")
	rng := rand.New(rand.NewPCG(37, 11))
	var samples []PrefillSample
	for range 240 {
		tokens := 16 << rng.IntN(11)
		prefix := 0
		if rng.IntN(2) == 1 {
			prefix = 1024 << rng.IntN(5)
		}
		noise := 1 + 0.03*rng.NormFloat64()
		samples = append(samples, PrefillSample{Model: "llama-3.1-8b", Prefix: prefix, Tokens: tokens, Seconds: waveCurveSeconds(t, prefix, tokens) * noise})
	}
	points := []PrefillSample{
		{Model: "llama-3.1-8b", Prefix: 8192, Tokens: 64}, {Model: "llama-3.1-8b", Prefix: 8192, Tokens: 6144},
		{Model: "llama-3.1-8b", Prefix: 2048, Tokens: 8192}, {Model: "llama-3.1-8b", Tokens: 8192},
	}
	worst := func(wave int) (float64, PrefillSample) {
		c, err := NewCalibration(g)
		if err != nil {
			t.Fatal(err)
		}
		if err := c.SetAttentionWave(wave); err != nil {
			t.Fatal(err)
		}
		if err := c.AddPrefillSamples(samples...); err != nil {
			t.Fatal(err)
		}
		if got := c.Current().Prefill.AttentionWave; got != wave {
			t.Fatalf("the fit's AttentionWave = %d, want %d", got, wave)
		}
		w, at := 0.0, PrefillSample{}
		for _, s := range points {
			d, err := c.Current().Predict(s, &g)
			if err != nil {
				t.Fatal(err)
			}
			if e := math.Abs(d.Seconds()/waveCurveSeconds(t, s.Prefix, s.Tokens) - 1); e > w {
				w, at = e, s
			}
		}
		return w, at
	}
	with, at := worst(h200Wave)
	if with > 0.05 {
		t.Errorf("with the wave: %d tokens after %d predicted %.1f%% off the curve, want within 5%%", at.Tokens, at.Prefix, 100*with)
	}
	without, _ := worst(0)
	if !(without > with) {
		t.Errorf("without the wave the worst point is %.1f%% off, with it %.1f%%: the wave should fit better", 100*without, 100*with)
	}
	t.Logf("worst of %d points: %.1f%% with the wave, %.1f%% without", len(points), 100*with, 100*without)
}

// TestSetAttentionWave: setting the wave refits the samples already held
// and goes into the file; a bad wave is refused, naming it, and changes
// nothing; a file with a bad one is refused.
func TestSetAttentionWave(t *testing.T) {
	g, _ := LookupGPU("h200")
	c, err := NewCalibration(g)
	if err != nil {
		t.Fatal(err)
	}
	for _, s := range []PrefillSample{{Prefix: 8192, Tokens: 64}, {Prefix: 8192, Tokens: 6144}, {Tokens: 8192}, {Tokens: 512}, {Prefix: 2048, Tokens: 4096}} {
		s.Model, s.Seconds = "llama-3.1-8b", waveCurveSeconds(t, s.Prefix, s.Tokens)
		if err := c.AddPrefillSamples(s); err != nil {
			t.Fatal(err)
		}
	}
	before := c.Current().Prefill
	for _, bad := range []int{-1, maxAttentionWave + 1} {
		if err := c.SetAttentionWave(bad); err == nil || !strings.Contains(err.Error(), "attention_wave") {
			t.Errorf("SetAttentionWave(%d) = %v, want an error naming attention_wave", bad, err)
		}
	}
	if c.Current().Prefill != before {
		t.Fatal("a refused wave changed the fit")
	}
	if err := c.SetAttentionWave(h200Wave); err != nil {
		t.Fatal(err)
	}
	after := c.Current()
	if after.Prefill.AttentionWave != h200Wave || after.Prefill == before {
		t.Fatalf("after SetAttentionWave: %+v; want the wave and a refit of the samples held", after.Prefill)
	}
	var buf bytes.Buffer
	if err := c.WriteJSON(&buf); err != nil {
		t.Fatal(err)
	}
	back, err := LoadCalibration(bytes.NewReader(buf.Bytes()), g)
	if err != nil {
		t.Fatal(err)
	}
	if got := back.Current().Prefill; got != after.Prefill {
		t.Errorf("loaded back: %+v, want %+v", got, after.Prefill)
	}
	bad := strings.Replace(buf.String(), `"attention_wave": 16896`, `"attention_wave": -5`, 1)
	if bad == buf.String() {
		t.Fatal("the file does not carry attention_wave")
	}
	if _, err := LoadCalibration(strings.NewReader(bad), g); err == nil || !strings.Contains(err.Error(), "attention_wave") {
		t.Errorf("a file with attention_wave -5: %v, want an error naming attention_wave", err)
	}
}
