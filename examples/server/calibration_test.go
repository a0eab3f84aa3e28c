package main

import (
	"io"
	"math"
	"testing"
	"time"

	"kvtier.dev/kvtier"
)

// TestCalibrationCountsWireBytes: with -host-codec, a load's time is
// taken for the encoded bytes that crossed the host link, so the link's
// fit stays the link's (half the rate of the same loads counted as the
// GPU's bytes), not twice as fast as it is.
func TestCalibrationCountsWireBytes(t *testing.T) {
	rate := map[string]float64{}
	for _, codec := range []string{"none", "fp8-e4m3"} {
		c, err := parseArgs([]string{"-model", "llama-3.1-8b", "-gpu-kv", "2GiB", "-host-codec", codec}, io.Discard)
		if err != nil {
			t.Fatal(err)
		}
		sh, err := c.shape()
		if err != nil {
			t.Fatal(err)
		}
		k, err := openCalibration(&c, sh)
		if err != nil || k == nil {
			t.Fatalf("-host-codec %s: %v", codec, err)
		}
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
