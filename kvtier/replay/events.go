package replay

import (
	"container/heap"
	"time"
)

// The engine's events, in virtual time; ties go in scheduling order, so a
// replay is deterministic.

type eventKind uint8

const (
	evArrival eventKind = iota
	evCopyDone
	evComputeDone
	evDecodeDone
)

type event struct {
	at    time.Duration
	seq   uint64
	kind  eventKind
	ch    channel
	phase phase
	r     *request
}

type eventHeap []event

func (h eventHeap) Len() int { return len(h) }
func (h eventHeap) Less(i, j int) bool {
	if h[i].at != h[j].at {
		return h[i].at < h[j].at
	}
	return h[i].seq < h[j].seq
}
func (h eventHeap) Swap(i, j int) { h[i], h[j] = h[j], h[i] }
func (h *eventHeap) Push(x any)   { *h = append(*h, x.(event)) }
func (h *eventHeap) Pop() any {
	old := *h
	e := old[len(old)-1]
	*h = old[:len(old)-1]
	return e
}

func (e *engine) schedule(ev event) {
	ev.seq = e.seq
	e.seq++
	heap.Push(&e.events, ev)
}
