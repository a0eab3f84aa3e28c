package cost

import (
	"errors"
	"fmt"
	"sort"
	"sync"
	"sync/atomic"
	"time"
)

// PrefillSample is one measured prefill: Tokens computed with Prefix
// tokens present, on TP GPUs (0: 1). A line of `kvtier calc
// --prefill-samples`:
//
//	{"model":"llama-3.1-8b","prefix":0,"tokens":512,"seconds":0.0222}
type PrefillSample struct {
	Model   string  `json:"model"`
	TP      int     `json:"tp,omitempty"`
	Prefix  int     `json:"prefix"`
	Tokens  int     `json:"tokens"`
	Seconds float64 `json:"seconds"`
	// PrefixPairs is, for a pass that is not one run of Tokens after the
	// Prefix (a recomputed head before loaded blocks, a hole), how many
	// (computed token, present token before it) pairs it attends: between
	// 0 and Tokens × Prefix. 0: Tokens × Prefix, the one run's.
	PrefixPairs int64 `json:"prefix_pairs,omitempty"`
	// A pass with loads in flight: LoadBytes in LoadBlocks blocks copied
	// into the GPU over the link named LoadLink, from LoadStartSeconds to
	// LoadEndSeconds after the pass began (the start is negative for loads
	// submitted before it). Such samples set PrefillFit.LoadSlowdown
	// (slowdown.go) and none of the other terms.
	LoadBytes        int64   `json:"load_bytes,omitempty"`
	LoadBlocks       int     `json:"load_blocks,omitempty"`
	LoadLink         string  `json:"load_link,omitempty"`
	LoadStartSeconds float64 `json:"load_start_s,omitempty"`
	LoadEndSeconds   float64 `json:"load_end_s,omitempty"`
	// LoadWhole says the loads' layers all landed at their end, as a
	// compressed tier's onboards land (the copy engine copies and decodes
	// whole blocks, a chunk at a time), not layer after layer.
	LoadWhole bool `json:"load_whole,omitempty"`
	// Runtime names what computed the pass (Calibration.SetRuntime); empty
	// where the caller did not say.
	Runtime string `json:"runtime,omitempty"`
}

// CopySample is one measured copy: Bytes over Link, submitted to done.
type CopySample struct {
	Link    string  `json:"link"`
	Bytes   int64   `json:"bytes"`
	Seconds float64 `json:"seconds"`
}

// The prior's widths: how far the presets may be from a measurement.
const (
	PriorPrefillWidth = 0.5
	PriorLinkWidth    = 0.2
)

// Bounds of a Calibration's memory; older samples are forgotten.
const (
	MaxPrefillSamples = 256
	MaxCopySamples    = 128
	MaxLinks          = 16
	MaxCodecKernels   = 8
	MaxModels         = 16
)

// ridgeWeight is the prior's pull: a coefficient 100% away from the prior
// costs as much as one sample 3% off. Enough to settle what the samples
// leave open (two terms no sample tells apart), too little to resist a
// handful of measurements.
const ridgeWeight = 1e-3

// Scales of the prefill terms (see robust.go): the fixed cost in
// milliseconds (so the prior holds it near 0 and a pass cost the samples
// ask for goes to the weight term, which carries across models: the
// H200's leave-one-out is better for it); the others relative to the GPU
// preset's rates, so that the presets are θ = (0, 0, 1, 1, 1).
const fixedScaleSeconds = 1e-3

// prefixReadScale is the prefix-read term's scale: θ = 1 is the prefix's
// KV read at a tenth of the GPU's HBM bandwidth (ten reads a pass).
const prefixReadScale = 0.1

// Calibration learns this server's prefill and link figures from its own
// work (docs/cost.md). It is safe for concurrent use.
type Calibration struct {
	gpu GPU
	// wave is the runtime's attention wave (SetAttentionWave), 0 unknown;
	// under mu.
	wave int

	mu         sync.Mutex
	prior      [maxTerms]float64 // θ of the prefill prior
	priorWidth float64
	prefill    ring[prefillEntry]
	loaded     ring[prefillEntry] // samples with loads in flight (slowdown.go)
	// priorSlowdown is LoadSlowdown's value until enough loaded samples
	// say otherwise: 0, or a calibration file's without samples.
	priorSlowdown float64
	// runtime is SetRuntime's: the only runtime whose samples are kept.
	runtime   string
	slowdowns []weighted
	models    []Model
	links     linkSet
	kernels   linkSet // the codecs' kernels (AddCodecKernel)
	rows      []fitRow
	scratch   []float64

	cur atomic.Pointer[Fit]
}

