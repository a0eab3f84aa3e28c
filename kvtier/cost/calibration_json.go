package cost

import (
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"time"
)

// calibrationFile is the JSON a Calibration is saved as: its current fit,
// and the samples behind it, so that a server that loads the file goes on
// fitting where it left off. A file without prefill samples is a prior; one
// with them is refitted from them on the presets. docs/cost.md has an
// example.
type calibrationFile struct {
	Version int `json:"version"`
	Fit
	PrefillSamples []PrefillSample `json:"prefill_samples"`
	CopySamples    []CopySample    `json:"copy_samples"`
	CodecSamples   []CodecSample   `json:"codec_samples,omitempty"`
}

const calibrationVersion = 1

// maxCalibrationFileBytes bounds what LoadCalibration reads: the samples
// of a full Calibration take about 40 KiB.
const maxCalibrationFileBytes = 4 << 20

// WriteJSON writes the current fit and its samples.
func (c *Calibration) WriteJSON(w io.Writer) error {
	c.mu.Lock()
	file := calibrationFile{Version: calibrationVersion, Fit: *c.Current(),
		PrefillSamples: []PrefillSample{}, CopySamples: []CopySample{}}
	c.prefill.each(func(e *prefillEntry) { file.PrefillSamples = append(file.PrefillSamples, e.s) })
	c.loaded.each(func(e *prefillEntry) { file.PrefillSamples = append(file.PrefillSamples, e.s) })
	for _, ls := range c.links.states {
		ls.samples.each(func(s *CopySample) { file.CopySamples = append(file.CopySamples, *s) })
	}
	for _, ls := range c.kernels.states {
		ls.samples.each(func(s *CopySample) {
			file.CodecSamples = append(file.CodecSamples, CodecSample{Kernel: s.Link, Bytes: s.Bytes, Seconds: s.Seconds})
		})
	}
	c.mu.Unlock()
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	return enc.Encode(&file)
}

// WriteFile writes to path; a reader never sees half a file.
func (c *Calibration) WriteFile(path string) error {
	var buf bytes.Buffer
	if err := c.WriteJSON(&buf); err != nil {
		return err
	}
	tmp := path + ".tmp"
	if err := os.WriteFile(tmp, buf.Bytes(), 0o644); err != nil {
		return err
	}
	return os.Rename(tmp, path)
}

// LoadCalibration reads WriteJSON's output for g, or `kvtier probe
// --json`'s, whose host links become "pcieN-pinned" and "pcieN-pageable".
// models are the custom models its samples name. Errors name the key;
// nothing is half-loaded.
func LoadCalibration(r io.Reader, g GPU, models ...Model) (*Calibration, error) {
	data, err := io.ReadAll(io.LimitReader(r, maxCalibrationFileBytes+1))
	if err != nil {
		return nil, fmt.Errorf("calibration: read: %w", err)
	}
	if len(data) > maxCalibrationFileBytes {
		return nil, fmt.Errorf("calibration: larger than %d bytes", maxCalibrationFileBytes)
	}
	c, err := newCalibrationOf(g, models)
	if err != nil {
		return nil, err
	}
	var keys map[string]json.RawMessage
	if err := json.Unmarshal(data, &keys); err != nil {
		return nil, fmt.Errorf("calibration: %w", err)
	}
	if _, ok := keys["measured"]; ok {
		return c, c.loadProbe(data)
	}
	f, err := decodeCalibrationFile(data, g)
	if err != nil {
		return nil, err
	}
	if err := c.loadFile(f); err != nil {
		return nil, err
	}
	return c, nil
}

