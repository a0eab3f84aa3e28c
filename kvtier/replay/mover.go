package replay

import (
	"errors"
	"time"

	"kvtier.dev/internal/invariants"
	"kvtier.dev/kvtier"
	"kvtier.dev/kvtier/cost"
)

// The engine is the block manager's Mover: it queues each copy on its
// modelled channel and completes it when the virtual clock reaches its end.

// maxQueuedOffloadBytes bounds the bytes of a channel's queued offloads
// (copies down the tiers): 64 GiB is 1.2 s of the GPU's PCIe 5.0 link and
// 10 s of one PCIe 4.0 NVMe drive, whatever the block size (409 blocks of
// 160 MiB, a 70B model's 512 tokens; 8,192 of 8 MiB, an 8B model's 64
// tokens). A bound in blocks would be milliseconds of link for small
// blocks and drop offloads a link could carry. Beyond it
// offloads are dropped, as an offload engine drops what its link cannot
// keep up with, so that a link slower than the traffic does not grow a
// queue (and the replay's memory) without bound.
const maxQueuedOffloadBytes = 64 << 30

var errOffloadDropped = errors.New("replay: offload dropped: the link's queue is full")

// Backlog implements kvtier.Backlogger: a load planned now waits behind the
// loads queued on the GPU's ingress, whichever mover copies them. The GPU's
// backlog is always 0: a prefilling request has its GPU's compute to
// itself (Config.PrefillSlots).
func (e *engine) Backlog() kvtier.Backlog {
	return kvtier.Backlog{Ingress: max(0, e.servers[chanHostToGPU].onboardTail-e.now), Drive: e.driveBacklog()}
}

// Submit implements kvtier.Mover: it queues each copy on its channel, where
// the copy completes when the virtual clock reaches its end, an Onboard's
// loads as one job (queueLoads); with Config.Mover "device" the copies
// between the GPU and the host tier go to the DeviceMover instead
// (device.go).
func (e *engine) Submit(t *kvtier.Batch) error {
	var rl *relay
	req, pl, first, modelled := e.submitLoads(t)
	for i := range t.Ops {
		op := &t.Ops[i]
		switch {
		case e.dev != nil && op.From != kvtier.NVMe && op.To != kvtier.NVMe:
			if rl == nil {
				rl = e.dev.relayFor(e, t)
			}
			if op.To == kvtier.GPU {
				rl.add(i, req)
			} else {
				rl.add(i, nil)
			}
			e.res.copies[op.From][op.To]++
		case e.dev != nil && op.From == kvtier.NVMe && op.To == kvtier.GPU:
			e.queueStaged(t, i, req)
		case op.To != kvtier.GPU:
			e.queueCopy(t, i, nil)
		}
	}
	if modelled > 0 {
		e.queueLoads(t, first, modelled, req, &pl)
	}
	if rl != nil { // after the model's: a Complete may be t's last
		e.dev.submit(rl)
	}
	for ch := range numChannels {
		e.kick(ch)
	}
	return nil
}

// submitLoads prices t's loads into the GPU, all of one request's Onboard,
// as the Planner prices a pass's (cost.Planner.PassLoads) behind the
// ingress's queue, which they join, whichever mover copies them. It
// returns the request, their pricing, the first of them and how many the
// modelled channels copy.
func (e *engine) submitLoads(t *kvtier.Batch) (req *request, pl cost.PassLoads, first, modelled int) {
	var n [cost.NumTiers]int
	first = -1
	for i := range t.Ops {
		op := &t.Ops[i]
		if op.To != kvtier.GPU {
			continue
		}
		if req = e.loading[t.Lease()]; req == nil {
			invariants.Failf("a copy into the GPU outside a request's Onboard")
		}
		req.pendingLoads++
		n[costTier(op.From)]++
		if e.dev == nil {
			if first < 0 {
				first = i
			}
			modelled++
		}
	}
	if req == nil {
		return nil, pl, first, 0
	}
	s := &e.servers[chanHostToGPU]
	pl = e.costs.PassLoads(n, cost.Backlog{Link: max(0, s.onboardTail-e.now), Drive: e.driveBacklog()})
	s.onboardTail = e.now + pl.IngressEnd()
	req.loadBusy += pl.Busy()
	return req, pl, first, modelled
}

// costTier is kvtier/cost's name for a tier loads come from.
func costTier(t kvtier.Tier) cost.Tier {
	if t == kvtier.NVMe {
		return cost.TierNVMe
	}
	return cost.TierHost
}

