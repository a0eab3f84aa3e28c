package cost

import (
	"bytes"
	"encoding/json"
	"errors"
	"math"
	"strings"
	"testing"
	"time"
)

// loadedPass is a pass of tokens after prefix, the prefix loaded over l
// in 16-token blocks from start (seconds from the pass's start), that
// takes what a pass with slowdown γ takes under the presets: an onboard
// lands its layer j at start + (j+1)·u, u a copy call, a descriptor and
// the layer's bytes per block, and an event; layer j computes once it has
// landed and layer j-1 is done; the pass then ends γ × the time its loads
// overlapped its compute later.
func loadedPass(t *testing.T, m *Model, g *GPU, l Link, prefix, tokens int, start, gamma float64) PrefillSample {
	t.Helper()
	pc := PresetPrefillCost(m, g, 1)
	work := pc.PassEndSeconds(prefix) + pc.MarginalSeconds(tokens, prefix)
	blocks := prefix / 16
	block := 16 * m.KVBytesPerTokenPerRank(1)
	L := float64(m.Layers)
	u := l.Latency.Seconds() + float64(blocks)*(l.DescriptorCost.Seconds()+float64(block)/l.BandwidthBytesPerS/L) + l.EventCost.Seconds()
	end := max(work, start+u+work, start+L*u+work/L)
	end += gamma * min(work, L*u, start+L*u)
	return PrefillSample{Prefix: prefix, Tokens: tokens, Seconds: end, LoadBytes: int64(blocks) * block, LoadBlocks: blocks,
		LoadLink: l.Name, LoadStartSeconds: start, LoadEndSeconds: start + 1.1*L*u}
}

func slowdownSetup(t *testing.T) (Model, GPU, Link) {
	t.Helper()
	m, err := LookupModel("llama-3.1-8b")
	if err != nil {
		t.Fatal(err)
	}
	g, err := LookupGPU("h200")
	if err != nil {
		t.Fatal(err)
	}
	l, err := LookupLink("pcie5-pinned")
	if err != nil {
		t.Fatal(err)
	}
	return m, g, l
}

// TestLoadSlowdownLearned: passes with loads in flight, each ending γ ×
// their loads' overlap later than the pass model says, whether their
// compute or their loads set the end, teach the calibration γ once there
// are enough of them; passes whose loads took far longer than priced
// (queued behind other copies) are not taken; the samples survive a file
// and the fit with them.
func TestLoadSlowdownLearned(t *testing.T) {
	m, g, l := slowdownSetup(t)
	c, err := NewCalibration(g)
	if err != nil {
		t.Fatal(err)
	}
	const gamma = 0.25
	add := func(s PrefillSample) {
		t.Helper()
		if err := c.AddPrefillSample(m, s); err != nil {
			t.Fatal(err)
		}
	}
	for i := range minSlowdownSamples - 1 {
		add(loadedPass(t, &m, &g, l, 4096+512*i, 1024+128*i, -1e-4*float64(i), gamma))
	}
	if p := c.Current().Prefill; p.LoadSlowdown != 0 || p.LoadSlowdownSamples != 0 {
		t.Fatalf("%d loaded passes: slowdown %v from %d, want the prior's 0", minSlowdownSamples-1, p.LoadSlowdown, p.LoadSlowdownSamples)
	}
	// Passes whose loads waited behind other copies: not taken.
	for i := range 10 {
		s := loadedPass(t, &m, &g, l, 8192, 512+i, 0, gamma)
		s.Seconds, s.LoadEndSeconds = 1, 0.9
		add(s)
	}
	// One whose loads set its end (30K tokens loaded, 64 computed).
	add(loadedPass(t, &m, &g, l, 30000, 64, -2e-4, gamma))
	p := c.Current().Prefill
	if math.Abs(p.LoadSlowdown-gamma) > 1e-9 || p.LoadSlowdownSamples != minSlowdownSamples {
		t.Fatalf("slowdown %v from %d passes, want %v from %d", p.LoadSlowdown, p.LoadSlowdownSamples, gamma, minSlowdownSamples)
	}
	if p.Samples != 0 {
		t.Errorf("%d prefill samples: a pass with loads must not fit the other terms", p.Samples)
	}
	var buf bytes.Buffer
	if err := c.WriteJSON(&buf); err != nil {
		t.Fatal(err)
	}
	back, err := LoadCalibration(&buf, g)
	if err != nil {
		t.Fatal(err)
	}
	if q := back.Current().Prefill; q.LoadSlowdown != p.LoadSlowdown || q.LoadSlowdownSamples != p.LoadSlowdownSamples {
		t.Errorf("read back: slowdown %v from %d, wrote %v from %d", q.LoadSlowdown, q.LoadSlowdownSamples, p.LoadSlowdown, p.LoadSlowdownSamples)
	}
	pc := c.Current().PrefillCost(&m, &g, 1)
	near := func(a, b float64) bool { return math.Abs(a-b) < 1e-9 }
	if !near(pc.LoadSlowdown, gamma) || !near(pc.SlowdownSeconds(1, 0.5), gamma*0.5) || !near(pc.SlowdownSeconds(1, 3), gamma) || pc.SlowdownSeconds(1, -1) != 0 {
		t.Errorf("PrefillCost: slowdown %v, SlowdownSeconds(1, 0.5) %v, (1, 3) %v, (1, -1) %v", pc.LoadSlowdown, pc.SlowdownSeconds(1, 0.5), pc.SlowdownSeconds(1, 3), pc.SlowdownSeconds(1, -1))
	}
}

