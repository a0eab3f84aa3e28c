package replay

import (
	"context"
	"errors"
	"fmt"
	"io"
	"time"

	"kvtier.dev/kvtier"
)

// A request's life in the replay: arrival, admission, lookup and plan,
// loads and prefill, first token, decode, offload.

// request is one request in flight.
type request struct {
	arrival     time.Duration
	started     time.Duration // admitted to prefill
	salt        kvtier.Salt
	keys        []kvtier.Key
	inputTokens int
	outTokens   int

	l1, l2 kvtier.Lease // the looked-up prefix; the whole request in the GPU

	pendingLoads int           // its loads not yet landed
	early, late  time.Duration // prefill before its first load (run while loads cross the link); the rest, after them
	earlyDone    bool
	inserted     bool // its GPU blocks are reserved (InsertKeys)
}

// phase is a part of a request's prefill.
type phase uint8

const (
	phaseEarly phase = iota // the blocks before the first load
	phaseLate               // the rest, once every load has landed
)

// computeJob is prefill work waiting for or running on the GPU.
type computeJob struct {
	r     *request
	phase phase
	d     time.Duration
}

// readNext reads the trace's next request and schedules its arrival.
func (e *engine) readNext() error {
	err := e.src.Next(&e.next)
	if err == io.EOF {
		e.pending = false
		return nil
	}
	if err != nil {
		return err
	}
	if e.bt != 0 && e.next.BlockTokens != e.bt {
		return fmt.Errorf("replay: line %d: block_tokens %d, but the trace began with %d", e.src.Line(), e.next.BlockTokens, e.bt)
	}
	if err := e.checkRequestClock(&e.next, e.name, e.src.Line()); err != nil {
		return err
	}
	e.pending = true
	e.schedule(event{at: e.next.Arrival, kind: evArrival})
	return nil
}

func (e *engine) newRequest() *request {
	var r *request
	if n := len(e.free); n > 0 {
		r, e.free = e.free[n-1], e.free[:n-1]
	} else {
		r = &request{}
	}
	tr := &e.next
	r.arrival, r.salt = tr.Arrival, kvtier.Salt(tr.Salt)
	r.inputTokens, r.outTokens = tr.InputTokens, tr.OutputTokens
	r.keys = r.keys[:0]
	for _, k := range tr.Keys {
		r.keys = append(r.keys, kvtier.Key(k))
	}
	r.pendingLoads, r.early, r.late, r.earlyDone, r.inserted, r.started = 0, 0, 0, false, false, 0
	return r
}

// blockTokensAt is the number of tokens of block i (the last may be
// partial).
func (e *engine) blockTokensAt(r *request, i int) int {
	return min(e.bt, r.inputTokens-i*e.bt)
}

// arrive queues the arriving request for admission.
func (e *engine) arrive() error {
	r := e.newRequest()
	if err := e.flight.arrive(len(r.keys), e.cfg.MemoryBudget, e.name, e.src.Line()); err != nil {
		return err
	}
	e.res.Requests++
	e.res.InputTokens += int64(r.inputTokens)
	e.res.Blocks += int64(len(r.keys))
	if err := e.readNext(); err != nil {
		return err
	}
	if e.progress != nil && e.res.Requests%1024 == 0 {
		e.progress(int(e.res.Requests))
	}
	e.admitQueue = append(e.admitQueue, r)
	e.admit()
	return nil
}

// admit starts the prefill of queued requests, first come first served,
// while a prefill slot is free and the GPU has room for the request's
// blocks (free slots, or blocks no request is using). A waiting request
// holds nothing: like a server's scheduler, the replay looks its prefix up
// and reserves its GPU blocks only when it starts. A request larger than the
// GPU starts once nothing else holds GPU blocks, and keeps what fits.
func (e *engine) admit() {
	slots := e.cfg.PrefillSlots
	for e.admitHead < len(e.admitQueue) && (slots == 0 || e.inPrefill < slots) {
		r := e.admitQueue[e.admitHead]
		if !e.fits(r) {
			return
		}
		e.admitQueue[e.admitHead] = nil
		e.admitHead++
		if e.admitHead == len(e.admitQueue) {
			e.admitQueue, e.admitHead = e.admitQueue[:0], 0
		}
		e.inPrefill++
		e.gpuHeld += int64(len(r.keys))
		e.begin(r)
	}
}

