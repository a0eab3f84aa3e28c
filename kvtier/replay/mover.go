package replay

import (
	"errors"

	"kvtier.dev/kvtier"
)

// The engine is the block manager's Mover: it queues each copy on its
// modelled channel and completes it when the virtual clock reaches its end.

// maxQueuedOffloads bounds a channel's queue of offloads (copies down the
// tiers): 256 blocks of a 70B model are 40 GiB, about 3 s of one PCIe 5.0
// NVMe drive. Beyond it offloads are dropped, so that a link slower than the
// traffic does not grow a queue (and the replay's memory) without bound.
const maxQueuedOffloads = 256

var errOffloadDropped = errors.New("replay: offload dropped: the link's queue is full")

// Submit implements kvtier.Mover: it queues each copy on its channel; the
// copy completes when the virtual clock reaches its end.
func (e *engine) Submit(t *kvtier.Batch) error {
	for i, op := range t.Ops {
		ch, prio := route(op.From, op.To)
		j := copyJob{t: t, op: i}
		if op.To == kvtier.GPU {
			if e.current == nil {
				panic("replay: a copy into the GPU outside Onboard")
			}
			j.req = e.current
			e.current.pendingLoads++
		}
		if prio == prioOffload && e.servers[ch].queue[prio].len() >= maxQueuedOffloads {
			// Backpressure: the link cannot keep up with the offloads, so
			// this one is dropped, as an offload engine does when its
			// queue is full. The manager frees the destination slot.
			e.res.DroppedOffloads++
			t.Complete(i, errOffloadDropped)
			continue
		}
		e.servers[ch].queue[prio].push(j)
		e.res.copies[op.From][op.To]++
		e.inFlight++
	}
	for ch := range numChannels {
		e.kick(ch)
	}
	return nil
}

// kick starts the next copy on an idle channel: onboard copies first.
func (e *engine) kick(ch channel) {
	s := &e.servers[ch]
	if s.busy {
		return
	}
	for p := range numPriorities {
		if j, ok := s.queue[p].pop(); ok {
			s.busy = true
			s.busyTime += s.perCopy
			e.serving[ch] = j
			e.schedule(event{at: e.now + s.perCopy, kind: evCopyDone, ch: ch})
			return
		}
	}
}

func (e *engine) copyDone(ch channel) {
	j := e.serving[ch]
	e.serving[ch] = copyJob{}
	e.servers[ch].busy = false
	e.inFlight--
	j.t.Complete(j.op, nil) // may submit more copies (write-through)
	if r := j.req; r != nil {
		r.pendingLoads--
		e.maybeLate(r)
	}
	e.kick(ch)
}
