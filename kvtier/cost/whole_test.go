package cost

import (
	"errors"
	"math"
	"testing"
)

// TestPlanCodecLoadsLandWhole: a compressed tier's loads land every layer
// at their end, as the copy engine's coded onboards do (it decodes whole
// blocks); a raw tier's land layer after layer.
func TestPlanCodecLoadsLandWhole(t *testing.T) {
	pcie, err := LookupLink("pcie5-pinned")
	if err != nil {
		t.Fatal(err)
	}
	cfg := testCodecPlannerConfig(t, DirectPath(pcie))
	for _, coded := range []bool{false, true} {
		if coded {
			cfg.Paths[TierHost].Codec = fp8(t)
		}
		p, err := NewPlanner(cfg)
		if err != nil {
			t.Fatal(err)
		}
		var n [NumTiers]int
		n[TierHost] = 100
		pl := p.PassLoads(n, Backlog{})
		first, last := pl.LayerLanded(0), pl.LayerLanded(pl.Layers()-1)
		if coded && first != last {
			t.Errorf("compressed over %s: layer 0 lands at %v, the last at %v; want together", pcie.Name, first, last)
		}
		if !coded && !(first < last/10) {
			t.Errorf("raw over %s: layer 0 lands at %v, the last at %v; want one layer's share", pcie.Name, first, last)
		}
	}
}

// TestLoadSlowdownLearnedWhole: passes whose loads land whole (LoadWhole)
// and whose compute waits for them teach the slowdown they had; taken as
// landing layer after layer they would teach one far larger, the wait
// counted as slowdown.
func TestLoadSlowdownLearnedWhole(t *testing.T) {
	m, g, l := slowdownSetup(t)
	const gamma = 0.1
	fit := func(whole bool) float64 {
		c, err := NewCalibration(g)
		if err != nil {
			t.Fatal(err)
		}
		for i := range minSlowdownSamples + 2 {
			s := loadedPass(t, &m, &g, l, 4096+512*i, 1024+128*i, -1e-4*float64(i), gamma)
			// The same pass, its compute waiting for the whole load.
			pc := PresetPrefillCost(&m, &g, 1)
			work := pc.PassEndSeconds(s.Prefix) + pc.MarginalSeconds(s.Tokens, s.Prefix)
			// Its blocks issued whole, a chunk at a time.
			k := s.LoadBlocks
			busy := float64((k+wholeLoadChunkBlocks-1)/wholeLoadChunkBlocks)*(l.Latency+l.EventCost).Seconds() +
				float64(k)*(l.DescriptorCost.Seconds()+float64(s.LoadBytes)/float64(k)/l.BandwidthBytesPerS)
			s.LoadEndSeconds = s.LoadStartSeconds + 1.1*busy
			s.Seconds = max(work, s.LoadStartSeconds+busy+work) + gamma*min(work, busy, s.LoadStartSeconds+busy)
			s.LoadWhole = whole
			if err := c.AddPrefillSample(m, s); err != nil {
				t.Fatal(err)
			}
		}
		return c.Current().Prefill.LoadSlowdown
	}
	if got := fit(true); math.Abs(got-gamma) > 1e-9 {
		t.Errorf("whole loads: slowdown %v, want %v", got, gamma)
	}
	if got := fit(false); !(got > gamma+0.1) {
		t.Errorf("the same passes taken as layer after layer: slowdown %v, want well above %v (the wait counted as slowdown)", got, gamma)
	}
}

// TestLoadWholeWithoutLoads: LoadWhole on a pass without loads is
// refused, naming load_bytes.
func TestLoadWholeWithoutLoads(t *testing.T) {
	m, g, _ := slowdownSetup(t)
	c, err := NewCalibration(g)
	if err != nil {
		t.Fatal(err)
	}
	err = c.AddPrefillSample(m, PrefillSample{Tokens: 512, Seconds: 0.02, LoadWhole: true})
	var fe *FieldError
	if !errors.As(err, &fe) || fe.Field != "load_bytes" {
		t.Errorf("LoadWhole without loads: %v, want a FieldError of load_bytes", err)
	}
}