// decodeCalibrationFile reads a file WriteJSON wrote for g.
func decodeCalibrationFile(data []byte, g GPU) (*calibrationFile, error) {
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.DisallowUnknownFields()
	var f calibrationFile
	if err := dec.Decode(&f); err != nil {
		var te *json.UnmarshalTypeError
		if errors.As(err, &te) {
			return nil, fmt.Errorf("calibration: field %q: expected %v, got JSON %s", te.Field, te.Type, te.Value)
		}
		return nil, fmt.Errorf("calibration: %w", err)
	}
	if f.Version != calibrationVersion {
		return nil, fmt.Errorf("calibration: %w", fieldErr("version", f.Version, "this kvtier reads version %d", calibrationVersion))
	}
	if f.GPU != "" && f.GPU != g.Name {
		return nil, fmt.Errorf("calibration: %w", fieldErr("gpu", f.GPU, "the calibration is of another GPU than %s", g.Name))
	}
	return &f, nil
}

// loadFile makes f's links, samples and prior the calibration's, and
// publishes the fit they give.
func (c *Calibration) loadFile(f *calibrationFile) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	for i, l := range f.Links {
		if err := checkLinkFit(l); err != nil {
			return fmt.Errorf("calibration: links[%d]: %w", i, err)
		}
		link := Link{Name: l.Name, BandwidthBytesPerS: l.BandwidthBytesPerS, Latency: seconds(l.LatencySeconds)}
		if preset, err := LookupLink(l.Name); err == nil {
			// The copy engine's issue costs are the preset's: the file
			// keeps the fitted figures only.
			link.DescriptorCost, link.EventCost = preset.DescriptorCost, preset.EventCost
		}
		if _, err := c.links.get(link, l.ErrorWidth); err != nil {
			return fmt.Errorf("calibration: links[%d]: %w", i, err)
		}
	}
	for i, s := range f.CopySamples {
		ls := c.links.find(s.Link)
		if ls == nil {
			return fmt.Errorf("calibration: copy_samples[%d]: %w", i, fieldErr("link", s.Link, "no link of that name in links"))
		}
		if err := c.addCopyLocked(ls.prior, s); err != nil {
			return fmt.Errorf("calibration: copy_samples[%d]: %w", i, err)
		}
	}
	for i, k := range f.CodecKernels {
		if err := checkLinkFit(k); err != nil {
			return fmt.Errorf("calibration: codec_kernels[%d]: %w", i, err)
		}
		if _, err := c.kernels.get(Link{Name: k.Name, BandwidthBytesPerS: k.BandwidthBytesPerS, Latency: seconds(k.LatencySeconds)}, k.ErrorWidth); err != nil {
			return fmt.Errorf("calibration: codec_kernels[%d]: %w", i, err)
		}
	}
	for i, s := range f.CodecSamples {
		ls := c.kernels.find(s.Kernel)
		if ls == nil {
			return fmt.Errorf("calibration: codec_samples[%d]: %w", i, fieldErr("kernel", s.Kernel, "no kernel of that name in codec_kernels"))
		}
		if err := c.addTimedLocked(&c.kernels, ls.prior, CopySample{Link: s.Kernel, Bytes: s.Bytes, Seconds: s.Seconds}); err != nil {
			return fmt.Errorf("calibration: codec_samples[%d]: %w", i, err)
		}
	}
	if len(f.PrefillSamples) == 0 && f.Prefill != (PrefillFit{}) {
		if err := checkPrefillFit(f.Prefill); err != nil {
			return fmt.Errorf("calibration: prefill: %w", err)
		}
		if f.Prefill.PrefixAttentionFLOPS == 0 {
			f.Prefill.PrefixAttentionFLOPS = f.Prefill.AttentionFLOPS
		}
		c.prior, c.priorWidth = c.thetaOf(f.Prefill), f.Prefill.ErrorWidth
	}
	if f.Prefill.LoadSlowdownSamples == 0 {
		if err := checkLoadSlowdown(f.Prefill.LoadSlowdown); err != nil {
			return fmt.Errorf("calibration: prefill: %w", err)
		}
		c.priorSlowdown = f.Prefill.LoadSlowdown // a prior, as the other terms'
	}
	if w := f.Prefill.AttentionWave; w < 0 || w > maxAttentionWave {
		return fmt.Errorf("calibration: prefill: %w", fieldErr("attention_wave", w, "must be between 0 (unknown) and %d", maxAttentionWave))
	}
	c.wave = f.Prefill.AttentionWave
	for i, s := range f.PrefillSamples {
		m, err := c.modelLocked(s.Model)
		if err != nil {
			return fmt.Errorf("calibration: prefill_samples[%d]: %w", i, err)
		}
		if err := c.addPrefillLocked(s, &m); err != nil {
			return fmt.Errorf("calibration: prefill_samples[%d]: %w", i, err)
		}
	}
	c.publishLocked()
	return nil
}