// TestLoadSlowdownPrior: a calibration file without samples gives its
// load_slowdown as the prior; one out of bounds is refused by name.
func TestLoadSlowdownPrior(t *testing.T) {
	_, g, _ := slowdownSetup(t)
	for _, tc := range []struct {
		slowdown float64
		err      string
	}{{0.4, ""}, {-0.1, "load_slowdown"}, {maxLoadSlowdown + 1, "load_slowdown"}} {
		file := slowdownFile(t, g, tc.slowdown)
		c, err := LoadCalibration(bytes.NewReader(file), g)
		if tc.err != "" {
			if err == nil || !strings.Contains(err.Error(), tc.err) {
				t.Errorf("load_slowdown %v: error %v, want one naming %s", tc.slowdown, err, tc.err)
			}
			continue
		}
		if err != nil {
			t.Fatal(err)
		}
		if got := c.Current().Prefill.LoadSlowdown; got != tc.slowdown {
			t.Errorf("load_slowdown %v in the file: the fit has %v", tc.slowdown, got)
		}
	}
}

// slowdownFile is a calibration file of g's presets with load_slowdown s.
func slowdownFile(t *testing.T, g GPU, s float64) []byte {
	t.Helper()
	c, err := NewCalibration(g)
	if err != nil {
		t.Fatal(err)
	}
	var buf bytes.Buffer
	if err := c.WriteJSON(&buf); err != nil {
		t.Fatal(err)
	}
	var f map[string]any
	if err := json.Unmarshal(buf.Bytes(), &f); err != nil {
		t.Fatal(err)
	}
	p := f["prefill"].(map[string]any)
	p["load_slowdown"], p["error_width"] = s, 0
	b, err := json.Marshal(f)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// TestBadPassSampleChangesNothing: a pass sample whose shape or loads
// make no sense is refused with the field's name, and the fit stays.
func TestBadPassSampleChangesNothing(t *testing.T) {
	m, g, l := slowdownSetup(t)
	c, err := NewCalibration(g)
	if err != nil {
		t.Fatal(err)
	}
	good := loadedPass(t, &m, &g, l, 2048, 1024, 0, 0.2)
	before := c.Current()
	for _, tc := range []struct {
		field string
		edit  func(*PrefillSample)
	}{
		{"prefix_pairs", func(s *PrefillSample) { s.PrefixPairs = -1 }},
		{"prefix_pairs", func(s *PrefillSample) { s.PrefixPairs = int64(s.Tokens)*int64(s.Prefix) + 1 }},
		{"load_bytes", func(s *PrefillSample) { s.LoadBytes = -5 }},
		{"load_bytes", func(s *PrefillSample) { s.LoadBytes = 0 }},
		{"load_link", func(s *PrefillSample) { s.LoadLink = "" }},
		{"load_blocks", func(s *PrefillSample) { s.LoadBlocks = 0 }},
		{"load_blocks", func(s *PrefillSample) { s.LoadBlocks = int(s.LoadBytes) + 1 }},
		{"load_start_s", func(s *PrefillSample) { s.LoadStartSeconds = math.NaN() }},
		{"load_end_s", func(s *PrefillSample) { s.LoadEndSeconds = s.LoadStartSeconds - 1e-3 }},
	} {
		s := good
		tc.edit(&s)
		err := c.AddPrefillSample(m, s)
		var fe *FieldError
		if !errors.As(err, &fe) || fe.Field != tc.field {
			t.Errorf("%s: error %v, want a FieldError of %s", tc.field, err, tc.field)
		}
	}
	if c.Current() != before {
		t.Error("a refused sample published a new fit")
	}
}

// TestPrefixPairsPriceTheShape: a pass that recomputes a head before its
// present tokens attends fewer pairs with them than one run after them;
// PrefixPairs says how many, and 0 means the run's.
func TestPrefixPairsPriceTheShape(t *testing.T) {
	m, g, _ := slowdownSetup(t)
	c, err := NewCalibration(g)
	if err != nil {
		t.Fatal(err)
	}
	run := PrefillSample{Prefix: 4096, Tokens: 1024}
	explicit := run
	explicit.PrefixPairs = 4096 * 1024
	head := run
	head.PrefixPairs = 4096 * 16 // only the last block after the present tokens
	fr, fe, fh := c.prefillFeatures(&m, &run), c.prefillFeatures(&m, &explicit), c.prefillFeatures(&m, &head)
	if fr != fe {
		t.Errorf("PrefixPairs 0 and tokens × prefix differ: %v, %v", fr, fe)
	}
	if got, want := fh[4], fr[4]*16/1024; math.Abs(got-want) > 1e-12*want {
		t.Errorf("the prefix term of 16 × 4096 pairs: %v, want %v", got, want)
	}
}

// TestPlanPricesLoadSlowdown: a plan whose pass outlasts its loads' copy
// ends γ × their copying time later with a load slowdown of γ; one with no
// loads, no later.
func TestPlanPricesLoadSlowdown(t *testing.T) {
	m, g, l := slowdownSetup(t)
	var paths [NumTiers]Path
	paths[TierHost] = DirectPath(l)
	planner := func(cal *Calibration) *Planner {
		p, err := NewPlanner(PlannerConfig{Model: m, GPU: g, TP: 1, BlockTokens: 16, Calibration: cal, Paths: paths})
		if err != nil {
			t.Fatal(err)
		}
		return p
	}
	exact, err := LoadCalibration(bytes.NewReader(slowdownFile(t, g, 0)), g)
	if err != nil {
		t.Fatal(err)
	}
	const gamma = 0.3
	slowed, err := LoadCalibration(bytes.NewReader(slowdownFile(t, g, gamma)), g)
	if err != nil {
		t.Fatal(err)
	}
	const loaded = 64
	blocks := make([]BlockSource, loaded+512) // a long recompute after a short load
	for i := range loaded {
		blocks[i].Tier = TierHost
	}
	for i := loaded; i < len(blocks); i++ {
		blocks[i].Tier = TierMissing
	}
	out := make([]Action, len(blocks))
	p0, p1 := planner(exact), planner(slowed)
	r0, err := p0.Plan(blocks, out)
	if err != nil {
		t.Fatal(err)
	}
	r1, err := p1.Plan(blocks, out)
	if err != nil {
		t.Fatal(err)
	}
	var n [NumTiers]int
	n[TierHost] = loaded
	pl := p1.PassLoads(n, Backlog{})
	busy := pl.Busy()
	if busy <= 0 || busy >= r0.LoadAllTime/4 {
		t.Fatalf("copying %v of a pass of %v: not the case this test is for", busy, r0.LoadAllTime)
	}
	want := r0.LoadAllTime + time.Duration(gamma*float64(busy))
	if d := r1.LoadAllTime - want; d < -time.Microsecond || d > time.Microsecond {
		t.Errorf("load all: %v with a slowdown of %v, %v without, want %v (copying %v)", r1.LoadAllTime, gamma, r0.LoadAllTime, want, busy)
	}
	if r1.RecomputeAllTime != r0.RecomputeAllTime {
		t.Errorf("recompute all: %v with a slowdown, %v without: it loads nothing", r1.RecomputeAllTime, r0.RecomputeAllTime)
	}
}
