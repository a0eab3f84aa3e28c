package replay

import (
	"time"

	"kvtier.dev/kvtier"
)

// The replay's own model of its links: every copy under Config.Mover
// "model", and the copies to and from NVMe under "device" (whose copies
// between the GPU and the host tier the DeviceMover makes on the simulated
// device, device.go). What the replay needs of a link is when each copy
// ends, given the copies queued before it: a server per link, serving one
// block copy at a time, onboard copies (a request waits for them) before
// offloads.
//
// The links are kvtier/cost's Paths, timed as its Planner times them, so
// that the replay executes what the planner priced. The loads of one
// Onboard cross the GPU's ingress as one job, as the copy engine copies
// them, layer by layer: its layers land, and it ends, where the Planner's
// PassLoads puts them behind the ingress's queue. Any other copy occupies
// its channel for its path's StreamTime, and ends no sooner than its
// path's Latency after it was submitted, so the latency of a copy overlaps
// the copies queued before it (a stream of asynchronous copies).

// channel is one direction of one link: a FIFO server for block copies.
type channel uint8

const (
	// chanHostToGPU is the GPU's ingress: every load, from the host tier
	// (the host link) and from NVMe (the drive then the host link,
	// pipelined: the slower sets the rate), one after another, as the
	// Planner's loads share one ingress.
	chanHostToGPU channel = iota
	// chanGPUToHost carries offloads to the host tier (PCIe, device to host;
	// PCIe is full duplex, so it does not slow loads).
	chanGPUToHost
	// chanNVMe is the drive: copies into NVMe (and out of it to the host
	// tier). Its reads into the GPU are on the ingress, pipelined with the
	// host link; under Config.Mover "device" the drive reads them first,
	// and the device's copy engine then takes each to the GPU (device.go).
	chanNVMe
	numChannels
)

var channelNames = [numChannels]string{"gpu ingress (host and nvme loads)", "pcie gpu->host", "nvme drive"}

// priority orders a channel's queue: onboard copies first, then
// prefetches (reads no request waits for yet), then offloads.
type priority uint8

const (
	prioOnboard priority = iota
	prioPrefetch
	prioOffload
	numPriorities
)

// copyJob is one block copy waiting for or crossing a channel.
type copyJob struct {
	t   *kvtier.Batch
	op  int
	req *request // the request waiting for it (loads), or nil
	// ready is when the copy's latency has passed (its submission plus its
	// path's latency); stream is its time on the channel.
	ready, stream time.Duration
	// staged marks, under Config.Mover "device", an NVMe read into the
	// GPU: when the drive has read it, the device copies it to the GPU
	// from a staging slot (devicePath.stage).
	staged bool
	// write marks a copy into NVMe.
	write bool
	// loads, when not 0, makes the job an Onboard's loads into the GPU:
	// that many ops of t from op on (those into the GPU), which complete
	// together when the job ends.
	loads int
}

// ops is how many copies the job makes.
func (j *copyJob) ops() int { return max(1, j.loads) }

// server is one channel's queue and what it is serving.
type server struct {
	queue [numPriorities]jobQueue
	// queuedOffloadBytes is the bytes of the offloads in queue.
	queuedOffloadBytes int64
	// onboardTail is when the last onboard copy queued ends (the channel
	// serves onboard copies first, in order): what a new load waits
	// behind. Exact on the GPU's ingress, which carries no offload; Submit
	// keeps it for every load, and under Config.Mover "device" it is the
	// same formula's estimate of the device's queue.
	onboardTail time.Duration
	busy        bool
	servingEnd  time.Duration // when the copy in service ends

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

// ops is how many copies the queued jobs make.
func (q *jobQueue) ops() int {
	n := 0
	for i := range q.jobs[q.head:] {
		n += q.jobs[q.head+i].ops()
	}
	return n
}

// streamSum is the queued copies' time on the channel.
func (q *jobQueue) streamSum() time.Duration {
	var d time.Duration
	for _, j := range q.jobs[q.head:] {
		d += j.stream
	}
	return d
}

// route is the channel and priority of a copy between two tiers.
func route(from, to kvtier.Tier) (channel, priority) {
	switch {
	case to == kvtier.GPU: // from the host tier or NVMe: the GPU's ingress
		return chanHostToGPU, prioOnboard
	case from == kvtier.NVMe: // a prefetch: after the loads, before the writes
		return chanNVMe, prioPrefetch
	case to == kvtier.NVMe:
		return chanNVMe, prioOffload
	}
	return chanGPUToHost, prioOffload
}
