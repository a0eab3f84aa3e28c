package replay

import (
	"context"
	"fmt"
	"io"
	"math"
	"time"

	"kvtier.dev/internal/invariants"
	"kvtier.dev/kvtier"
	"kvtier.dev/kvtier/costplan"
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
	prefetched  bool // first in line once: its NVMe blocks prefetched
	waited      bool // it waited for GPU slots (space.go)
	waitLoads   bool // it waits for GPU slots for its refused loads, not its insert
	wakeAt      int64

	// l1 and l2 are its leases once started, of ls: the looked-up prefix,
	// the whole request in the GPU; nil while queued (budget.go).
	l1, l2 *kvtier.Lease
	ls     *leasePair
	held   int64 // its own bytes, as inFlight counts them

	pendingLoads int // its loads not yet landed
	landed       int // its loads landed
	// Its prefill is one forward pass (pass.go): from passStart, layer l
	// computes for work/Layers once layer l-1 is done and layer l of its
	// loads has landed: ready[l] for the modelled channels' loads (empty
	// without), the layer events of its lease for the device's.
	ready     []time.Duration
	passStart time.Duration
	work      time.Duration // the pass's compute: floor and the pass's own cost included
	loadBusy  time.Duration // the ingress's time copying its loads, as priced (cost.PassLoads.Busy)
	computing bool          // its pass's end is scheduled
	inserted  bool          // its GPU blocks are reserved (InsertKeys)
	fetchEnd  int           // the blocks [0, fetchEnd) it is fetching from the remote tier (remote.go)
	// ext is what only some replays need (Config.DecodeOnGPU,
	// Options.OnRequest); nil in the others, so that the request stays
	// small.
	ext *requestExt
}

