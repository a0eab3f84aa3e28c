package replay

import (
	"fmt"
	"time"
	"unsafe"

	"kvtier.dev/kvtier"
)

// The replay reads its trace lazily, one request ahead of the clock, and
// holds only the requests in flight: arrived and not yet done (queued for a
// prefill slot or GPU memory, prefilling or decoding). When the modelled
// server cannot keep up, or a trace bursts (300,000 requests at one
// timestamp), that is most of the trace at once. inFlight accounts the
// memory they hold, and stops the replay with an error once it passes
// Config.MemoryBudget, instead of growing until the OS kills it.
//
// The estimate is of live heap, from what each request really holds: while
// queued its request and its keys; once started, also its two leases (the
// blocks looked up and those reserved in the GPU, with the manager's scratch
// for them). Requests and leases kept for the next ones (keptMax of each)
// are counted too, at the capacity they grew to.
// TestMemoryEstimateMatchesHeap measures it against runtime.ReadMemStats.
// Go's collector lets the heap grow to about twice the live heap between
// collections (GOGC=100), so the budget is held against twice the estimate.

// keptMax is how many done requests, and how many lease pairs, the replay
// keeps for the next requests: enough for the requests that end between two
// arrivals, so that a steady replay allocates little; what a burst leaves
// behind beyond them goes to the collector.
const keptMax = 256

// heapGrowth is how far the heap grows past the live heap before the
// collector runs, at Go's default GOGC=100.
const heapGrowth = 2

// leaseScratchBytesPerKey is what a started request's leases hold per key
// beside their Blocks: the lookup's copy of the keys (8 B), the Plan's
// scratch (a PlanBlock and an Action, 3 B) and Release's records of the
// lookup's uses (a policy touch of each block found and an admission record
// of each key, 16 B each).
const leaseScratchBytesPerKey = 8 + 3 + 2*16

// leasePair is a started request's two leases: l1 its lookup, l2 its blocks
// in the GPU. Kept and reused once the request is done, it holds the
// buffers it grew.
type leasePair struct {
	l1, l2 kvtier.Lease
	keys   int   // the most keys a request it served had
	held   int64 // its bytes as inFlight counts them
}

// bytes estimates what p holds.
func (p *leasePair) bytes() int64 {
	blocks := int64(cap(p.l1.Blocks) + cap(p.l2.Blocks))
	return int64(unsafe.Sizeof(leasePair{})) + blocks*int64(unsafe.Sizeof(kvtier.Block{})) + int64(p.keys)*leaseScratchBytesPerKey
}

// bytes estimates what r holds itself: the request, its keys, its loads'
// layer times and its extension.
func (r *request) bytes() int64 {
	n := int64(unsafe.Sizeof(request{})) + int64(cap(r.keys))*int64(unsafe.Sizeof(kvtier.Key(0))) +
		int64(cap(r.ready))*int64(unsafe.Sizeof(time.Duration(0)))
	if r.ext != nil {
		n += int64(unsafe.Sizeof(requestExt{}))
	}
	return n
}

// inFlight counts the requests in flight and the bytes the replay holds
// for them (with the requests and leases kept for the next), and their
// peaks.
type inFlight struct {
	requests, peakRequests int64
	bytes, peakBytes       int64
	// err is the first time the bytes passed the budget while a request
	// started (arrivals return theirs); the event loop stops on it.
	err error
}

// resize sets what one holder counted in held holds to n bytes.
func (f *inFlight) resize(held *int64, n int64) {
	f.bytes += n - *held
	*held = n
	f.peakBytes = max(f.peakBytes, f.bytes)
}

// arrive counts an arriving request; its bytes are already counted
// (resize).
func (f *inFlight) arrive() {
	f.requests++
	f.peakRequests = max(f.peakRequests, f.requests)
}

// done counts a finished request out.
func (f *inFlight) done() { f.requests-- }

// check returns a *BudgetError once the bytes, with the collector's
// headroom, pass budget (0: no limit); the trace called name was read up to
// line.
func (f *inFlight) check(budget Bytes, name string, line int) error {
	if budget == 0 || heapGrowth*f.bytes <= int64(budget) {
		return nil
	}
	return &BudgetError{Trace: name, Line: line, Requests: f.requests, Bytes: Bytes(f.bytes), Budget: budget}
}

// BudgetError is a replay stopped because the memory it held for the
// requests in flight, with the collector's headroom, passed
// Config.MemoryBudget.
type BudgetError struct {
	Trace    string
	Line     int   // the trace was read up to it
	Requests int64 // in flight then
	Bytes    Bytes // their estimated live heap
	Budget   Bytes
}

func (e *BudgetError) Error() string {
	return fmt.Sprintf("replay: %s: at line %d, %d requests are in flight at once (arrived, not done), holding about %v (the heap grows to about %dx that between collections): over the memory budget of %v (memory_budget, --memory-budget): the trace bursts faster than the modelled server serves it; raise the budget, add prefill_slots, or replay a slice of the trace",
		e.Trace, e.Line, e.Requests, mib(int64(e.Bytes)), heapGrowth, e.Budget)
}

// mib formats n bytes in MiB.
func mib(n int64) string { return fmt.Sprintf("%.1f MiB", float64(n)/(1<<20)) }

// takeLeases gives r a lease pair, a kept one if any.
func (e *engine) takeLeases(r *request) {
	var p *leasePair
	if n := len(e.keptLeases); n > 0 {
		p, e.keptLeases = e.keptLeases[n-1], e.keptLeases[:n-1]
	} else {
		p = new(leasePair)
	}
	p.keys = max(p.keys, len(r.keys))
	r.ls, r.l1, r.l2 = p, &p.l1, &p.l2
}

// held recounts what r and its leases hold once they may have grown (a
// start, an insert), and checks the budget.
func (e *engine) held(r *request) {
	e.flight.resize(&r.held, r.bytes())
	if r.ls != nil {
		e.flight.resize(&r.ls.held, r.ls.bytes())
	}
	if e.flight.err == nil {
		e.flight.err = e.flight.check(e.cfg.MemoryBudget, e.name, e.src.Line())
	}
}

// keep keeps done request r, and its leases, for the next requests, up to
// keptMax of each; the others are no longer counted.
func (e *engine) keep(r *request) {
	if p := r.ls; p != nil {
		r.ls, r.l1, r.l2 = nil, nil, nil
		if len(e.keptLeases) < keptMax {
			e.flight.resize(&p.held, p.bytes())
			e.keptLeases = append(e.keptLeases, p)
		} else {
			e.flight.resize(&p.held, 0)
		}
	}
	if len(e.free) < keptMax {
		e.free = append(e.free, r)
	} else {
		e.flight.resize(&r.held, 0)
	}
}