type prefillEntry struct {
	s      PrefillSample
	row    fitRow // its features and seconds
	layers int    // its model's
}

type linkState struct {
	prior      Link
	priorTheta [maxTerms]float64
	priorWidth float64
	samples    ring[CopySample]
	fit        LinkFit
}

// ring keeps the newest len(buf) values.
type ring[T any] struct {
	buf  []T
	next int
	n    int
}

func (r *ring[T]) add(v T) {
	r.buf[r.next] = v
	r.next = (r.next + 1) % len(r.buf)
	r.n = min(r.n+1, len(r.buf))
}

// each calls f on the kept values, oldest first.
func (r *ring[T]) each(f func(*T)) {
	start := (r.next - r.n + len(r.buf)) % len(r.buf)
	for i := range r.n {
		f(&r.buf[(start+i)%len(r.buf)])
	}
}

// NewCalibration starts a calibration of g with the presets as its prior.
func NewCalibration(g GPU) (*Calibration, error) {
	if err := g.Validate(); err != nil {
		return nil, fmt.Errorf("calibration: %w", err)
	}
	c := &Calibration{gpu: g, prior: [maxTerms]float64{0, 0, 1, 1, 1, 0}, priorWidth: PriorPrefillWidth,
		links:   linkSet{limit: MaxLinks, what: "link", bound: "MaxLinks"},
		kernels: linkSet{limit: MaxCodecKernels, what: "codec kernel", bound: "MaxCodecKernels"}}
	c.prefill.buf = make([]prefillEntry, MaxPrefillSamples)
	c.loaded.buf = make([]prefillEntry, MaxLoadedSamples)
	c.rows = make([]fitRow, 0, max(MaxPrefillSamples, MaxCopySamples))
	c.scratch = make([]float64, 3*max(MaxPrefillSamples, MaxCopySamples))
	c.publishLocked()
	return c, nil
}

// GPU is the GPU of the prior.
func (c *Calibration) GPU() GPU { return c.gpu }

// Current is the newest fit: never nil, no lock, no allocation.
func (c *Calibration) Current() *Fit { return c.cur.Load() }

// hbmScale is the bytes per second the weight term is scaled by.
func (c *Calibration) hbmScale() float64 {
	if c.gpu.HBMBytesPerS > 0 {
		return c.gpu.HBMBytesPerS
	}
	return 1e12
}

// prefillFeatures are a prefill's terms under the prior's scales:
// predicted seconds = features · θ.
func (c *Calibration) prefillFeatures(m *Model, s *PrefillSample) [maxTerms]float64 {
	tp := max(1, s.TP)
	lin, _ := m.RecomputeFLOPs(s.Tokens, 0)
	n, p := float64(s.Tokens), float64(s.Prefix)
	f := c.gpu.EffectiveFLOPS() * float64(tp)
	perPair := m.attentionFLOPsPerPair() / f
	pairs := n * p
	if s.PrefixPairs > 0 {
		pairs = float64(s.PrefixPairs)
	}
	// The pairs of the rows past the wave (PrefillCost.PrefixFullRows).
	pairs *= max(0, n-prefixFullRows(m, tp, c.wave)) / n
	return [maxTerms]float64{fixedScaleSeconds, m.passBytesPerRank(tp) / c.hbmScale(), lin / f,
		n * (n + 1) / 2 * perPair, pairs * perPair, p * float64(m.KVBytesPerTokenPerRank(tp)) / (prefixReadScale * c.hbmScale())}
}

// AddPrefill records one prefill of m and refits before it returns.
func (c *Calibration) AddPrefill(m Model, tp, prefix, tokens int, d time.Duration) error {
	return c.AddPrefillSample(m, PrefillSample{TP: tp, Prefix: prefix, Tokens: tokens, Seconds: d.Seconds()})
}

// AddPrefillSample records s, a prefill of m (s.Model is set to m's
// name), and refits before it returns: the way to report a pass of any
// shape (PrefixPairs) or one with loads in flight.
func (c *Calibration) AddPrefillSample(m Model, s PrefillSample) error {
	s.Model = m.Name
	if err := m.Validate(); err != nil {
		return fmt.Errorf("calibration: model %s: %w", m.Name, err)
	}
	if err := checkSample(s); err != nil {
		return fmt.Errorf("calibration: prefill of %s: %w", s.Model, err)
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if err := c.registerLocked(m); err != nil {
		return fmt.Errorf("calibration: %w", err)
	}
	if err := c.addPrefillLocked(s, &m); err != nil {
		return fmt.Errorf("calibration: prefill of %s: %w", s.Model, err)
	}
	c.publishLocked()
	return nil
}

// AddPrefillSamples records samples of known models and refits once. A
// bad sample's error names its index; those before it are kept.
func (c *Calibration) AddPrefillSamples(samples ...PrefillSample) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	defer c.publishLocked()
	for i, s := range samples {
		m, err := c.modelLocked(s.Model)
		if err != nil {
			return fmt.Errorf("calibration: sample %d: %w", i+1, err)
		}
		if err := c.addPrefillLocked(s, &m); err != nil {
			return fmt.Errorf("calibration: sample %d (%s): %w", i+1, s.Model, err)
		}
	}
	return nil
}

