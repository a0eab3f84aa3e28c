package cost

import (
	"bytes"
	"math"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// TestCalibrationRoundTrip: written and read back, a calibration has the
// same fit, its samples, and goes on fitting from them.
func TestCalibrationRoundTrip(t *testing.T) {
	g, _ := LookupGPU("h200")
	c, _ := NewCalibration(g)
	if err := c.AddPrefillSamples(loadSamples(t, "testdata/prefill-h200-pytorch.jsonl")...); err != nil {
		t.Fatal(err)
	}
	pcie, _ := LookupLink("pcie5-pinned")
	for i := range 10 {
		if err := c.AddCopy(pcie, int64(i+1)<<22, time.Duration(float64(int64(i+1)<<22)/50e9*1e9)+3*time.Microsecond); err != nil {
			t.Fatal(err)
		}
	}
	path := filepath.Join(t.TempDir(), "cal.json")
	if err := c.WriteFile(path); err != nil {
		t.Fatal(err)
	}
	back, err := LoadCalibrationFile(path, g)
	if err != nil {
		t.Fatal(err)
	}
	a, b := c.Current(), back.Current()
	if a.Prefill.Samples != b.Prefill.Samples || len(b.Links) != 1 || b.Links[0].Samples != 10 {
		t.Fatalf("read back %+v, wrote %+v", b, a)
	}
	for _, pair := range [][2]float64{
		{a.Prefill.LinearFLOPS, b.Prefill.LinearFLOPS}, {a.Prefill.AttentionFLOPS, b.Prefill.AttentionFLOPS},
		{a.Prefill.PrefixAttentionFLOPS, b.Prefill.PrefixAttentionFLOPS}, {a.Prefill.PrefixReadBytesPerS, b.Prefill.PrefixReadBytesPerS},
		{a.Prefill.WeightBytesPerS, b.Prefill.WeightBytesPerS}, {a.Prefill.FixedSeconds, b.Prefill.FixedSeconds},
	} {
		if math.Abs(pair[0]-pair[1]) > 1e-9*math.Abs(pair[0]) {
			t.Errorf("read back %g, wrote %g", pair[1], pair[0])
		}
	}
	// A link's copies are refitted with its saved figures as the prior
	// (the file keeps no other): the same within a fraction of a percent.
	if x, y := a.Links[0].BandwidthBytesPerS, b.Links[0].BandwidthBytesPerS; math.Abs(x/y-1) > 0.01 {
		t.Errorf("link read back at %g B/s, wrote %g", y, x)
	}
	if l, _ := b.Link(pcie); math.Abs(l.BandwidthBytesPerS/50e9-1) > 0.02 {
		t.Errorf("fitted link %g GB/s, copies at 50", l.BandwidthBytesPerS/1e9)
	}
	// A file of terms alone (no samples) is a prior: its terms stand.
	var buf bytes.Buffer
	buf.WriteString(`{"version": 1, "gpu": "h200", "prefill": {"fixed_seconds": 0.002, "weight_bytes_per_s": 2e12,
		"linear_flops": 6e14, "attention_flops": 3e14, "samples": 9, "outliers": 0, "error_width": 0.08},
		"links": [], "prefill_samples": [], "copy_samples": []}`)
	prior, err := LoadCalibration(&buf, g)
	if err != nil {
		t.Fatal(err)
	}
	// Written before the prefix term: pairs with a prefix at the attention rate.
	if p := prior.Current().Prefill; math.Abs(p.LinearFLOPS/6e14-1) > 1e-9 || p.ErrorWidth != 0.08 || math.Abs(p.FixedSeconds-0.002) > 1e-12 ||
		math.Abs(p.PrefixAttentionFLOPS/3e14-1) > 1e-9 {
		t.Errorf("prior file read as %+v", p)
	}
	buf.WriteString(`{"version": 1, "gpu": "h200", "prefill": {"linear_flops": 6e14, "attention_flops": 3e14, "prefix_attention_flops": 1.5e14}}`)
	if prior, err = LoadCalibration(&buf, g); err != nil {
		t.Fatal(err)
	}
	if p := prior.Current().Prefill; math.Abs(p.PrefixAttentionFLOPS/1.5e14-1) > 1e-9 || math.Abs(p.AttentionFLOPS/3e14-1) > 1e-9 {
		t.Errorf("prior file with a prefix rate read as %+v", p)
	}
}

// TestCalibrationFromProbe: `kvtier probe --json` output is a calibration
// of the host links, named as the presets they replace.
func TestCalibrationFromProbe(t *testing.T) {
	g, _ := LookupGPU("h200")
	c, err := LoadCalibrationFile("testdata/probe-h200.json", g)
	if err != nil {
		t.Fatal(err)
	}
	probe, err := LoadProbe("testdata/probe-h200.json")
	if err != nil {
		t.Fatal(err)
	}
	pinned, _ := LookupLink("pcie5-pinned")
	l, w := c.Current().Link(pinned)
	if l.BandwidthBytesPerS != probe.Pinned.BandwidthBytesPerS || l.Latency != probe.Pinned.Latency || w != probeLinkWidth {
		t.Errorf("pcie5-pinned from the probe: %+v (width %g), probe %+v", l, w, probe.Pinned)
	}
	pageable, _ := LookupLink("pcie5-pageable")
	if l, _ := c.Current().Link(pageable); l.BandwidthBytesPerS != probe.Pageable.BandwidthBytesPerS {
		t.Errorf("pcie5-pageable from the probe: %+v", l)
	}
	if _, err := LoadCalibration(strings.NewReader(`{"measured": {"h2d_pinned_bytes_per_s": -1}}`), g); err == nil {
		t.Error("a probe with a negative bandwidth was accepted")
	}
}

func TestLoadCalibrationRejects(t *testing.T) {
	h200, _ := LookupGPU("h200")
	for _, c := range []struct{ file, mention string }{
		{`{"version": 2}`, "version"},
		{`{"version": 1, "gpu": "b200"}`, "another GPU"},
		{`{"version": 1, "extra": 1}`, "unknown field"},
		{`{"version": "1"}`, "version"},
		{`[1]`, "calibration"},
		{`{"version": 1, "links": [{"name": "x", "bandwidth_bytes_per_s": 0}]}`, "links[0]: bandwidth_bytes_per_s"},
		{`{"version": 1, "links": [{"name": "", "bandwidth_bytes_per_s": 1e9}]}`, "links[0]: name"},
		{`{"version": 1, "links": [{"name": "x", "bandwidth_bytes_per_s": 1e9, "latency_seconds": -1}]}`, "latency_seconds"},
		{`{"version": 1, "links": [{"name": "x", "bandwidth_bytes_per_s": 1e9, "error_width": -1}]}`, "error_width"},
		{`{"version": 1, "copy_samples": [{"link": "y", "bytes": 1, "seconds": 1}]}`, "copy_samples[0]: link"},
		{`{"version": 1, "links": [{"name": "x", "bandwidth_bytes_per_s": 1e9}], "copy_samples": [{"link": "x", "bytes": 0, "seconds": 1}]}`, "copy_samples[0]"},
		{`{"version": 1, "prefill_samples": [{"model": "gpt-9", "tokens": 1, "seconds": 1}]}`, "prefill_samples[0]"},
		{`{"version": 1, "prefill_samples": [{"model": "llama-3.1-8b", "tokens": 0, "seconds": 1}]}`, "prefill_samples[0]: tokens"},
		{`{"version": 1, "prefill": {"linear_flops": 0, "attention_flops": 1e14}}`, "prefill: linear_flops"},
		{`{"version": 1, "prefill": {"linear_flops": 1e14, "attention_flops": 1e14, "fixed_seconds": -1}}`, "fixed_seconds"},
		{`{"version": 1, "prefill": {"linear_flops": 1e14, "attention_flops": 0}}`, "attention_flops"},
		{`{"version": 1, "prefill": {"linear_flops": 1e14, "attention_flops": 1e14, "weight_bytes_per_s": -1}}`, "weight_bytes_per_s"},
		{`{"version": 1, "prefill": {"linear_flops": 1e14, "attention_flops": 1e14, "error_width": 11}}`, "error_width"},
		{`{"version": 1, "prefill": {"linear_flops": 1e14, "attention_flops": 1e14, "prefix_attention_flops": -1}}`, "prefix_attention_flops"},
		{`{"version": 1, "prefill": {"linear_flops": 1e14, "attention_flops": 1e14, "prefix_read_bytes_per_s": -1}}`, "prefix_read_bytes_per_s"},
		{strings.Repeat(" ", maxCalibrationFileBytes+1), "larger than"},
	} {
		_, err := LoadCalibration(strings.NewReader(c.file), h200)
		if err == nil || !strings.Contains(err.Error(), c.mention) {
			t.Errorf("%.60s: want an error mentioning %q, got %v", c.file, c.mention, err)
		}
	}
	if _, err := LoadCalibrationFile(filepath.Join(t.TempDir(), "none.json"), h200); !os.IsNotExist(err) {
		t.Errorf("missing file: %v", err)
	}
	c, _ := NewCalibration(h200)
	if err := c.WriteFile(filepath.Join(t.TempDir(), "no", "such", "dir.json")); err == nil {
		t.Error("WriteFile into a missing directory succeeded")
	}
}

func TestReadPrefillSamples(t *testing.T) {
	s, err := ReadPrefillSamples(strings.NewReader("\n" + `{"model":"llama-3.1-8b","prefix":0,"tokens":512,"seconds":0.0222}` + "\n\n" +
		`{"model":"llama-3.1-70b","tp":8,"prefix":8192,"tokens":512,"seconds":0.2}` + "\n"))
	if err != nil || len(s) != 2 || s[1].TP != 8 || s[0].Seconds != 0.0222 {
		t.Fatalf("%+v, %v", s, err)
	}
	for _, c := range []struct{ in, mention string }{
		{`{"model":"x","tokens":1,"seconds":1,"extra":1}`, "line 1: json: unknown field"},
		{"\n" + `{"tokens":1,"seconds":1}`, "line 2: model"},
		{`{"model":"x","tokens":1,"seconds":0}`, "line 1: seconds"},
		{`{"model":"x","tokens":0,"seconds":1}`, "line 1: tokens"},
		{`{"model":"x","tokens":1,"seconds":1} {}`, "more than one"},
		{`{"model":"x","tokens":1,"seconds":1,"prefix":-1}`, "prefix"},
		{`{"model":"x","tokens":1,"seconds":1,"tp":2000}`, "tp"},
		{`nonsense`, "line 1"},
		{strings.Repeat("x", 2<<20), "line 1"},
	} {
		if _, err := ReadPrefillSamples(strings.NewReader(c.in)); err == nil || !strings.Contains(err.Error(), c.mention) {
			t.Errorf("%.40q: want an error mentioning %q, got %v", c.in, c.mention, err)
		}
	}
}

func FuzzReadPrefillSamples(f *testing.F) {
	f.Add([]byte(`{"model":"llama-3.1-8b","prefix":0,"tokens":512,"seconds":0.0222}`))
	f.Add([]byte(`{"model":"llama-3.1-70b","tp":8,"prefix":8192,"tokens":512,"seconds":0.2}` + "\n{}"))
	g, _ := LookupGPU("h200")
	f.Fuzz(func(t *testing.T, data []byte) {
		s, err := ReadPrefillSamples(bytes.NewReader(data))
		if err != nil {
			return
		}
		c, _ := NewCalibration(g)
		for _, x := range s {
			if checkSample(x) != nil {
				t.Fatalf("accepted a bad sample %+v", x)
			}
			_ = c.AddPrefillSamples(x) // unknown models are errors, never panics
		}
		f := c.Current().Prefill
		if math.IsNaN(f.LinearFLOPS) || math.IsNaN(f.ErrorWidth) {
			t.Fatalf("fit went NaN: %+v", f)
		}
	})
}

func FuzzLoadCalibration(f *testing.F) {
	f.Add([]byte(`{"version": 1, "gpu": "h200", "prefill": {"linear_flops": 6e14, "attention_flops": 3e14}}`))
	f.Add([]byte(`{"version": 1, "links": [{"name": "x", "bandwidth_bytes_per_s": 1e9}], "copy_samples": [{"link": "x", "bytes": 1000, "seconds": 1e-6}]}`))
	f.Add([]byte(`{"measured": {"h2d_pinned_bytes_per_s": 5e10}}`))
	g, _ := LookupGPU("h200")
	f.Fuzz(func(t *testing.T, data []byte) {
		c, err := LoadCalibration(bytes.NewReader(data), g)
		if err != nil {
			return
		}
		var buf bytes.Buffer
		if err := c.WriteJSON(&buf); err != nil {
			t.Fatal(err)
		}
		if _, err := LoadCalibration(&buf, g); err != nil {
			t.Fatalf("a calibration it wrote does not load: %v\n%s", err, buf.String())
		}
	})
}
