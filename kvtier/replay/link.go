package replay

import (
	"time"

	"kvtier.dev/kvtier"
)

// The replay models its links itself, on its virtual clock, rather than
// through cudastream's simulated device: that device moves real bytes (its
// device memory is host memory), and a 70B model's 160 MiB blocks in tiers of
// tens of GiB neither fit a replay's memory nor its time budget. What the
// replay needs of a link is when each copy ends, given the copies queued
// before it: a server per link, serving one block copy at a time, onboard
// copies (a request waits for them) before offloads.

// channel is one direction of one link: a FIFO server for block copies.
type channel uint8

const (
	// chanHostToGPU carries loads from the host tier (PCIe, host to device).
	chanHostToGPU channel = iota
	// chanGPUToHost carries offloads to the host tier (PCIe, device to host;
	// PCIe is full duplex, so it does not slow loads).
	chanGPUToHost
	// chanNVMe is the drive: reads (loads into the GPU) and writes
	// (offloads into NVMe) share it. NVMe loads are drive-bound (a drive is
	// several times slower than PCIe), so they are not charged to PCIe.
	chanNVMe
	numChannels
)

var channelNames = [numChannels]string{"pcie host->gpu", "pcie gpu->host", "nvme read+write"}

// priority orders a channel's queue: onboard copies first.
type priority uint8

const (
	prioOnboard priority = iota
	prioOffload
	numPriorities
)

// copyJob is one block copy waiting for or crossing a channel.
type copyJob struct {
	t   *kvtier.Batch
	op  int
	req *request // the request waiting for it (loads), or nil
}

// server is one channel's queue and what it is serving.
type server struct {
	perCopy time.Duration // latency plus one block over the bandwidth
	queue   [numPriorities]jobQueue
	busy    bool
	// busyTime is the total time spent copying.
	busyTime time.Duration
}

// jobQueue is a FIFO of copies that reuses its buffer.
type jobQueue struct {
	jobs []copyJob
	head int
}

func (q *jobQueue) push(j copyJob) {
	if q.head > 0 && q.head == len(q.jobs) {
		q.jobs, q.head = q.jobs[:0], 0
	}
	q.jobs = append(q.jobs, j)
}

func (q *jobQueue) pop() (copyJob, bool) {
	if q.head == len(q.jobs) {
		return copyJob{}, false
	}
	j := q.jobs[q.head]
	q.jobs[q.head] = copyJob{}
	q.head++
	return j, true
}

func (q *jobQueue) len() int { return len(q.jobs) - q.head }

// route is the channel and priority of a copy between two tiers.
func route(from, to kvtier.Tier) (channel, priority) {
	switch {
	case to == kvtier.GPU && from == kvtier.NVMe:
		return chanNVMe, prioOnboard
	case to == kvtier.GPU:
		return chanHostToGPU, prioOnboard
	case to == kvtier.NVMe || from == kvtier.NVMe:
		return chanNVMe, prioOffload
	}
	return chanGPUToHost, prioOffload
}
