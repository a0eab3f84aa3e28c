package replay

import "time"

// The engine's events, in virtual time; ties go in scheduling order, so a
// replay is deterministic.

type eventKind uint8

const (
	evArrival eventKind = iota
	evCopyDone
	evComputeDone
	evDecodeDone
	evRemoteDone // a fetch from the remote tier (remote.go)
	evRoundDone  // a decode round on the GPU (decode.go)
)

type event struct {
	at   time.Duration
	seq  uint64
	kind eventKind
	ch   channel
	r    *request
}

// eventHeap is a binary min-heap of events by (at, seq). It is written out
// rather than built on container/heap, whose Push and Pop take an any and so
// box every event: two allocations per event, one event per block copy.
type eventHeap []event

func (h eventHeap) less(i, j int) bool {
	if h[i].at != h[j].at {
		return h[i].at < h[j].at
	}
	return h[i].seq < h[j].seq
}

func (h *eventHeap) push(ev event) {
	*h = append(*h, ev)
	q := *h
	for i := len(q) - 1; i > 0; {
		p := (i - 1) / 2
		if !q.less(i, p) {
			break
		}
		q[i], q[p] = q[p], q[i]
		i = p
	}
}

// pop removes and returns the earliest event. h MUST NOT be empty.
func (h *eventHeap) pop() event {
	q := *h
	top := q[0]
	n := len(q) - 1
	q[0] = q[n]
	q[n] = event{} // drop the request pointer
	q = q[:n]
	for i := 0; ; {
		l, m := 2*i+1, i
		if l < n && q.less(l, m) {
			m = l
		}
		if r := l + 1; r < n && q.less(r, m) {
			m = r
		}
		if m == i {
			break
		}
		q[i], q[m] = q[m], q[i]
		i = m
	}
	*h = q
	return top
}

func (e *engine) schedule(ev event) {
	e.checkEventTime(ev.at, ev.kind)
	ev.seq = e.seq
	e.seq++
	e.events.push(ev)
}