func (c *Calibration) registerLocked(m Model) error {
	for i := range c.models {
		if c.models[i].Name == m.Name {
			c.models[i] = m
			return nil
		}
	}
	if len(c.models) == MaxModels {
		return fmt.Errorf("model %q: already %d models (MaxModels)", m.Name, MaxModels)
	}
	c.models = append(c.models, m)
	return nil
}

func (c *Calibration) modelLocked(name string) (Model, error) {
	for _, m := range c.models {
		if m.Name == name {
			return m, nil
		}
	}
	m, err := LookupModel(name)
	if err != nil {
		return Model{}, err
	}
	return m, nil
}

func checkSample(s PrefillSample) error {
	switch {
	case s.TP < 0 || s.TP > maxTP:
		return fieldErr("tp", s.TP, "must be between 0 (one GPU) and %d", maxTP)
	case s.Prefix < 0 || s.Prefix > maxTokens:
		return fieldErr("prefix", s.Prefix, "must be between 0 and %d", maxTokens)
	case s.Tokens < 1 || s.Tokens > maxTokens:
		return fieldErr("tokens", s.Tokens, "must be between 1 and %d", maxTokens)
	case !(s.Seconds > 0) || s.Seconds > 1e6:
		return fieldErr("seconds", s.Seconds, "must be positive and at most 1e6")
	case s.PrefixPairs < 0 || s.PrefixPairs > int64(s.Tokens)*int64(s.Prefix):
		return fieldErr("prefix_pairs", s.PrefixPairs, "must be between 0 and tokens × prefix (%d)", int64(s.Tokens)*int64(s.Prefix))
	case len(s.Runtime) > maxRuntimeLen:
		return fieldErr("runtime", s.Runtime, "must be at most %d bytes", maxRuntimeLen)
	}
	return checkLoads(s)
}

func (c *Calibration) addPrefillLocked(s PrefillSample, m *Model) error {
	if err := checkSample(s); err != nil {
		return err
	}
	if c.runtime != "" {
		switch s.Runtime {
		case "":
			s.Runtime = c.runtime
		case c.runtime:
		default:
			return fieldErr("runtime", s.Runtime, "is not this calibration's runtime, %q", c.runtime)
		}
	}
	e := prefillEntry{s: s, layers: m.Layers}
	e.row = fitRow{x: c.prefillFeatures(m, &s), y: s.Seconds}
	if s.LoadBytes > 0 {
		if c.links.find(s.LoadLink) == nil {
			// A preset's name starts the link at the preset; another
			// waits for the link's first copy (AddCopy) to count.
			if l, err := LookupLink(s.LoadLink); err == nil {
				if _, err := c.links.get(l, PriorLinkWidth); err != nil {
					return err
				}
			}
		}
		c.loaded.add(e)
		return nil
	}
	c.prefill.add(e)
	return nil
}

// AddCopy records one copy over l; the first over l.Name makes l its prior.
func (c *Calibration) AddCopy(l Link, bytes int64, d time.Duration) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if err := c.addCopyLocked(l, CopySample{Link: l.Name, Bytes: bytes, Seconds: d.Seconds()}); err != nil {
		return fmt.Errorf("calibration: copy over %s: %w", l.Name, err)
	}
	return nil
}

// linkSet is a Calibration's fitted links, or its codec kernels, which
// are fitted alike: a fixed cost a call and bytes at a rate.
type linkSet struct {
	states []*linkState // sorted by name
	limit  int
	what   string // "link", "codec kernel": what errors call one
	bound  string // the limit's name, for errors
}

// find is the state named name, or nil.
func (s *linkSet) find(name string) *linkState {
	for _, ls := range s.states {
		if ls.prior.Name == name {
			return ls
		}
	}
	return nil
}

