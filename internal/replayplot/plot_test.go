package replayplot

import (
	"os"
	"path/filepath"
	"slices"
	"testing"
	"time"

	"kvtier.dev/internal/results"
	"kvtier.dev/kvtier/cost"
	"kvtier.dev/kvtier/replay"
)

// testReport is a report of two strategies, with a host and a remote
// sweep, made by hand: the pictures need only its fields.
func testReport() *replay.Report {
	q := make([]float64, 101)
	for i := range q {
		q[i] = 0.01 * float64(i*i) // from 0 (drawn at the floor) to 100 s
	}
	pct := results.Percentiles{P50: 25, P90: 81, P99: 98, Mean: 33, Max: 100}
	return &replay.Report{
		Trace: "hand-made",
		Results: []replay.StrategyResult{
			{Strategy: "cost", TTFTQuantiles: q, TTFT: pct},
			{Strategy: "none"}, // no requests: no line
		},
		HostSweep: []replay.SweepPoint{
			{HostBytes: 64 << 30, HitRatio: replay.TierRatios{GPU: 0.5, Host: 0.2, Overall: 0.7}, TTFT: pct},
			{HostBytes: 0, HitRatio: replay.TierRatios{GPU: 0.5, Overall: 0.5}, TTFT: pct},
		},
		RemoteSweep: &replay.RemoteSweep{
			Link: cost.Link{Name: "test-remote", BandwidthBytesPerS: 10e9, Latency: 200 * time.Microsecond},
			Points: []replay.RemotePoint{
				{RemoteBytes: 16 << 30, TTFT: pct},
				{RemoteBytes: 0, TTFT: results.Percentiles{P50: 30, P90: 90, Mean: 40}},
			},
		},
	}
}

// TestWrite: every picture of the report, as SVG and PNG, in the order
// Write documents; only the TTFT without sweeps.
func TestWrite(t *testing.T) {
	dir := t.TempDir()
	files, err := Write(testReport(), dir)
	if err != nil {
		t.Fatal(err)
	}
	var want []string
	for _, name := range []string{"ttft", "host-sweep", "remote-sweep"} {
		want = append(want, filepath.Join(dir, name+".svg"), filepath.Join(dir, name+".png"))
	}
	if !slices.Equal(files, want) {
		t.Errorf("wrote %v, want %v", files, want)
	}
	for _, f := range files {
		if st, err := os.Stat(f); err != nil || st.Size() < 1000 {
			t.Errorf("%s: %v", f, err)
		}
	}

	r := testReport()
	r.HostSweep, r.RemoteSweep = nil, nil
	dir = filepath.Join(t.TempDir(), "new", "dir") // Write makes it
	files, err = Write(r, dir)
	if err != nil {
		t.Fatal(err)
	}
	if want := []string{filepath.Join(dir, "ttft.svg"), filepath.Join(dir, "ttft.png")}; !slices.Equal(files, want) {
		t.Errorf("without sweeps wrote %v, want %v", files, want)
	}
}

// TestWriteUnderAFile: a directory that cannot be made is an error.
func TestWriteUnderAFile(t *testing.T) {
	file := filepath.Join(t.TempDir(), "file")
	if err := os.WriteFile(file, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := Write(testReport(), filepath.Join(file, "sub")); err == nil {
		t.Error("plotting under a file did not fail")
	}
}
