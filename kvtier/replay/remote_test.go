package replay

import (
	"bytes"
	"strings"
	"testing"
	"time"

	"kvtier.dev/kvtier/cost"
)

// remoteTestConfig is a 70B model on 8 GPUs whose local tiers are smaller
// than the bundled trace's working set, so that a remote tier has
// something to give back.
func remoteTestConfig() Config {
	cfg := DefaultConfig()
	cfg.Model, cfg.TP = "llama-3.1-70b", 8
	cfg.GPUBytes, cfg.HostBytes, cfg.NVMeBytes = 10<<30, 8<<30, 0
	cfg.Baselines = false
	return cfg
}

var fastRemote = cost.Link{Name: "test-remote", BandwidthBytesPerS: 10e9, Latency: 200 * time.Microsecond}

// TestRemoteTierBuysTTFT: a remote tier behind small local tiers fetches
// blocks they lost, and the TTFT falls; the size-0 point is the replay
// without one, byte for byte.
func TestRemoteTierBuysTTFT(t *testing.T) {
	cfg := remoteTestConfig()
	src, _ := bundled()
	rep, err := Run(src, cfg, Options{SweepRemote: []Bytes{0, 64 << 30}, RemoteLink: fastRemote})
	if err != nil {
		t.Fatal(err)
	}
	pts := rep.RemoteSweep.Points
	none, some := pts[0], pts[1]
	if none.TTFT != rep.Results[0].TTFT || none.HitRatio != rep.Results[0].HitRatio || none.Fetches != 0 || none.Published != 0 {
		t.Errorf("size 0: %+v, want the replay without a remote tier (TTFT %+v)", none, rep.Results[0].TTFT)
	}
	if some.FetchedBlocks == 0 || some.Fetches == 0 || some.Published == 0 || some.FetchedRatio <= 0 {
		t.Fatalf("64 GiB remote: %+v, want blocks published and fetched", some)
	}
	if !(some.TTFT.Mean < none.TTFT.Mean) || some.HitRatio.Overall <= none.HitRatio.Overall {
		t.Errorf("64 GiB remote: TTFT mean %v, hit %v; without: %v, %v", some.TTFT.Mean, some.HitRatio.Overall, none.TTFT.Mean, none.HitRatio.Overall)
	}
	// A fetch takes at least the link's latency and its blocks' bytes.
	if min := fastRemote.Latency.Seconds() + float64(rep.BlockBytes)/fastRemote.BandwidthBytesPerS; some.MeanFetchSeconds < min {
		t.Errorf("mean fetch %v s, less than one block's %v s", some.MeanFetchSeconds, min)
	}
	t.Logf("remote 64 GiB: %+v\nnone: %+v", some, none)
}

// TestRemoteTierNotWorthOnASlowLink: where fetching is slower than
// recomputing, nothing is fetched and the TTFT is the same as without.
func TestRemoteTierNotWorthOnASlowLink(t *testing.T) {
	cfg := remoteTestConfig()
	src, _ := bundled()
	slow := cost.Link{Name: "slow", BandwidthBytesPerS: 10e6, Latency: time.Millisecond}
	rep, err := Run(src, cfg, Options{SweepRemote: []Bytes{0, 64 << 30}, RemoteLink: slow})
	if err != nil {
		t.Fatal(err)
	}
	none, some := rep.RemoteSweep.Points[0], rep.RemoteSweep.Points[1]
	if some.Fetches != 0 || some.NotWorth == 0 || some.TTFT != none.TTFT {
		t.Errorf("a 10 MB/s remote: %+v; without: %+v", some, none)
	}
}

func TestRemoteSweepErrors(t *testing.T) {
	src, _ := bundled()
	for name, c := range map[string]struct {
		cfg  func(*Config)
		opts Options
		want string
	}{
		"no host tier": {func(c *Config) { c.HostBytes = 0 }, Options{SweepRemote: []Bytes{1 << 30}, RemoteLink: fastRemote}, "host tier"},
		"gpu-only":     {func(c *Config) { c.Strategy = "gpu-only" }, Options{SweepRemote: []Bytes{1 << 30}, RemoteLink: fastRemote}, "host tier"},
		"no link":      {func(*Config) {}, Options{SweepRemote: []Bytes{1 << 30}}, "bandwidth"},
		"negative":     {func(*Config) {}, Options{SweepRemote: []Bytes{-1}, RemoteLink: fastRemote}, "negative"},
	} {
		cfg := remoteTestConfig()
		c.cfg(&cfg)
		_, err := Run(src, cfg, c.opts)
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s: %v, want an error about %q", name, err, c.want)
		}
	}
}

// TestRemoteSweepReport: the text report has the sweep's table, and the
// JSON its points (the same twice). internal/replayplot tests its picture.
func TestRemoteSweepReport(t *testing.T) {
	cfg := remoteTestConfig()
	var js [2]bytes.Buffer
	var rep *Report
	for i := range js {
		src, _ := bundled()
		var err error
		if rep, err = Run(src, cfg, Options{SweepRemote: []Bytes{0, 16 << 30}, RemoteLink: fastRemote}); err != nil {
			t.Fatal(err)
		}
		if err := rep.WriteJSON(&js[i]); err != nil {
			t.Fatal(err)
		}
	}
	if !bytes.Equal(js[0].Bytes(), js[1].Bytes()) || !strings.Contains(js[0].String(), `"remote_sweep"`) {
		t.Error("the JSON differs between two runs, or has no remote sweep")
	}
	var b strings.Builder
	if err := rep.WriteText(&b); err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"TTFT against the remote tier's size", "10.00 GB/s", "16GiB", "not worth"} {
		if !strings.Contains(b.String(), want) {
			t.Errorf("text report lacks %q:\n%s", want, b.String())
		}
	}
}

// TestRemoteTierPastHoles: with lookups past holes, a fetch fills the
// holes from the remote tier (and the blocks after them stay local).
func TestRemoteTierPastHoles(t *testing.T) {
	cfg := remoteTestConfig()
	cfg.MaxHoleBlocks = 4
	src, _ := bundled()
	rep, err := Run(src, cfg, Options{SweepRemote: []Bytes{0, 64 << 30}, RemoteLink: fastRemote})
	if err != nil {
		t.Fatal(err)
	}
	none, some := rep.RemoteSweep.Points[0], rep.RemoteSweep.Points[1]
	if some.FetchedBlocks == 0 || !(some.TTFT.Mean < none.TTFT.Mean) {
		t.Errorf("past holes, 64 GiB remote: %+v; without: %+v", some, none)
	}
}