// queueLoads queues the n loads into the GPU of t from op first on as one
// job on the GPU's ingress, ending when pl says their last layer lands
// (the ingress serves Onboards in order, so it starts when the one before
// it ends), and records when each of their layers lands for req's pass.
func (e *engine) queueLoads(t *kvtier.Batch, first, n int, req *request, pl *cost.PassLoads) {
	layers := pl.Layers()
	if len(req.ready) < layers {
		req.ready = append(req.ready[:0], make([]time.Duration, layers)...)
	}
	for l := range layers {
		req.ready[l] = max(req.ready[l], e.now+pl.LayerLanded(l))
	}
	s := &e.servers[chanHostToGPU]
	start := e.now
	if s.busy {
		start = max(start, s.servingEnd)
	}
	for p := range numPriorities {
		for i := range s.queue[p].jobs[s.queue[p].head:] {
			start += s.queue[p].jobs[s.queue[p].head+i].stream
		}
	}
	end := e.now + pl.Landed()
	j := copyJob{t: t, op: first, req: req, ready: start, stream: max(0, end-start), loads: n}
	s.queue[prioOnboard].push(j)
	for i := first; i < len(t.Ops); i++ {
		if op := &t.Ops[i]; op.To == kvtier.GPU {
			e.res.copies[op.From][op.To]++
		}
	}
	e.inFlight += n
}

// queueCopy queues op i of t on its channel; req waits for it (a load).
func (e *engine) queueCopy(t *kvtier.Batch, i int, req *request) {
	op := &t.Ops[i]
	ch, prio := route(op.From, op.To)
	j := copyJob{t: t, op: i, req: req, ready: e.now + e.copyLatency[op.From][op.To], stream: e.copyStream[op.From][op.To],
		write: op.To == kvtier.NVMe}
	if prio == prioOffload && e.servers[ch].queuedOffloadBytes+e.blockBytes > maxQueuedOffloadBytes {
		// Backpressure: the link cannot keep up with the offloads, so
		// this one is dropped, as an offload engine does when its
		// queue is full. The manager frees the destination slot.
		e.res.DroppedOffloads++
		e.copiedFromGPU(op)
		t.Complete(i, errOffloadDropped)
		return
	}
	s := &e.servers[ch]
	s.queue[prio].push(j)
	if prio == prioOffload {
		s.queuedOffloadBytes += e.blockBytes
	}
	e.res.copies[op.From][op.To]++
	e.inFlight++
}

// kick starts the next copy on an idle channel: onboard copies first.
func (e *engine) kick(ch channel) {
	s := &e.servers[ch]
	if s.busy {
		return
	}
	for p := range numPriorities {
		if j, ok := s.queue[p].pop(); ok {
			if p == prioOffload {
				s.queuedOffloadBytes -= e.blockBytes
			}
			s.busy = true
			s.busyTime += j.stream
			e.serving[ch] = j
			s.servingEnd = max(e.now, j.ready) + j.stream
			e.schedule(event{at: s.servingEnd, kind: evCopyDone, ch: ch})
			return
		}
	}
}

// queueStaged queues, under Config.Mover "device", op i of t (NVMe to the
// GPU) as a read on the drive's channel; copyDone then hands it to the
// device, which copies it to the GPU behind the host loads (devicePath.stage).
func (e *engine) queueStaged(t *kvtier.Batch, i int, req *request) {
	op := &t.Ops[i]
	// The drive's read is timed as a read into the host tier.
	j := copyJob{t: t, op: i, req: req, ready: e.now + e.copyLatency[kvtier.NVMe][kvtier.Host],
		stream: e.copyStream[kvtier.NVMe][kvtier.Host], staged: true}
	e.servers[chanNVMe].queue[prioOnboard].push(j)
	e.res.copies[op.From][op.To]++
	e.inFlight++
}

func (e *engine) copyDone(ch channel) {
	j := e.serving[ch]
	e.serving[ch] = copyJob{}
	e.servers[ch].busy = false
	e.inFlight -= j.ops()
	if j.staged { // read from the drive: the device takes it to the GPU
		e.dev.stage(e, j)
		e.kick(ch)
		return
	}
	if j.loads > 0 {
		e.loadsDone(&j)
		e.kick(ch)
		return
	}
	e.copiedFromGPU(&j.t.Ops[j.op])
	j.t.Complete(j.op, nil) // may submit more copies (write-through)
	if r := j.req; r != nil {
		r.pendingLoads--
		r.landed++
		e.advance(r)
	}
	e.kick(ch)
}

// loadsDone completes the loads of the job j together, as the copy engine
// completes an Onboard's, then lets their request go on.
func (e *engine) loadsDone(j *copyJob) {
	left := j.loads
	for i := j.op; left > 0; i++ {
		op := j.t.Ops[i]
		if op.To != kvtier.GPU {
			continue
		}
		left-- // the batch is not read after its last op completes
		e.copiedFromGPU(&op)
		j.t.Complete(i, nil)
		j.req.pendingLoads--
		j.req.landed++
	}
	e.advance(j.req)
}
