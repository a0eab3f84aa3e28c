package main

import (
	"io"
	"math"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"kvtier.dev/kvtier"
	"kvtier.dev/kvtier/cost"
	"kvtier.dev/kvtier/transfer"
)

// TestCalibrationCountsWireBytes: with -host-codec, a load's time is
// taken for the encoded bytes that crossed the host link, so the link's
// fit stays the link's (half the rate of the same loads counted as the
// GPU's bytes), not twice as fast as it is.
func TestCalibrationCountsWireBytes(t *testing.T) {
	rate := map[string]float64{}
	for _, codec := range []string{"none", "fp8-e4m3"} {
		k := testCalibration(t, "-host-codec", codec)
		for range 16 {
			k.Load(kvtier.Host, 64<<20, 1300*time.Microsecond)
		}
		host, _ := k.cal.Current().Link(k.host)
		rate[codec] = host.BandwidthBytesPerS
	}
	want := 1052672.0 / 2097152 // an FP8 block of the 8B over its bf16 bytes
	if got := rate["fp8-e4m3"] / rate["none"]; math.Abs(got-want) > 0.02 {
		t.Errorf("host link fitted at %.3g bytes/s with FP8 blocks, %.3g without: ratio %.3f, want %.3f", rate["fp8-e4m3"], rate["none"], got, want)
	}
}

// TestCalibrationLearnsCodecKernels: a learning server with -host-codec
// takes the copy engines' timed launches as its codec's kernels, and the
// planner's fit prices the codec by them; without a codec, or without
// -cost-learn, the engines are given nothing to report to.
func TestCalibrationLearnsCodecKernels(t *testing.T) {
	k := testCalibration(t, "-host-codec", "fp8-e4m3", "-cost-learn")
	report := k.codecKernels()
	if report == nil {
		t.Fatal("no report function for a learning server with a coded host tier")
	}
	for range 20 {
		report(transfer.CodecKernel{Blocks: 8, RawBytes: 16 << 20, Elapsed: 40 * time.Microsecond})
	}
	f := k.cal.Current()
	if len(f.CodecKernels) != 1 || f.CodecKernels[0].Name != "fp8-e4m3 decode" || f.CodecKernels[0].Samples != 20 {
		t.Fatalf("kernels learned %+v, want the decode's 20 launches", f.CodecKernels)
	}
	if got, want := f.Codec(k.codec, 16<<20).DecodeBytesPerS, float64(16<<20)/40e-6; math.Abs(got/want-1) > 0.02 {
		t.Errorf("a chunk decodes at %.4g bytes/s, want the launches' %.4g", got, want)
	}
	for _, flags := range [][]string{{"-cost-learn"}, {"-host-codec", "fp8-e4m3", "-cost-learn=false", "-cost-calibration", writeCalibrationFile(t)}} {
		if testCalibration(t, flags...).codecKernels() != nil {
			t.Errorf("%v: a report function, want none", flags)
		}
	}
}

// writeCalibrationFile is a calibration file of the presets.
func writeCalibrationFile(t *testing.T) string {
	t.Helper()
	g, _ := cost.LookupGPU("h200")
	c, err := cost.NewCalibration(g)
	if err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(t.TempDir(), "presets.json")
	if err := c.WriteFile(path); err != nil {
		t.Fatal(err)
	}
	return path
}

// TestCalibrationRuntime: a -cost-calibration file whose samples name no
// runtime (written before samples named theirs, or by another kernel) is
// a prior to the server: setRuntime drops its samples and keeps its fit,
// and what the server learns afterwards, and writes with
// -cost-calibration-out, names the server's runtime.
func TestCalibrationRuntime(t *testing.T) {
	dir := t.TempDir()
	g, err := cost.LookupGPU("h200")
	if err != nil {
		t.Fatal(err)
	}
	old, err := cost.NewCalibration(g)
	if err != nil {
		t.Fatal(err)
	}
	for i := range 20 {
		if err := old.AddPrefillSamples(cost.PrefillSample{Model: "llama-3.1-8b", Tokens: 512 * (i + 1), Seconds: 0.02 * float64(i+1)}); err != nil {
			t.Fatal(err)
		}
	}
	file := filepath.Join(dir, "old.json")
	if err := old.WriteFile(file); err != nil {
		t.Fatal(err)
	}
	k := testCalibration(t, "-cost-calibration", file)
	before := k.cal.Current().Prefill
	if err := k.setRuntime("test runtime"); err != nil {
		t.Fatal(err)
	}
	after := k.cal.Current().Prefill
	if after.Samples != 0 || math.Abs(after.LinearFLOPS/before.LinearFLOPS-1) > 1e-9 || math.Abs(after.FixedSeconds-before.FixedSeconds) > 1e-12 {
		t.Fatalf("after setRuntime: %+v; want no samples and the file's fit %+v", after, before)
	}
	k.Pass(cost.PrefillSample{Tokens: 1000, Seconds: 0.03}, kvtier.GPU)
	out := filepath.Join(dir, "learned.json")
	if err := k.close(out); err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile(out)
	if err != nil {
		t.Fatal(err)
	}
	if n := strings.Count(string(b), `"runtime": "test runtime"`); n != 1 || strings.Count(string(b), `"tokens"`) != 1 {
		t.Fatalf("the written calibration holds %d samples naming the runtime, want the one learned:\n%s", n, b)
	}
	if err := k.setRuntime(strings.Repeat("x", 300)); err == nil {
		t.Fatal("a 300-byte runtime name accepted")
	}
}

// testCalibration is the calibration of a server of llama-3.1-8b with 2
// GiB of GPU KV and flags.
func testCalibration(t *testing.T, flags ...string) *calibration {
	t.Helper()
	c, err := parseArgs(append([]string{"-model", "llama-3.1-8b", "-gpu-kv", "2GiB"}, flags...), io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	sh, err := c.shape()
	if err != nil {
		t.Fatal(err)
	}
	k, err := openCalibration(&c, sh)
	if err != nil || k == nil {
		t.Fatalf("openCalibration %v: %v", flags, err)
	}
	return k
}
