package replay

import (
	"bytes"
	"strings"
	"testing"
	"time"

	"kvtier.dev/kvtier"
	"kvtier.dev/kvtier/cost"
	"kvtier.dev/kvtier/costplan"
)

func TestRoute(t *testing.T) {
	cases := []struct {
		from, to kvtier.Tier
		ch       channel
		prio     priority
	}{
		{kvtier.Host, kvtier.GPU, chanHostToGPU, prioOnboard},
		{kvtier.NVMe, kvtier.GPU, chanHostToGPU, prioOnboard},
		{kvtier.NVMe, kvtier.Host, chanNVMe, prioPrefetch},
		{kvtier.GPU, kvtier.Host, chanGPUToHost, prioOffload},
		{kvtier.Host, kvtier.NVMe, chanNVMe, prioOffload},
		{kvtier.GPU, kvtier.NVMe, chanNVMe, prioOffload},
	}
	for _, c := range cases {
		if ch, p := route(c.from, c.to); ch != c.ch || p != c.prio {
			t.Errorf("%v->%v: %s prio %d, want %s prio %d", c.from, c.to, channelNames[ch], p, channelNames[c.ch], c.prio)
		}
	}
}

func TestJobQueueIsFIFOAndReusesItsBuffer(t *testing.T) {
	var q jobQueue
	for round := range 3 {
		for i := range 5 {
			q.push(copyJob{op: round*10 + i})
		}
		for i := range 5 {
			j, ok := q.pop()
			if !ok || j.op != round*10+i {
				t.Fatalf("round %d pop %d: %v %v", round, i, j.op, ok)
			}
		}
		if _, ok := q.pop(); ok || q.len() != 0 {
			t.Fatal("empty queue popped")
		}
	}
	if cap(q.jobs) > 8 {
		t.Errorf("the buffer grew to %d for 5 jobs at a time", cap(q.jobs))
	}
}

// TestChannelTimes: a copy's time is its kvtier/cost path's: a load from
// NVMe crosses the drive then PCIe, pipelined, and pays both latencies.
func TestChannelTimes(t *testing.T) {
	e, err := newEngine(DefaultConfig(), costplan.Cost)
	if err != nil {
		t.Fatal(err)
	}
	if err := e.start(512); err != nil {
		t.Fatal(err)
	}
	host, _ := cost.LookupLink("pcie5-pinned")
	nvme, _ := cost.LookupLink("nvme-gen4")
	block := int64(131072 * 512) // Llama-3.1-8B, bf16
	if e.blockBytes != block {
		t.Fatalf("block %d bytes, want %d", e.blockBytes, block)
	}
	hostPath := cost.DirectPath(host)
	if got, want := e.loadTime[kvtier.Host], hostPath.TransferTime(block); absDiff(got, want) > time.Nanosecond || got > 2*time.Millisecond {
		t.Errorf("host to GPU %v, want %v (about 1.2 ms)", got, want)
	}
	nvmePath := cost.Path{Source: nvme, Ingress: host, Pipelined: true}
	if got, want := e.loadTime[kvtier.NVMe], nvmePath.TransferTime(block); absDiff(got, want) > time.Nanosecond || want < nvme.TransferTime(block) {
		t.Errorf("NVMe to GPU %v, want %v", got, want)
	}
	if got, want := e.copyStream[kvtier.GPU][kvtier.NVMe], nvmePath.StreamTime(block); got != want {
		t.Errorf("GPU to NVMe %v, want the drive's %v", got, want)
	}
}

func absDiff(a, b time.Duration) time.Duration {
	if a < b {
		return b - a
	}
	return a - b
}

// TestTPLinksWorkAtOnce: at tp 4 each GPU holds a quarter of every block
// and moves it over its own link, all four at once. With tiers a quarter
// the size per GPU (the same blocks fit), each copy on each link carries a
// quarter of a block and keeps the link busy about a quarter as long as at
// tp 1; one link shared by the four GPUs would be busy as long per copy.
func TestTPLinksWorkAtOnce(t *testing.T) {
	cfg := testConfig()
	cfg.Strategy, cfg.Baselines = costplan.Reload.String(), false
	cfg.HostBytes = min(cfg.HostBytes, 64<<30)
	tp4 := cfg
	tp4.TP = 4
	tp4.GPUBytes, tp4.HostBytes, tp4.NVMeBytes = cfg.GPUBytes/4, cfg.HostBytes/4, cfg.NVMeBytes/4
	src := firstLines(BundledSource(), 600)
	one, four := runOrFail(t, src, cfg), runOrFail(t, src, tp4)
	r1, r4 := &one.Results[0], &four.Results[0]
	if r1.Loads.Blocks == 0 || r4.Loads.Blocks == 0 {
		t.Fatalf("loads: %d at tp 1, %d at tp 4: the test shows nothing without them", r1.Loads.Blocks, r4.Loads.Blocks)
	}
	for i, l4 := range r4.Links {
		l1 := r1.Links[i]
		t.Logf("%s: tp 1 %d copies, %d bytes, busy %.4f s; tp 4 %d copies, %d bytes per GPU, busy %.4f s",
			l1.Name, l1.Copies, l1.Bytes, l1.BusySeconds, l4.Copies, l4.Bytes, l4.BusySeconds)
		if l1.GPUs != 1 || l4.GPUs != 4 {
			t.Errorf("%s: %d and %d GPUs' links, want 1 and 4", l1.Name, l1.GPUs, l4.GPUs)
		}
		if l1.Copies == 0 || l4.Copies == 0 {
			continue
		}
		if l4.Bytes*4*l1.Copies != l1.Bytes*l4.Copies {
			t.Errorf("%s: tp 4 moved %d copies of %d bytes per GPU, tp 1 %d of %d: want copies of a quarter of a block",
				l1.Name, l4.Copies, l4.Bytes, l1.Copies, l1.Bytes)
		}
		perCopy := (l4.BusySeconds / float64(l4.Copies)) / (l1.BusySeconds / float64(l1.Copies))
		if perCopy < 0.2 || perCopy > 0.3 {
			t.Errorf("%s: a copy keeps the link busy %.2f times as long at tp 4 as at tp 1, want about a quarter", l1.Name, perCopy)
		}
	}
	var txt bytes.Buffer
	if err := four.WriteText(&txt); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(txt.String(), "each of the 4 GPUs its own, all 4 at once") {
		t.Errorf("the tp 4 report does not say its links work at once:\n%s", txt.String())
	}
}