// requestExt is the part of a request that only the replays with
// Config.DecodeOnGPU or Options.OnRequest keep (engine.usesExt); the
// memory estimate counts it (budget.go).
type requestExt struct {
	index      int64         // its position in the trace, from 0
	firstToken time.Duration // its prefill ended
	decodeLeft int           // with Config.DecodeOnGPU: its decode steps still to run
	// What its prefill did with its blocks, for its RequestRecord.
	used, recomputed, missed int
	loadedFrom               [kvtier.NumTiers]int
	planned                  time.Duration // the cost model's prediction (costplan.Cost)
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
	if c := e.cfg.MaxOutputTokens; c > 0 {
		r.outTokens = min(r.outTokens, c)
	}
	r.keys = r.keys[:0]
	for _, k := range tr.Keys {
		r.keys = append(r.keys, kvtier.Key(k))
	}
	r.pendingLoads, r.landed, r.ready, r.computing, r.inserted, r.started = 0, 0, r.ready[:0], false, false, 0
	r.loadBusy = 0
	r.waited = false
	if e.usesExt() {
		if r.ext == nil {
			r.ext = new(requestExt)
		}
		*r.ext = requestExt{index: e.res.Requests}
	}
	e.flight.resize(&r.held, r.bytes())
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
	e.flight.arrive()
	if err := e.flight.check(e.cfg.MemoryBudget, e.name, e.src.Line()); err != nil {
		return err
	}
	if e.res.Requests == 0 {
		e.res.FirstArrival = r.arrival
	}
	e.res.LastArrival = r.arrival
	e.res.OfferedPrefill.Add(e.prefill.Time(r.inputTokens, 0))
	if e.cfg.DecodeOnGPU {
		e.res.OfferedDecode.Add(time.Duration(max(0, r.outTokens-1)) * time.Duration(e.cfg.DecodeTokenTime))
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

// prefetch copies up to Config.PrefetchBlocks of the NVMe blocks of the
// request first in line into the host tier while it waits, once, as the
// model server's engine does.
func (e *engine) prefetch() {
	if e.admitHead == len(e.admitQueue) {
		return
	}
	r := e.admitQueue[e.admitHead]
	if r.prefetched {
		return
	}
	r.prefetched = true
	if e.cfg.PrefetchBlocks == 0 || e.m == nil || e.m.CapacitySlots(kvtier.NVMe) == 0 || e.m.CapacitySlots(kvtier.Host) == 0 {
		return
	}
	n, err := e.m.PrefetchKeys(r.salt, r.keys, kvtier.Host, e.cfg.PrefetchBlocks)
	if err != nil {
		invariants.Failf("replay: PrefetchKeys: %v", err) // the arguments are checked
	}
	e.res.Prefetched += int64(n)
}

// admit starts the prefill of queued requests, first come first served,
// while a prefill slot is free and the GPU has room for the request's
// blocks (free slots, or blocks no request is using). A waiting request
// holds nothing: like a server's scheduler, the replay looks its prefix up
// and reserves its GPU blocks only when it starts. A request larger than the
// GPU starts once nothing else holds GPU blocks, and keeps what fits. With
// Config.DecodeOnGPU a prefill also waits for the decode round running on
// the GPU, and for fewer than Config.MaxBatch requests decoding (decode.go).
func (e *engine) admit() {
	slots := e.cfg.PrefillSlots
	for e.admitHead < len(e.admitQueue) && (slots == 0 || e.inPrefill < slots) && e.mayPrefill() {
		r := e.admitQueue[e.admitHead]
		if !e.fits(r) {
			break
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
	e.memoryWait()
	e.prefetch()
}

// memoryWait times the waits of the request first in line for GPU memory
// while a prefill could start, and the KV it and those running needed.
func (e *engine) memoryWait() {
	slots := e.cfg.PrefillSlots
	blocked := e.admitHead < len(e.admitQueue) && (slots == 0 || e.inPrefill < slots) && e.mayPrefill()
	if blocked {
		need := e.gpuHeld + int64(len(e.admitQueue[e.admitHead].keys))
		e.res.KVNeededBlocks = max(e.res.KVNeededBlocks, need)
	}
	switch {
	case blocked && !e.memBlocked:
		e.memBlocked, e.memBlockedAt = true, e.now
	case !blocked && e.memBlocked:
		e.memBlocked = false
		e.res.MemoryWait += e.now - e.memBlockedAt
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
	e.res.Running++
	e.res.MaxRunning = max(e.res.MaxRunning, e.res.Running)
	if e.m == nil { // no prefix cache: prefill everything
		r.inserted, r.passStart = true, e.now
		e.plan(r)
		e.held(r)
		e.res.MissBlocks += int64(len(r.keys))
		e.tallySalt(r.salt, len(r.keys), 0)
		if x := r.ext; x != nil {
			x.missed = len(r.keys)
		}
		e.advance(r)
		return
	}
	e.takeLeases(r)
	if err := e.m.LookupKeys(r.salt, r.keys, r.l1); err != nil {
		invariants.Failf("replay: LookupKeys: %v", err) // the lease is always released
	}
	if e.remote != nil && e.fetch(r) {
		return // fetchDone goes on
	}
	e.planAndLoad(r)
}

// planAndLoad plans the looked-up request, submits its loads and reserves
// its GPU blocks.
func (e *engine) planAndLoad(r *request) {
	if err := r.l1.SetTokens(r.inputTokens); err != nil {
		invariants.Failf("replay: %v", err) // the trace reader checks keys against tokens
	}
	if err := e.m.Plan(r.l1); err != nil {
		e.res.PlanErrors++ // the manager loaded every cached block instead
	}
	if e.planned != nil {
		e.planned(r)
	}
	if e.strategy == costplan.Cost {
		est := r.l1.Estimate()
		if x := r.ext; x != nil {
			x.planned = est.Time
		}
		e.res.PlannedTime.Add(est.Time)
		e.res.PlannedLoadAll.Add(est.LoadAllTime)
		e.res.PlannedRecomputeAll.Add(est.RecomputeAllTime)
	}
	e.onboard(r)
}

// onboard submits the request's planned loads; those refused a GPU slot
// while copies still read GPU blocks wait for them (space.go) and are
// submitted again, as the server's are.
func (e *engine) onboard(r *request) {
	load := false
	for _, b := range r.l1.Blocks {
		load = load || (b.Action == kvtier.Load && !b.Loading)
	}
	if load {
		e.loading[r.l1] = r
		err := e.m.Onboard(r.l1)
		delete(e.loading, r.l1)
		if err != nil {
			invariants.Failf("replay: Onboard: %v", err) // the GPU tier is always present
		}
	}
	if n := r.l1.Refused(); n > 0 && e.m.CopiesReading(kvtier.GPU) > 0 {
		e.waitForLoads(r, n)
		return
	}
	e.loaded(r)
}

// loaded counts what the request's plan and Onboard did with its blocks,
// then prices its pass and reserves its GPU blocks.
func (e *engine) loaded(r *request) {
	planned := 0 // loads the plan asked for: started, or turned by Onboard
	for _, b := range r.l1.Blocks {
		if b.Loading || (b.Action == kvtier.Recompute && b.Why != kvtier.Planned) {
			planned++
		}
	}
	var used, recomputed int // this request's, for its record
	var loaded [kvtier.NumTiers]int
	for _, b := range r.l1.Blocks {
		i := b.Position // past holes (MaxHoleBlocks), not the index
		e.res.HitBlocks[b.Tier]++
		switch {
		case b.Action == kvtier.Use:
			e.res.UsedBlocks++
			used++
			e.res.TokensReused += int64(e.blockTokensAt(r, i))
		case b.Loading:
			planned--
			e.res.LoadedBlocks++
			e.res.LoadsFrom[b.Tier]++
			loaded[b.Tier]++
			e.res.TokensReused += int64(e.blockTokensAt(r, i))
			e.res.LoadSavedCompute.Add(e.blockCost(r, i))
		default: // Recompute: chosen, or forced when no GPU slot was free
			e.res.RecomputedBlocks++
			recomputed++
			e.res.RecomputeSavedLink.Add(e.loadTime[b.Tier])
		}
	}
	e.res.ForcedRecomputes += int64(planned) // Onboard found no GPU slot for them
	e.res.MissBlocks += int64(len(r.keys) - r.l1.Len())
	e.tallySalt(r.salt, len(r.keys), r.l1.Len())
	if x := r.ext; x != nil {
		x.used, x.loadedFrom, x.recomputed, x.missed = used, loaded, recomputed, len(r.keys)-r.l1.Len()
	}
	e.plan(r)
	e.insert(r)
}

// plan prices the request's pass (r.work) as kvtier/cost's Planner prices
// a plan: each recomputed block (chosen, forced, not cached, or a hole) in
// token order by PrefillCost.BlockSeconds (its pairs with the blocks
// recomputed before it at the attention rate, with the present ones, used
// on the GPU or loaded, at the prefix rate), plus the pass's own cost and
// its read of the present tokens, no less than the pass floor.
func (e *engine) plan(r *request) {
	j := 0 // the next looked-up block, in position order
	computed, present := 0, 0
	compute := 0.0
	var found []kvtier.Block // none without a prefix cache
	if r.l1 != nil {
		found = r.l1.Blocks
	}
	for i := range r.keys {
		tokens := e.blockTokensAt(r, i)
		if j < len(found) && found[j].Position == i {
			b := found[j]
			j++
			if b.Loading || b.Action == kvtier.Use {
				present += tokens
				continue
			}
		}
		compute += e.prefill.BlockSeconds(tokens, computed, present)
		computed += tokens
	}
	r.work = max(e.floor, durationOf(e.prefill.PassEndSeconds(present)+compute))
}

// durationOf converts seconds to a Duration, rounded to the nanosecond.
func durationOf(s float64) time.Duration { return time.Duration(math.Round(s * 1e9)) }

// blockCost is the prefill time of r's block i after the i blocks before
// it, priced as the Planner prices a block when it chooses (its pairs with
// every block before it at the prefix rate): what loading it saves.
func (e *engine) blockCost(r *request, i int) time.Duration {
	tokens := e.blockTokensAt(r, i)
	if tokens != e.bt {
		return e.prefill.MarginalTime(tokens, i*e.bt)
	}
	for len(e.fullBlockCost) <= i {
		j := len(e.fullBlockCost)
		e.fullBlockCost = append(e.fullBlockCost, e.prefill.MarginalTime(e.bt, j*e.bt))
	}
	return e.fullBlockCost[i]
}

// advance schedules the end of r's pass once its GPU blocks are reserved
// and every load it waits for has landed: by then each layer's landing is
// known, and the pass, which ends after its last layer has landed, is
// priced layer by layer (passEnd). Each request computes on a GPU of its
// own (Config.PrefillSlots), so its pass starts when its blocks are
// reserved.
func (e *engine) advance(r *request) {
	if !r.inserted || r.computing || r.pendingLoads > 0 {
		return // copyDone, or the device's completion, calls again
	}
	r.computing = true
	e.computeRunning++
	e.res.PrefillBusy.Add(r.work)
	e.schedule(event{at: max(e.now, e.passEnd(r)), kind: evComputeDone, r: r})
}

// passEnd is when r's pass ends: layer l starts once layer l-1 is done and
// layer l of r's loads has landed, and computes for a layer's share of the
// pass's work; the pass then ends later for its loads copying meanwhile,
// as the Planner prices it (cost.PrefillCost.SlowdownTime: from the pass's
// start until their last layer lands, for their copying time at most).
func (e *engine) passEnd(r *request) time.Duration {
	layers := e.model.Layers
	var slowdown time.Duration
	if r.loadBusy > 0 {
		slowdown = e.prefill.SlowdownTime(r.work, min(r.loadBusy, e.layerLanded(r, layers-1)-r.passStart))
	}
	perLayer := float64(r.work) / float64(layers)
	at := float64(r.passStart)
	for l := range layers {
		at = max(at, float64(e.layerLanded(r, l))) + perLayer
	}
	return time.Duration(math.Round(at)) + slowdown
}

// layerLanded is when layer l of every load r made has landed (0 with
// none): on the modelled channels as they priced it (r.ready), on the
// device at its layer events' times. Called once every load has landed,
// when those times are known.
func (e *engine) layerLanded(r *request, l int) time.Duration {
	var at time.Duration
	if l < len(r.ready) {
		at = r.ready[l]
	}
	if e.dev != nil && r.l1 != nil {
		evs, err := r.l1.LayerEvents(l, e.layerEvents[:0])
		if err != nil {
			invariants.Failf("replay: LayerEvents: %v", err) // l is one of the model's layers
		}
		for _, ev := range evs {
			t, ok := e.dev.eventTime(ev)
			if !ok {
				invariants.Failf("replay: layer %d of a landed load has no time on the device", l)
			}
			at = max(at, t)
		}
		clear(evs)
		e.layerEvents = evs[:0]
	}
	return at
}

func (e *engine) computeDone(r *request) {
	r.computing = false
	e.computeRunning--
	e.prefilled(r)
}

// prefilled ends the request's prefill: its first token is out. Its
// decode follows: beside the GPU, or with Config.DecodeOnGPU on it
// (decode.go).
func (e *engine) prefilled(r *request) {
	// The client sees the first token after the request's handling
	// (checkRequestClock made sure it fits).
	handling, _ := e.handlingOf(r.inputTokens)
	if x := r.ext; x != nil {
		x.firstToken = e.now + handling
	}
	e.ttfts = append(e.ttfts, e.now+handling-r.arrival)
	e.res.QueueWait.Add(r.started - r.arrival)
	e.inPrefill--
	if e.cfg.DecodeOnGPU {
		defer e.prefilledOnGPU(r)
	} else {
		defer e.admit()
	}
	if e.m != nil {
		// Wait returns at once: every load of l1 has landed (and Wait
		// would block the single-threaded replay otherwise).
		if err := e.m.Wait(context.Background(), r.l1); err != nil {
			invariants.Failf("replay: a simulated copy failed: %v", err)
		}
		e.release(r.l1)
		if err := e.m.Commit(r.l2, nil); err != nil {
			invariants.Failf("replay: Commit: %v", err)
		}
	}
	if e.cfg.DecodeOnGPU {
		return
	}
	decode := time.Duration(max(0, r.outTokens-1)) * time.Duration(e.cfg.DecodeTokenTime)
	e.schedule(event{at: e.now + decode, kind: evDecodeDone, r: r})
}

// decodeDone ends the request: its new blocks go down to the host tier and
// its GPU blocks become evictable.
func (e *engine) decodeDone(r *request) {
	e.res.End = max(e.res.End, e.now)
	e.res.Running--
	if e.onRequest != nil {
		e.record(r)
	}
	e.gpuHeld -= int64(len(r.keys))
	e.flight.done()
	if e.m != nil {
		if e.m.CapacitySlots(kvtier.Host) > 0 {
			if err := e.m.Offload(r.l2, kvtier.Host); err != nil {
				invariants.Failf("replay: Offload: %v", err)
			}
		}
		if e.remote != nil {
			e.remote.publish(r)
		}
		e.release(r.l2)
	}
	e.keep(r)
}