// get finds or starts the state named l.Name, l its prior.
func (s *linkSet) get(l Link, width float64) (*linkState, error) {
	if ls := s.find(l.Name); ls != nil {
		return ls, nil
	}
	if l.Name == "" {
		return nil, fmt.Errorf("a %s needs a name", s.what)
	}
	if err := l.Validate(); err != nil {
		return nil, fmt.Errorf("%s %s: %w", s.what, l.Name, err)
	}
	if len(s.states) == s.limit {
		return nil, fmt.Errorf("%s %q: already %d (%s)", s.what, l.Name, s.limit, s.bound)
	}
	ls := &linkState{prior: l, priorWidth: width}
	ls.priorTheta = [maxTerms]float64{l.Latency.Seconds() / linkLatencyScale(l), 1}
	ls.samples.buf = make([]CopySample, MaxCopySamples)
	s.states = append(s.states, ls)
	sort.Slice(s.states, func(i, j int) bool { return s.states[i].prior.Name < s.states[j].prior.Name })
	ls.fit = LinkFit{Name: l.Name, BandwidthBytesPerS: l.BandwidthBytesPerS, LatencySeconds: l.Latency.Seconds(), ErrorWidth: width}
	return ls, nil
}

// fits are the states' fits, sorted by name.
func (s *linkSet) fits() []LinkFit {
	var f []LinkFit
	for _, ls := range s.states {
		f = append(f, ls.fit)
	}
	return f
}

// CodecSample is one timed launch of a codec's kernel: Bytes of the
// codec's input (KV as the GPU holds it) encoded or decoded in Seconds of
// GPU time, between CUDA events recorded around the launch
// (transfer.Config.OnCodecKernel).
type CodecSample struct {
	Kernel  string  `json:"kernel"` // CodecKernelName's
	Bytes   int64   `json:"bytes"`
	Seconds float64 `json:"seconds"`
}

// CodecKernelName names codec's encode or decode kernel in a Fit's
// CodecKernels: "fp8-e4m3 encode", "fp8-e4m3 decode".
func CodecKernelName(codec string, encode bool) string {
	if encode {
		return codec + " encode"
	}
	return codec + " decode"
}

// codecKernelPrior is cd's kernel as a link to fit: its preset rate, no
// fixed cost.
func codecKernelPrior(cd *Codec, encode bool) Link {
	l := Link{Name: CodecKernelName(cd.Name, encode), BandwidthBytesPerS: cd.DecodeBytesPerS}
	if encode {
		l.BandwidthBytesPerS = cd.EncodeBytesPerS
	}
	l.BandwidthBytesPerS = min(l.BandwidthBytesPerS, maxBandwidthBytesS)
	return l
}