// fits reports whether the GPU can hold r's blocks now, beside those of
// the requests prefilling or decoding. Every strategy, no prefix cache
// included, has the same GPU memory.
func (e *engine) fits(r *request) bool {
	return e.gpuHeld == 0 || e.gpuHeld+int64(len(r.keys)) <= e.gpuSlots
}

// begin looks up the request's prefix, plans it, submits its loads and
// reserves its GPU blocks.
func (e *engine) begin(r *request) {
	r.started = e.now
	if e.m == nil { // no prefix cache: prefill everything
		r.inserted, r.earlyDone = true, true
		r.late = e.computeTime(r, 0, len(r.keys), nil)
		e.res.MissBlocks += int64(len(r.keys))
		e.maybeLate(r)
		return
	}
	if err := e.m.LookupKeys(r.salt, r.keys, &r.l1); err != nil {
		panic(fmt.Sprintf("replay: LookupKeys: %v", err)) // the lease is always released
	}
	if e.planner != nil {
		e.planner.gpuBusy = e.computeRunning > 0 || e.computeHead < len(e.computeQueue)
	}
	if err := e.m.Plan(&r.l1); err != nil {
		e.res.PlanErrors++ // the manager loaded every cached block instead
	}
	if e.strategy == StrategyCost {
		pr := e.planner.last
		e.res.PlannedTime += pr.Time
		e.res.PlannedLoadAll += pr.LoadAllTime
		e.res.PlannedRecomputeAll += pr.RecomputeAllTime
	}
	planned := 0 // loads the plan asked for
	for _, b := range r.l1.Blocks {
		if b.Action == kvtier.Load {
			planned++
		}
	}
	if planned > 0 {
		e.current = r
		err := e.m.Onboard(&r.l1)
		e.current = nil
		if err != nil {
			panic(fmt.Sprintf("replay: Onboard: %v", err)) // the GPU tier is always present
		}
	}
	for i, b := range r.l1.Blocks {
		e.res.HitBlocks[b.Tier]++
		switch {
		case b.Action == kvtier.Use:
			e.res.UsedBlocks++
			e.res.TokensReused += int64(e.blockTokensAt(r, i))
		case b.Loading:
			planned--
			e.res.LoadedBlocks++
			e.res.LoadsFrom[b.Tier]++
			e.res.TokensReused += int64(e.blockTokensAt(r, i))
			e.res.LoadSavedCompute += e.computeTime(r, i, i+1, nil)
		default: // Recompute: chosen, or forced when no GPU slot was free
			e.res.RecomputedBlocks++
			from := chanHostToGPU
			if b.Tier == kvtier.NVMe {
				from = chanNVMe
			}
			e.res.RecomputeSavedLink += e.servers[from].perCopy
		}
	}
	e.res.ForcedRecomputes += int64(planned) // Onboard found no GPU slot for them
	e.res.MissBlocks += int64(len(r.keys) - r.l1.Len())
	e.plan(r)
	e.insert(r)
}

// plan splits the request's prefill into the part before its first load
// (which runs while the loads cross the link) and the rest.
func (e *engine) plan(r *request) {
	first := len(r.keys)
	for i, b := range r.l1.Blocks {
		if b.Loading {
			first = i
			break
		}
	}
	r.early = e.computeTime(r, 0, first, &r.l1)
	r.late = e.computeTime(r, first, len(r.keys), &r.l1)
	if r.early == 0 && r.late == 0 && r.inputTokens > 0 {
		// Every block is cached: the last token is still run through the
		// model, for its logits.
		r.late = e.scen.RecomputeTime(1, r.inputTokens-1, true)
	}
}

// computeTime is the prefill time of the blocks in [from, to) that l (if
// not nil) does not have ready or loading, run by run.
func (e *engine) computeTime(r *request, from, to int, l *kvtier.Lease) time.Duration {
	var total time.Duration
	start := -1
	flush := func(end int) {
		if start >= 0 {
			tokens := min(end*e.bt, r.inputTokens) - start*e.bt
			total += e.scen.RecomputeTime(tokens, start*e.bt, true)
			start = -1
		}
	}
	for i := from; i < to; i++ {
		have := false
		if l != nil && i < l.Len() {
			b := l.Blocks[i]
			have = b.Action == kvtier.Use || b.Loading
		}
		if have {
			flush(i)
		} else if start < 0 {
			start = i
		}
	}
	flush(to)
	return total
}

