package cost

import (
	"bytes"
	"encoding/json"
	"errors"
	"math"
	"math/rand/v2"
	"strings"
	"testing"
	"time"
)

// kernelTruth is a codec kernel as a GPU under load might run it: a fixed
// cost a launch and a rate well below the preset's.
const (
	truthLaunch  = 9e-6
	truthDecodeS = 1 / 0.6e12 // seconds a byte
)

// addDecodeLaunches feeds c n launches of fp8-e4m3's decode of 1 to 16
// blocks of 2 MiB, timed as kernelTruth with ±2% noise.
func addDecodeLaunches(t *testing.T, c *Calibration, rng *rand.Rand, n int) {
	t.Helper()
	cd := fp8(t)
	for range n {
		b := int64(1+rng.IntN(16)) << 21
		s := (truthLaunch + float64(b)*truthDecodeS) * (1 + 0.04*(rng.Float64()-0.5))
		if err := c.AddCodecKernel(cd, false, b, seconds(s)); err != nil {
			t.Fatal(err)
		}
	}
}

// TestCodecKernelCalibrates: launches of the decode kernel, timed on the
// GPU, fit its fixed cost and rate as a link's copies fit the link's; the
// fit prices a chunk's launch at what it took, and the encode kernel, of
// which there was no launch, keeps the preset's rate.
func TestCodecKernelCalibrates(t *testing.T) {
	g, _ := LookupGPU("h200")
	c, err := NewCalibration(g)
	if err != nil {
		t.Fatal(err)
	}
	cd := fp8(t)
	if got := c.Current().Codec(cd, 16<<21); got != cd {
		t.Fatalf("before any launch: %+v, want the preset %+v", got, cd)
	}
	addDecodeLaunches(t, c, rand.New(rand.NewPCG(1, 2)), 60)
	f := c.Current()
	if len(f.CodecKernels) != 1 || f.CodecKernels[0].Name != "fp8-e4m3 decode" || f.CodecKernels[0].Samples != 60 {
		t.Fatalf("kernels %+v", f.CodecKernels)
	}
	k := f.CodecKernels[0]
	if math.Abs(k.BandwidthBytesPerS*truthDecodeS-1) > 0.03 || math.Abs(k.LatencySeconds/truthLaunch-1) > 0.25 {
		t.Errorf("decode fitted at %.3g B/s and %.2f us a launch, want %.3g and %.2f", k.BandwidthBytesPerS, k.LatencySeconds*1e6, 1/truthDecodeS, truthLaunch*1e6)
	}
	chunk := int64(8) << 21
	got := f.Codec(cd, chunk)
	want := float64(chunk) / (truthLaunch + float64(chunk)*truthDecodeS)
	if math.Abs(got.DecodeBytesPerS/want-1) > 0.03 {
		t.Errorf("decode of a chunk of %d bytes at %.4g B/s, want %.4g", chunk, got.DecodeBytesPerS, want)
	}
	if got.EncodeBytesPerS != cd.EncodeBytesPerS {
		t.Errorf("encode %g B/s: no launch was timed, want the preset's %g", got.EncodeBytesPerS, cd.EncodeBytesPerS)
	}
	if !strings.Contains(got.Source, "calibrated") {
		t.Errorf("source %q does not say the rates were calibrated", got.Source)
	}
	if s := f.Describe(&Model{Name: "m", Layers: 1}, 1); !strings.Contains(s, "codec kernel fp8-e4m3 decode, from 60 launches") {
		t.Errorf("Describe does not show the kernel:\n%s", s)
	}
	var none Codec
	if got := f.Codec(none, chunk); got != none {
		t.Errorf("the zero codec became %+v", got)
	}
}

// TestCodecKernelRejects: a launch of no codec, of no bytes or of no time
// is refused, naming what was wrong, and changes nothing; so is a ninth
// kernel.
func TestCodecKernelRejects(t *testing.T) {
	g, _ := LookupGPU("h200")
	c, _ := NewCalibration(g)
	cd := fp8(t)
	bad := cd
	bad.DecodeBytesPerS = -1
	for _, tc := range []struct {
		name string
		cd   Codec
		b    int64
		d    time.Duration
		want string
	}{
		{"no codec", Codec{}, 1 << 21, time.Millisecond, "zero codec"},
		{"bad codec", bad, 1 << 21, time.Millisecond, "decode_bytes_per_s"},
		{"no bytes", cd, 0, time.Millisecond, "bytes"},
		{"no time", cd, 1 << 21, 0, "seconds"},
	} {
		if err := c.AddCodecKernel(tc.cd, false, tc.b, tc.d); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: %v, want an error naming %q", tc.name, err, tc.want)
		}
	}
	if f := c.Current(); len(f.CodecKernels) != 0 {
		t.Errorf("refused launches left kernels %+v", f.CodecKernels)
	}
	for i := range MaxCodecKernels {
		other := cd
		other.Name = string(rune('a'+i)) + "-codec"
		if err := c.AddCodecKernel(other, i%2 == 0, 1<<21, time.Microsecond); err != nil {
			t.Fatal(err)
		}
	}
	if err := c.AddCodecKernel(cd, true, 1<<21, time.Microsecond); err == nil || !strings.Contains(err.Error(), "MaxCodecKernels") {
		t.Errorf("kernel %d: %v", MaxCodecKernels+1, err)
	}
}

