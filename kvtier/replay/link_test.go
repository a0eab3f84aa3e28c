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
		{kvtier.NVMe, kvtier.GPU, chanNVMe, prioOnboard},
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

// TestChannelTimes: a channel's per-block time is the link's (kvtier/cost),
// the NVMe path's pipelined through PCIe.
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
	block := int64(327680 * 512) // Llama-3.1-70B, bf16
	if e.blockBytes != block {
		t.Fatalf("block %d bytes, want %d", e.blockBytes, block)
	}
	if got, want := e.servers[chanHostToGPU].perCopy, host.TransferTime(block); got != want || got > 4*time.Millisecond {
		t.Errorf("host to GPU %v, want %v (about 3.4 ms)", got, want)
	}
	if got := e.servers[chanNVMe].perCopy; got < nvme.TransferTime(block) || got > nvme.TransferTime(block)+time.Millisecond {
		t.Errorf("NVMe %v, want about %v", got, nvme.TransferTime(block))
	}
}