func checkLinkFit(l LinkFit) error {
	switch {
	case l.Name == "":
		return fieldErr("name", l.Name, "a link needs a name")
	case !(l.BandwidthBytesPerS > 0) || l.BandwidthBytesPerS > maxBandwidthBytesS:
		return fieldErr("bandwidth_bytes_per_s", l.BandwidthBytesPerS, "must be positive and at most %g", maxBandwidthBytesS)
	case !(l.LatencySeconds >= 0) || l.LatencySeconds > maxLatencySeconds:
		return fieldErr("latency_seconds", l.LatencySeconds, "must be between 0 and %d", maxLatencySeconds)
	case !(l.ErrorWidth >= 0) || l.ErrorWidth > 10:
		return fieldErr("error_width", l.ErrorWidth, "must be between 0 and 10")
	}
	return nil
}

func checkPrefillFit(p PrefillFit) error {
	switch {
	case !(p.FixedSeconds >= 0) || p.FixedSeconds > 1e3:
		return fieldErr("fixed_seconds", p.FixedSeconds, "must be between 0 and 1000")
	case !(p.WeightBytesPerS >= 0) || p.WeightBytesPerS > maxHBMBytesS*1e3:
		return fieldErr("weight_bytes_per_s", p.WeightBytesPerS, "must be between 0 (no term) and %g", maxHBMBytesS*1e3)
	case !(p.LinearFLOPS > 0) || p.LinearFLOPS > maxFLOPS*1e3:
		return fieldErr("linear_flops", p.LinearFLOPS, "must be positive and at most %g", maxFLOPS*1e3)
	case !(p.AttentionFLOPS > 0) || p.AttentionFLOPS > maxFLOPS*1e3:
		return fieldErr("attention_flops", p.AttentionFLOPS, "must be positive and at most %g", maxFLOPS*1e3)
	case !(p.PrefixReadBytesPerS >= 0) || p.PrefixReadBytesPerS > maxHBMBytesS*1e3:
		return fieldErr("prefix_read_bytes_per_s", p.PrefixReadBytesPerS, "must be between 0 (no term) and %g", maxHBMBytesS*1e3)
	case !(p.PrefixAttentionFLOPS >= 0) || p.PrefixAttentionFLOPS > maxFLOPS*1e3:
		return fieldErr("prefix_attention_flops", p.PrefixAttentionFLOPS, "must be between 0 (as attention_flops) and %g", maxFLOPS*1e3)
	case !(p.ErrorWidth >= 0) || p.ErrorWidth > 10:
		return fieldErr("error_width", p.ErrorWidth, "must be between 0 and 10")
	}
	return checkLoadSlowdown(p.LoadSlowdown)
}

func checkLoadSlowdown(g float64) error {
	if !(g >= 0) || g > maxLoadSlowdown {
		return fieldErr("load_slowdown", g, "must be between 0 and %g", maxLoadSlowdown)
	}
	return nil
}

