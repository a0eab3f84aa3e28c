package replay

import (
	"os"
	"path/filepath"
	"strconv"
	"testing"

	"kvtier.dev/kvtier/costplan"
	"kvtier.dev/kvtier/trace"
)

// writeDriveFile writes a probe's results file for a drive of the given
// read and write rates (GiB/s).
func writeDriveFile(t *testing.T, read, write float64) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), "drive.json")
	body := `{"benchmark": "probe-nvme", "machine": "test", "rows": [
	 {"name": "drive write", "unit": "GiB/s", "median": ` + strconv.FormatFloat(write, 'g', -1, 64) + `},
	 {"name": "drive read", "unit": "GiB/s", "median": ` + strconv.FormatFloat(read, 'g', -1, 64) + `},
	 {"name": "drive write latency", "unit": "us", "median": 150},
	 {"name": "drive read latency", "unit": "us", "median": 60}]}`
	if err := os.WriteFile(p, []byte(body), 0o600); err != nil {
		t.Fatal(err)
	}
	return p
}

// TestGatedWritesOnASlowDrive: 16-token blocks of the 8B on a 1.4 GiB/s
// drive are worth no write in a 16K context: the gated replay writes
// nothing to NVMe and says why, where every admitted block would have been
// written; a fast drive is written to.
func TestGatedWritesOnASlowDrive(t *testing.T) {
	gen := trace.DefaultGenConfig()
	gen.Requests, gen.BlockTokens, gen.MaxContextTokens, gen.SessionsPerSecond = 30, 16, 4096, 2
	gen.SystemPromptTokens = [2]int{500, 2000}
	run := func(link, writes string) *WriteCounts {
		cfg := DefaultConfig()
		cfg.Baselines, cfg.NVMeLink, cfg.NVMeWrites, cfg.NVMeAdmission = false, link, writes, "all"
		cfg.GPUBytes, cfg.HostBytes, cfg.NVMeBytes = 4<<30, 4<<30, 64<<30
		rep := runOrFail(t, GeneratedSource("agentic", gen), cfg)
		res := result(t, rep, costplan.Cost)
		if res.NVMeWrites == nil {
			t.Fatal("no NVMe writes reported")
		}
		return res.NVMeWrites
	}
	slow := writeDriveFile(t, 1.4, 1.4)
	if w := run(slow, "gated"); w.Written != 0 || w.NotWorth == 0 {
		t.Errorf("gated on a slow drive: %+v, want nothing written, every refusal not worth it", w)
	}
	if w := run(slow, "all"); w.Written == 0 {
		t.Errorf("ungated on a slow drive: %+v, want writes", w)
	}
	if w := run("nvme-gen5", "gated"); w.Written == 0 {
		t.Errorf("gated on a fast drive: %+v, want writes", w)
	}
}

// TestPrefetchWhileWaiting: on a loaded GPU, the request next in line has
// its NVMe blocks read back into the host tier while it waits, and loads
// them from there: fewer loads from the drive, more from the host tier, no
// worse a TTFT.
func TestPrefetchWhileWaiting(t *testing.T) {
	gen := trace.DefaultGenConfig()
	gen.Requests, gen.BlockTokens, gen.MaxContextTokens, gen.SessionsPerSecond = 40, 16, 4096, 1
	gen.SystemPromptTokens = [2]int{500, 2000}
	run := func(blocks int) *StrategyResult {
		cfg := DefaultConfig()
		cfg.Baselines, cfg.NVMeLink, cfg.NVMeAdmission, cfg.PrefetchBlocks = false, "nvme-gen5", "all", blocks
		cfg.GPUBytes, cfg.HostBytes, cfg.NVMeBytes = 2<<30, 4<<30, 64<<30
		rep := runOrFail(t, GeneratedSource("agentic", gen), cfg)
		res := result(t, rep, costplan.Cost)
		t.Logf("prefetch %d: %+v loads %+v TTFT %+v", blocks, res.NVMeWrites, res.Loads, res.TTFT)
		return res
	}
	off, on := run(0), run(256)
	if off.NVMeWrites.Prefetched != 0 || on.NVMeWrites.Prefetched == 0 {
		t.Fatalf("prefetched %d blocks without prefetch and %d with it", off.NVMeWrites.Prefetched, on.NVMeWrites.Prefetched)
	}
	if on.Loads.FromNVMe >= off.Loads.FromNVMe || on.Loads.FromHost <= off.Loads.FromHost {
		t.Errorf("loads from the host tier and NVMe: %d and %d with prefetch, %d and %d without",
			on.Loads.FromHost, on.Loads.FromNVMe, off.Loads.FromHost, off.Loads.FromNVMe)
	}
	if on.TTFT.Mean > off.TTFT.Mean {
		t.Errorf("mean TTFT %.3f s with prefetch, %.3f s without", on.TTFT.Mean, off.TTFT.Mean)
	}
}