// TestCodecKernelFileRoundTrip: a file keeps the kernels' fits and
// launches, and a server that loads it goes on from them; a file whose
// launch names no kernel, or whose kernel has no rate, is refused, naming
// the key.
func TestCodecKernelFileRoundTrip(t *testing.T) {
	g, _ := LookupGPU("h200")
	c, _ := NewCalibration(g)
	addDecodeLaunches(t, c, rand.New(rand.NewPCG(3, 4)), 20)
	var buf bytes.Buffer
	if err := c.WriteJSON(&buf); err != nil {
		t.Fatal(err)
	}
	d, err := LoadCalibration(bytes.NewReader(buf.Bytes()), g)
	if err != nil {
		t.Fatal(err)
	}
	a, b := c.Current().CodecKernels, d.Current().CodecKernels
	if len(a) != 1 || len(b) != 1 || a[0].Name != b[0].Name || a[0].Samples != b[0].Samples {
		t.Fatalf("kernels written %+v, read back %+v", a, b)
	}
	// Read back, the launches are refitted from the written fit (the
	// prior, as a link's copies are): a chunk's price stays.
	chunk := int64(8) << 21
	if ra, rb := c.Current().Codec(fp8(t), chunk).DecodeBytesPerS, d.Current().Codec(fp8(t), chunk).DecodeBytesPerS; math.Abs(ra/rb-1) > 0.02 {
		t.Errorf("a chunk's decode at %.4g B/s written, %.4g read back", ra, rb)
	}
	for _, tc := range []struct{ from, to, want string }{
		{`"kernel": "fp8-e4m3 decode"`, `"kernel": "fp8-e4m3 transcode"`, "codec_samples[0]"},
		{`"bandwidth_bytes_per_s": ` + jsonNumber(a[0].BandwidthBytesPerS), `"bandwidth_bytes_per_s": 0`, "codec_kernels[0]"},
	} {
		s := buf.String()
		if !strings.Contains(s, tc.from) {
			t.Fatalf("the file has no %s:\n%s", tc.from, s)
		}
		_, err := LoadCalibration(strings.NewReader(strings.Replace(s, tc.from, tc.to, 1)), g)
		var fe *FieldError
		if err == nil || !strings.Contains(err.Error(), tc.want) || !errors.As(err, &fe) {
			t.Errorf("%s -> %s: %v, want a field error at %s", tc.from, tc.to, err, tc.want)
		}
	}
}

// jsonNumber is v as encoding/json writes a float64.
func jsonNumber(v float64) string {
	b, _ := json.Marshal(v)
	return string(b)
}

// TestPlanCodecCalibratedDecode: a planner whose calibration learned a
// decode slower than the preset's prices a compressed block's load by the
// fit, the last chunk's decode as a launch of a chunk took it.
func TestPlanCodecCalibratedDecode(t *testing.T) {
	pcie, _ := LookupLink("pcie5-pinned")
	cfg := testCodecPlannerConfig(t, Path{Source: Link{Name: "drive", BandwidthBytesPerS: 3.5e9, Latency: 80 * time.Microsecond}, Ingress: pcie, Pipelined: true})
	cd := fp8(t)
	cfg.Paths[TierHost].Codec = cd
	preset, err := NewPlanner(cfg)
	if err != nil {
		t.Fatal(err)
	}
	cal, _ := NewCalibration(cfg.GPU)
	addDecodeLaunches(t, cal, rand.New(rand.NewPCG(5, 6)), 60)
	cfg.Calibration = cal
	slow, err := NewPlanner(cfg)
	if err != nil {
		t.Fatal(err)
	}
	raw, enc := float64(2<<20), float64(cd.EncodedBlockBytes(&cfg.Model, 16, 1))
	dec := cal.Current().Codec(cd, 8*int64(raw)).DecodeBytesPerS
	if truth := 8 * raw / (truthLaunch + 8*raw*truthDecodeS); math.Abs(dec/truth-1) > 0.03 {
		t.Fatalf("a chunk's decode fitted at %.4g B/s, want %.4g", dec, truth)
	}
	host := DirectPath(pcie)
	want := host.latencySeconds() + max(enc*host.secondsPerByte(), raw/dec) + 8*raw/dec
	got := slow.BlockLoadCost(TierHost).Seconds()
	if math.Abs(got-want) > 2e-9 { // a Duration's nanosecond
		t.Errorf("host block under the fitted decode: %g s, want %g", got, want)
	}
	if p := preset.BlockLoadCost(TierHost).Seconds(); !(p < got) {
		t.Errorf("host block at the preset's decode %g s, not below the slower fitted decode's %g", p, got)
	}
}