// insert reserves the request's blocks in the GPU and starts its prefill.
// With write-back, a full GPU frees slots only once demotions complete: the
// request then waits for them.
func (e *engine) insert(r *request) {
	err := e.m.InsertKeys(r.salt, r.keys, kvtier.GPU, &r.l2)
	if err != nil && !errors.Is(err, kvtier.ErrNoSpace) {
		panic(fmt.Sprintf("replay: InsertKeys: %v", err)) // only ErrNoSpace is possible on valid input
	}
	if err != nil && e.inFlight > 0 {
		e.m.Release(&r.l2)
		e.waiting = append(e.waiting, r)
		e.res.SpaceWaits++
		return
	}
	if err != nil {
		e.res.UncachedBlocks += int64(len(r.keys) - r.l2.Len())
	}
	r.inserted = true
	if r.early > 0 {
		e.enqueueCompute(r, phaseEarly, r.early)
	} else {
		r.earlyDone = true
		e.maybeLate(r)
	}
}

// retryWaiting retries the inserts of requests waiting for GPU space, in
// arrival order.
func (e *engine) retryWaiting() {
	w := e.waiting
	e.waiting, e.retry = e.retry[:0], w
	for i, r := range w {
		w[i] = nil
		e.insert(r) // back onto e.waiting if still no space
	}
}

// maybeLate starts the late part of r's prefill once the early part is done,
// every load has landed and its GPU blocks are reserved.
func (e *engine) maybeLate(r *request) {
	if !r.earlyDone || r.pendingLoads > 0 || !r.inserted {
		return
	}
	if r.late > 0 {
		e.enqueueCompute(r, phaseLate, r.late)
		return
	}
	e.prefilled(r)
}

// enqueueCompute runs prefill work on the GPU: one job at a time, in FIFO
// order, or with PrefillSlots 0 at once (a GPU per request).
func (e *engine) enqueueCompute(r *request, ph phase, d time.Duration) {
	if e.cfg.PrefillSlots == 0 || e.computeRunning == 0 {
		e.startCompute(computeJob{r, ph, d})
		return
	}
	e.computeQueue = append(e.computeQueue, computeJob{r, ph, d})
}

func (e *engine) startCompute(j computeJob) {
	e.computeRunning++
	e.res.PrefillBusy += j.d
	e.schedule(event{at: e.now + j.d, kind: evComputeDone, r: j.r, phase: j.phase})
}

func (e *engine) computeDone(r *request, ph phase) {
	e.computeRunning--
	if e.computeHead < len(e.computeQueue) {
		j := e.computeQueue[e.computeHead]
		e.computeQueue[e.computeHead] = computeJob{}
		e.computeHead++
		if e.computeHead == len(e.computeQueue) {
			e.computeQueue, e.computeHead = e.computeQueue[:0], 0
		}
		e.startCompute(j)
	}
	if ph == phaseEarly {
		r.earlyDone = true
		e.maybeLate(r)
		return
	}
	e.prefilled(r)
}

// prefilled ends the request's prefill: its first token is out.
func (e *engine) prefilled(r *request) {
	e.ttfts = append(e.ttfts, e.now-r.arrival)
	e.res.QueueWait += r.started - r.arrival
	e.inPrefill--
	defer e.admit()
	if e.m != nil {
		// Wait returns at once: every load of l1 has landed (and Wait
		// would block the single-threaded replay otherwise).
		if err := e.m.Wait(context.Background(), &r.l1); err != nil {
			panic(fmt.Sprintf("replay: a simulated copy failed: %v", err))
		}
		e.m.Release(&r.l1)
		if err := e.m.Commit(&r.l2, nil); err != nil {
			panic(fmt.Sprintf("replay: Commit: %v", err))
		}
	}
	decode := time.Duration(max(0, r.outTokens-1)) * time.Duration(e.cfg.DecodeTokenTime)
	e.schedule(event{at: e.now + decode, kind: evDecodeDone, r: r})
}

// decodeDone ends the request: its new blocks go down to the host tier and
// its GPU blocks become evictable.
func (e *engine) decodeDone(r *request) {
	e.res.End = max(e.res.End, e.now)
	e.gpuHeld -= int64(len(r.keys))
	e.flight.done(len(r.keys))
	if e.m != nil {
		if e.m.CapacitySlots(kvtier.Host) > 0 {
			if err := e.m.Offload(&r.l2, kvtier.Host); err != nil {
				panic(fmt.Sprintf("replay: Offload: %v", err))
			}
		}
		e.m.Release(&r.l2)
	}
	e.free = append(e.free, r)
}
