package replay

import (
	"bufio"
	"io"
	"os"
	"strconv"
	"strings"
	"testing"

	"kvtier.dev/kvtier/trace"
)

// TestMillionRequestsStream replays a generated trace of a million
// requests, streamed through a pipe as it is generated, and checks that the
// process's peak resident memory stays at a few hundred MiB: the replay
// holds requests in flight, never the trace. It takes about 15 s, so it runs
// only with KVTIER_LONG=1.
func TestMillionRequestsStream(t *testing.T) {
	if os.Getenv("KVTIER_LONG") != "1" {
		t.Skip("set KVTIER_LONG=1 to replay a million generated requests")
	}
	if quick {
		t.Skip("too slow under the invariants tag")
	}
	gen := trace.DefaultGenConfig()
	gen.Requests = 1_000_000
	src := Source{Name: "generated-1M", Format: trace.FormatMooncake, Open: func() (io.ReadCloser, error) {
		pr, pw := io.Pipe()
		go func() { pw.CloseWithError(trace.Generate(pw, gen, trace.FormatMooncake)) }()
		return pr, nil
	}}
	cfg := DefaultConfig()
	cfg.Baselines = false
	rep := runOrFail(t, src, cfg)
	res := rep.Results[0]
	if res.Requests != int64(gen.Requests) {
		t.Fatalf("replayed %d requests", res.Requests)
	}
	peak := peakRSSBytes(t)
	t.Logf("%d requests, %d block references, hit ratio %.4f, TTFT p50 %.3f s; peak RSS %d MiB",
		res.Requests, res.Blocks, res.HitRatio.Overall, res.TTFT.P50, peak>>20)
	if peak > 300<<20 {
		t.Errorf("peak RSS %d MiB, want at most 300 MiB", peak>>20)
	}
}

// peakRSSBytes reads the process's peak resident set (VmHWM) on Linux.
func peakRSSBytes(t *testing.T) int64 {
	f, err := os.Open("/proc/self/status")
	if err != nil {
		t.Skipf("no /proc/self/status: %v", err)
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if rest, ok := strings.CutPrefix(sc.Text(), "VmHWM:"); ok {
			kb, err := strconv.ParseInt(strings.TrimSuffix(strings.TrimSpace(rest), " kB"), 10, 64)
			if err != nil {
				t.Fatal(err)
			}
			return kb << 10
		}
	}
	t.Skip("no VmHWM in /proc/self/status")
	return 0
}