// AddCodecKernel records one launch of cd's encode kernel (or its decode)
// that coded rawBytes of cd's input in d of GPU time. The kernels are
// fitted as the links are, a fixed cost a launch and bytes at a rate, the
// first launch of each starting from cd's rates; Fit.Codec prices loads by
// the fit.
func (c *Calibration) AddCodecKernel(cd Codec, encode bool, rawBytes int64, d time.Duration) error {
	name := CodecKernelName(cd.Name, encode)
	if err := cd.Validate(); err != nil || !cd.Enabled() {
		if err == nil {
			err = errors.New("the zero codec has no kernels")
		}
		return fmt.Errorf("calibration: codec kernel %s: %w", name, err)
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if err := c.addTimedLocked(&c.kernels, codecKernelPrior(&cd, encode), CopySample{Link: name, Bytes: rawBytes, Seconds: d.Seconds()}); err != nil {
		return fmt.Errorf("calibration: codec kernel %s: %w", name, err)
	}
	return nil
}

// linkLatencyScale is the latency term's scale: the prior's latency, or a
// microsecond for a link that has none.
func linkLatencyScale(l Link) float64 { return max(l.Latency.Seconds(), 1e-6) }

func (c *Calibration) addCopyLocked(l Link, s CopySample) error {
	return c.addTimedLocked(&c.links, l, s)
}

// addTimedLocked records s, a copy or a kernel launch, in set under l
// (the prior of the first), refits it and publishes.
func (c *Calibration) addTimedLocked(set *linkSet, l Link, s CopySample) error {
	if s.Bytes < 1 || s.Bytes > 1<<50 {
		return fieldErr("bytes", s.Bytes, "must be between 1 and 2^50")
	}
	if !(s.Seconds > 0) || s.Seconds > 1e6 {
		return fieldErr("seconds", s.Seconds, "must be positive and at most 1e6")
	}
	ls, err := set.get(l, PriorLinkWidth)
	if err != nil {
		return err
	}
	ls.samples.add(s)
	c.fitLinkLocked(ls)
	c.publishLocked()
	return nil
}

func (c *Calibration) fitLinkLocked(ls *linkState) {
	scale := linkLatencyScale(ls.prior)
	c.rows = c.rows[:0]
	ls.samples.each(func(s *CopySample) {
		c.rows = append(c.rows, fitRow{x: [maxTerms]float64{scale, float64(s.Bytes) / ls.prior.BandwidthBytesPerS}, y: s.Seconds})
	})
	pl := newPull(ls.priorTheta, ridgeWeight)
	r := fitRobust(c.rows, 2, &pl, c.scratch)
	f := LinkFit{Name: ls.prior.Name, LatencySeconds: r.theta[0] * scale, Samples: len(c.rows),
		Outliers: len(c.rows) - r.used, ErrorWidth: widthOr(r, 2, ls.priorWidth)}
	if r.theta[1] > 0 {
		f.BandwidthBytesPerS = min(ls.prior.BandwidthBytesPerS/r.theta[1], maxBandwidthBytesS)
	} else {
		f.BandwidthBytesPerS = maxBandwidthBytesS // no byte term: as fast as the bounds allow
	}
	ls.fit = f
}

// widthOr is the fit's width once it has more samples than terms (and at
// least robustAfter per term), the prior's before.
func widthOr(r robustFit, k int, prior float64) float64 {
	if r.used < robustAfter*k || r.width == 0 {
		return prior
	}
	return r.width
}

// publishLocked refits the prefill terms and publishes a new Fit.
func (c *Calibration) publishLocked() {
	f := &Fit{GPU: c.gpu.Name}
	c.rows = c.rows[:0]
	c.prefill.each(func(e *prefillEntry) { c.rows = append(c.rows, e.row) })
	theta, width, used := c.prior, c.priorWidth, 0
	if len(c.rows) > 0 {
		pl := newPull(c.prior, ridgeWeight)
		// The prefix attention rate is pulled toward the attention rate,
		// not toward its prior: with no prefill on a prefix among the
		// samples, pairs with a prefix cost what pairs among new tokens
		// do (one rate, as the presets have it); samples with a prefix
		// set it apart.
		pl.tied[4] = 3
		r := fitRobust(c.rows, maxTerms, &pl, c.scratch)
		theta, width, used = r.theta, widthOr(r, maxTerms, c.priorWidth), r.used
	}
	f.Prefill = c.termsOf(theta)
	f.Prefill.AttentionWave = c.wave
	f.Prefill.Samples, f.Prefill.Outliers, f.Prefill.ErrorWidth = len(c.rows), len(c.rows)-used, width
	f.Links, f.CodecKernels = c.links.fits(), c.kernels.fits()
	f.Prefill.LoadSlowdown, f.Prefill.LoadSlowdownSamples = c.loadSlowdownLocked(&theta)
	c.cur.Store(f)
}

// termsOf turns θ into readable terms.
func (c *Calibration) termsOf(theta [maxTerms]float64) PrefillFit {
	eff := c.gpu.EffectiveFLOPS()
	p := PrefillFit{FixedSeconds: theta[0] * fixedScaleSeconds}
	if theta[1] > 0 {
		p.WeightBytesPerS = c.hbmScale() / theta[1]
	}
	if theta[2] > 0 {
		p.LinearFLOPS = eff / theta[2]
	}
	if theta[3] > 0 {
		p.AttentionFLOPS = eff / theta[3]
	}
	if theta[4] > 0 {
		p.PrefixAttentionFLOPS = eff / theta[4]
	}
	if theta[5] > 0 {
		p.PrefixReadBytesPerS = prefixReadScale * c.hbmScale() / theta[5]
	}
	return p
}

// thetaOf is termsOf's inverse.
func (c *Calibration) thetaOf(p PrefillFit) [maxTerms]float64 {
	eff := c.gpu.EffectiveFLOPS()
	var t [maxTerms]float64
	t[0] = p.FixedSeconds / fixedScaleSeconds
	if p.WeightBytesPerS > 0 {
		t[1] = c.hbmScale() / p.WeightBytesPerS
	}
	if p.LinearFLOPS > 0 {
		t[2] = eff / p.LinearFLOPS
	}
	if p.AttentionFLOPS > 0 {
		t[3] = eff / p.AttentionFLOPS
	}
	if p.PrefixAttentionFLOPS > 0 {
		t[4] = eff / p.PrefixAttentionFLOPS
	}
	if p.PrefixReadBytesPerS > 0 {
		t[5] = prefixReadScale * c.hbmScale() / p.PrefixReadBytesPerS
	}
	return t
}