// loadProbe makes a probe's measured host links the calibration's links.
func (c *Calibration) loadProbe(data []byte) error {
	p, err := ParseProbe(bytes.NewReader(data))
	if err != nil {
		return fmt.Errorf("calibration: %w", err)
	}
	prefix := "probe"
	if p.PCIeGen > 0 {
		prefix = fmt.Sprintf("pcie%d", p.PCIeGen)
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, pl := range []struct {
		kind string
		l    Link
	}{{"pinned", p.Pinned}, {"pageable", p.Pageable}} {
		l := pl.l
		if l.BandwidthBytesPerS == 0 {
			continue
		}
		l.Name = prefix + "-" + pl.kind
		// A probe is a measurement of many copies, closer than a preset.
		if _, err := c.links.get(l, probeLinkWidth); err != nil {
			return fmt.Errorf("calibration: %w", err)
		}
	}
	c.publishLocked()
	return nil
}

// probeLinkWidth is the width given to a probe's figures: its repeated
// runs on the H200 agreed within a few percent (benchmarks/results/probe-h200.md).
const probeLinkWidth = 0.05

// LoadCalibrationFile is LoadCalibration on a file; errors name the path.
func LoadCalibrationFile(path string, g GPU, models ...Model) (*Calibration, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	c, err := LoadCalibration(f, g, models...)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	return c, nil
}

// ReadPrefillSamples reads one PrefillSample a line, blank lines skipped;
// errors name the line.
func ReadPrefillSamples(r io.Reader) ([]PrefillSample, error) {
	var out []PrefillSample
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	line := 0
	for sc.Scan() {
		line++
		b := bytes.TrimSpace(sc.Bytes())
		if len(b) == 0 {
			continue
		}
		dec := json.NewDecoder(bytes.NewReader(b))
		dec.DisallowUnknownFields()
		var s PrefillSample
		if err := dec.Decode(&s); err != nil {
			return nil, fmt.Errorf("line %d: %w", line, err)
		}
		if dec.More() {
			return nil, fmt.Errorf("line %d: more than one JSON object", line)
		}
		if s.Model == "" {
			return nil, fmt.Errorf("line %d: %w", line, fieldErr("model", s.Model, "missing"))
		}
		if err := checkSample(s); err != nil {
			return nil, fmt.Errorf("line %d: %w", line, err)
		}
		if len(out) == 1<<20 {
			return nil, fmt.Errorf("line %d: more than %d samples", line, 1<<20)
		}
		out = append(out, s)
	}
	if err := sc.Err(); err != nil {
		return nil, fmt.Errorf("line %d: %w", line+1, err)
	}
	return out, nil
}

// Predict is the fit's (nil: the presets') time for s, its model among
// models or the presets.
func (f *Fit) Predict(s PrefillSample, g *GPU, models ...Model) (time.Duration, error) {
	m, err := resolveModel(s.Model, models)
	if err != nil {
		return 0, err
	}
	pc := f.PrefillCost(&m, g, s.TP)
	return pc.Time(s.Tokens, s.Prefix), nil
}

func resolveModel(name string, models []Model) (Model, error) {
	for _, m := range models {
		if m.Name == name {
			return m, nil
		}
	}
	return LookupModel(name)
}

// LeaveOneOut predicts each sample by g's calibration fitted to the rest.
func LeaveOneOut(g GPU, samples []PrefillSample, models ...Model) ([]time.Duration, error) {
	out := make([]time.Duration, len(samples))
	for i := range samples {
		c, err := newCalibrationOf(g, models)
		if err != nil {
			return nil, err
		}
		rest := make([]PrefillSample, 0, len(samples)-1)
		rest = append(append(rest, samples[:i]...), samples[i+1:]...)
		if err := c.AddPrefillSamples(rest...); err != nil {
			return nil, err
		}
		if out[i], err = c.Current().Predict(samples[i], &g, models...); err != nil {
			return nil, fmt.Errorf("sample %d: %w", i+1, err)
		}
	}
	return out, nil
}

// newCalibrationOf is NewCalibration with models registered beside the
// presets (custom models a file or a sample set names).
func newCalibrationOf(g GPU, models []Model) (*Calibration, error) {
	c, err := NewCalibration(g)
	if err != nil {
		return nil, err
	}
	for _, m := range models {
		if err := c.registerLocked(m); err != nil {
			return nil, fmt.Errorf("calibration: %w", err)
		}
	}
	return c, nil
}
