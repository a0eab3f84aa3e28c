package replay

import (
	"testing"
	"time"

	"kvtier.dev/kvtier"
	"kvtier.dev/kvtier/cost"
)

func TestRoute(t *testing.T) {
	cases := []struct {
		from, to kvtier.Tier
		ch       channel
		prio     priority
	}{
		{kvtier.Host, kvtier.GPU, chanHostToGPU, prioOnboard},
		{kvtier.NVMe, kvtier.GPU, chanHostToGPU, prioOnboard},
		{kvtier.NVMe, kvtier.Host, chanNVMe, prioOffload},
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
	e, err := newEngine(DefaultConfig(), StrategyCost)
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
