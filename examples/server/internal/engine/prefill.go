package engine

import (
	"errors"
	"fmt"
	"time"

	"kvtier.dev/cudastream"
	"kvtier.dev/examples/server/internal/httpapi"
	"kvtier.dev/examples/server/internal/model"
	"kvtier.dev/kvtier"
	"kvtier.dev/kvtier/cost"
)

// maxAttempts bounds the lookups of one prefill whose loads keep failing;
// after them the request runs without the cache.
const maxAttempts = 3

// prefill computes s's prompt and sends its first token. It reports whether
// s goes on to decode; if not, s has ended.
func (e *Engine) prefill(s *seq) bool {
	if err := s.ctx.Err(); err != nil {
		e.end(s, err)
		return false
	}
	start := time.Now()
	e.prefilling.Store(true)
	defer e.prefilling.Store(false)
	s.forward, s.spaceWait = 0, 0
	s.tokens = append(make([]int32, 0, s.positions()+1), s.req.Tokens...)
	var logits []float32
	var next int32
	var err error
	if s.noCache {
		logits, next, err = e.prefillScratch(s)
	} else {
		logits, next, err = e.prefillCached(s)
	}
	if err != nil {
		e.end(s, err)
		return false
	}
	prefill := time.Since(start)
	e.prefillSecs.Observe(prefill.Seconds())
	s.usage.QueueSeconds = start.Sub(s.submitted).Seconds()
	s.usage.PrefillSeconds, s.usage.ForwardSeconds = prefill.Seconds(), s.forward.Seconds()
	if s.spaceWait > 0 {
		s.usage.SpaceWaitSeconds = s.spaceWait.Seconds()
		e.spaceWaits.Inc()
		e.spaceSecs.Add(s.usage.SpaceWaitSeconds)
	}
	return e.emit(s, logits, next)
}

// prefillScratch computes the whole prompt in scratch slots, with no
// lookup and no insert: a no-cache request.
func (e *Engine) prefillScratch(s *seq) ([]float32, int32, error) {
	n := len(s.req.Tokens)
	s.scratch = e.scratch.take(s.scratch, e.cfg.Model.Blocks(s.positions()))
	s.slots = append(s.slots[:0], s.scratch...)
	p := model.Plan{Slots: s.slots[:e.cfg.Model.Blocks(n)], Compute: appendRange(nil, 0, n)}
	t0 := time.Now()
	logits, next, err := e.cfg.Runner.Forward(s.tokens, p, nil)
	d := time.Since(t0)
	s.forward += d
	if err == nil && e.cfg.Observer != nil {
		e.cfg.Observer.Pass(cost.PrefillSample{Tokens: n, Seconds: d.Seconds()}, kvtier.GPU)
	}
	return logits, next, err
}

// prefillCached is the kvtier path of the package doc. A failed load makes
// it start again from the lookup, the lost blocks then recomputed.
func (e *Engine) prefillCached(s *seq) ([]float32, int32, error) {
	lost := make([]bool, (len(s.req.Tokens)-1)/e.bt)
	for attempt := 1; ; attempt++ {
		logits, next, err := e.attempt(s, lost)
		if !errors.Is(err, kvtier.ErrMove) {
			return logits, next, err
		}
		e.failedLoads.Inc()
		e.log.Warn("engine: a KV load failed; recomputing", "request", s.req.ID, "attempt", attempt, "err", err)
		e.releaseLeases(s)
		if attempt == maxAttempts {
			s.usage = httpapi.Usage{RecomputedTokens: countTrue(lost) * e.bt}
			return e.prefillScratch(s)
		}
	}
}

// attempt runs one lookup, plan, onboard, insert, forward pass and commit.
// An error wrapping kvtier.ErrMove means a load failed: nothing computed
// was committed or sent, the leases are still held (the caller releases
// them), and lost marks the blocks that were loading.
func (e *Engine) attempt(s *seq, lost []bool) ([]float32, int32, error) {
	// The cache serves the full blocks before the one holding the last
	// position: that block is always computed (its logits are the first
	// token), in scratch, so that no pass writes into a block the cache
	// holds.
	full := (len(s.req.Tokens) - 1) / e.bt
	lc, err := e.lookupAndLoad(s, full)
	if err != nil {
		return nil, 0, err
	}
	p := e.place(s, full, &lc)
	return e.forward(s, p, &lc, lost)
}

// lookupAndLoad looks up the prompt's first full blocks (what the remote
// tier had is in the host tier by now: startFetch), plans the whole prompt, starts the loads and
// reserves the blocks to compute.
func (e *Engine) lookupAndLoad(s *seq, full int) (loadClock, error) {
	m, prompt := e.cfg.Cache, s.req.Tokens
	cached := prompt[:full*e.bt]
	if err := m.Lookup(s.req.Salt, cached, &s.look); err != nil {
		return loadClock{}, err
	}
	s.leased = true
	if r := e.cfg.Remote; r != nil {
		// What the remote tier had of the prompt came into the host tier
		// while s waited (startFetch). The host blocks it finds are offered
		// to the remote tier (write-behind; the admitter sends those seen
		// twice); that fails no request, and what Publish returns (a lease
		// it cannot use) is logged here.
		if _, err := r.Publish(s.req.Salt, cached, &s.look); err != nil {
			e.log.Warn("engine: remote publish", "request", s.req.ID, "err", err)
		}
	}
	// The plan covers the whole prompt: the block of the last position,
	// always computed, by its tokens.
	if err := s.look.SetTokens(len(prompt)); err != nil {
		return loadClock{}, err
	}
	if err := m.Plan(&s.look); err != nil {
		e.log.Debug("engine: planner failed; loading every cached block", "request", s.req.ID, "err", err)
	}
	lc := loadClock{onboard: time.Now()}
	split, err := e.onboard(s)
	lc.split = split
	if err != nil {
		return lc, err
	}
	return lc, e.insert(s, cached)
}

// onboard starts the planned loads. Those refused for want of a GPU slot
// while copies still read GPU blocks wait for as many of those copies to
// end, and are tried again: a block is recomputed, and left uncached, only
// when no copy out of the GPU is left to free a slot. split reports a
// retry: the loads were not one onboard, and their time is no link's.
func (e *Engine) onboard(s *seq) (split bool, err error) {
	m := e.cfg.Cache
	for {
		if err := m.Onboard(&s.look); err != nil {
			return split, err
		}
		refused := s.look.Refused()
		if refused == 0 {
			return split, nil
		}
		waited, err := e.waitForSlots(s, refused)
		if err != nil || !waited {
			return split, err
		}
		s.look.RetryRefused()
		split = true
	}
}

// waitForSlots waits for n copies out of the GPU to end (WaitCopiesFrom),
// counting the time in the request's space wait.
func (e *Engine) waitForSlots(s *seq, n int) (bool, error) {
	t0 := time.Now()
	waited, err := e.cfg.Cache.WaitCopiesFrom(s.ctx, kvtier.GPU, n)
	if waited {
		s.spaceWait += time.Since(t0)
	}
	if err != nil {
		return waited, fmt.Errorf("engine: request %s: waiting for GPU slots: %w", s.req.ID, err)
	}
	return waited, nil
}

// insert reserves the GPU slots of the blocks to compute. Short of slots
// while copies still read GPU blocks (write-through copies, offloads), it
// releases what it got, waits for as many of those copies to end as it
// lacked slots, and tries again, as the replay's requests do; with no copy
// left to wait for it keeps what fits, and computes the rest in scratch,
// uncached.
func (e *Engine) insert(s *seq, cached []int32) error {
	m := e.cfg.Cache
	for {
		err := m.Insert(s.req.Salt, cached, kvtier.GPU, &s.ins)
		if err == nil || !errors.Is(err, kvtier.ErrNoSpace) {
			return err
		}
		lacked := len(cached)/e.bt - s.ins.Len()
		m.Release(&s.ins)
		waited, werr := e.waitForSlots(s, lacked)
		if werr != nil {
			return werr
		}
		if !waited {
			if err := m.Insert(s.req.Salt, cached, kvtier.GPU, &s.ins); err != nil && !errors.Is(err, kvtier.ErrNoSpace) {
				return err
			}
			return nil
		}
	}
}

// placement is where a prefill's blocks are and which it computes.
type placement struct {
	full      int             // the full blocks before the last position's
	byPos     []*kvtier.Block // the lookup's block at each position, or nil
	compute   []bool          // per full block: computed by this pass
	fromCache []int32         // the slots of the blocks it reads, not computes
}

// place sets s.slots: the slot of each full block, and which of them to
// compute: Insert's answer where it reached (a reserved slot to write, or
// the block ready or loading in the GPU), else the lookup's (used or
// loading), else a scratch slot; then the scratch slots of the rest.
func (e *Engine) place(s *seq, full int, lc *loadClock) placement {
	p := placement{full: full, byPos: make([]*kvtier.Block, full), compute: make([]bool, full)}
	for i := range s.look.Blocks {
		if b := &s.look.Blocks[i]; b.Position < full {
			p.byPos[b.Position] = b
			if b.Loading {
				lc.add(b.Tier, e.block)
			}
		}
	}
	s.slots = s.slots[:0]
	need := e.cfg.Model.Blocks(s.positions()) - full
	for b := range full {
		lb := p.byPos[b]
		switch {
		case b < len(s.ins.Blocks):
			ib := &s.ins.Blocks[b]
			s.slots = append(s.slots, int32(ib.Slot))
			p.compute[b] = ib.Write
		case lb != nil && lb.Loading:
			s.slots = append(s.slots, int32(lb.GPUSlot))
		case lb != nil && lb.Action == kvtier.Use:
			s.slots = append(s.slots, int32(lb.Slot))
		default:
			s.slots = append(s.slots, -1) // a scratch slot, below
			p.compute[b] = true
			need++
		}
		if !p.compute[b] {
			p.fromCache = append(p.fromCache, s.slots[b])
		}
	}
	s.scratch = e.scratch.take(s.scratch[:0], need)
	k := 0
	for b, slot := range s.slots {
		if slot < 0 {
			s.slots[b] = s.scratch[k]
			k++
		}
	}
	s.slots = append(s.slots, s.scratch[k:]...)
	return p
}

// forward runs the forward pass, waiting layer by layer for the loads (on
// the device or the host: Config.LayerWait), then commits the computed
// blocks. If a load failed it marks its blocks lost, frees the blocks the
// pass wrote (whose KV may have read the failed bytes, as the logits may)
// and returns the failure: nothing of the pass is used.
func (e *Engine) forward(s *seq, p placement, lc *loadClock, lost []bool) ([]float32, int32, error) {
	m, c, bt, n := e.cfg.Cache, e.cfg.Model, e.bt, len(s.req.Tokens)
	pos := model.AppendBlockPositions(nil, bt, n, p.compute)
	pos = appendRange(pos, p.full*bt, n) // the block of the last position
	ready := func(l int) error {
		if l == c.Layers-1 && lc.bytes > 0 {
			return lc.wait(func() error { return s.look.WaitLayer(s.ctx, l) })
		}
		return s.look.WaitLayer(s.ctx, l)
	}
	plan := model.Plan{Slots: s.slots[:c.Blocks(n)], Compute: pos, Ready: ready}
	if e.cfg.LayerWait == LayerWaitDevice {
		// The runner's stream waits; the load's errors are Wait's, below.
		if lc.bytes > 0 && e.cfg.Observer != nil && !lc.mixed && !lc.split {
			lc.watch = make(chan struct{})
		}
		plan.LayerEvents = func(l int, dst []cudastream.Event) ([]cudastream.Event, error) {
			return e.layerEvents(s, lc, l, dst)
		}
	}
	t0 := time.Now()
	logits, next, ferr := e.cfg.Runner.Forward(s.tokens, plan, p.fromCache)
	passTime := time.Since(t0)
	s.forward += passTime
	lc.joinWatch()
	if werr := m.Wait(s.ctx, &s.look); werr != nil {
		for b, lb := range p.byPos {
			if lb != nil && lb.Loading {
				lost[b] = true
			}
		}
		_ = m.Commit(&s.ins, werr)
		if errors.Is(werr, kvtier.ErrMove) {
			return nil, 0, werr
		}
		return nil, 0, fmt.Errorf("engine: request %s: waiting for its loads: %w", s.req.ID, werr)
	}
	if ferr != nil {
		_ = m.Commit(&s.ins, ferr)
		return nil, 0, ferr
	}
	if err := m.Commit(&s.ins, nil); err != nil {
		return nil, 0, err
	}
	e.account(s, p.byPos, p.compute, lost)
	if o := e.cfg.Observer; o != nil {
		lc.report(o)
		if ps, ok := lc.passSample(p.compute, bt, n, t0, passTime); ok {
			o.Pass(ps, lc.tier)
		}
	}
	return logits, next, nil
}

// account fills s.usage from where each full block's KV came from.
func (e *Engine) account(s *seq, byPos []*kvtier.Block, compute, lost []bool) {
	u := &s.usage
	for b, comp := range compute {
		lb := byPos[b]
		switch {
		case comp && (lb != nil || lost[b]):
			u.RecomputedTokens += e.bt
		case comp:
		case lb != nil && lb.Loading:
			u.LoadedTokens[lb.Tier] += e.bt
			u.LoadedBytes[lb.Tier] += e.block
		default:
			u.LoadedTokens[kvtier.GPU] += e.bt
		}
	}
}

// decode runs one step of s. It reports whether s goes on; if not, s has
// ended.
func (e *Engine) decode(s *seq) bool {
	if err := s.ctx.Err(); err != nil {
		e.end(s, err)
		return false
	}
	pos := len(s.tokens) - 1
	p := model.Plan{Slots: s.slots[:e.cfg.Model.Blocks(pos+1)], Compute: []int32{int32(pos)}}
	t0 := time.Now()
	logits, next, err := e.cfg.Runner.Forward(s.tokens, p, nil)
	e.decodeSecs.Observe(time.Since(t0).Seconds())
	if err != nil {
		e.end(s, fmt.Errorf("engine: request %s: decode at position %d: %w", s.req.ID, pos, err))
		return false
	}
	return e.emit(s, logits, next)
}

// emit sends one token, with its log-probabilities from logits when the
// request asked for them; it reports whether s goes on.
func (e *Engine) emit(s *seq, logits []float32, tok int32) bool {
	if s.req.Logprobs {
		s.out.SendLogprobs(tok, topLogprobs(logits, s.req.TopLogprobs, tok))
	} else {
		s.out.Send(tok)
	}
	s.sent++
	s.tokens = append(s.tokens, tok)
	if s.sent == s.req.MaxTokens {
		e.end(s, nil)
		return false
	}
	return true
}

// end releases what s holds and finishes its stream.
func (e *Engine) end(s *seq, err error) {
	e.releaseLeases(s)
	e.scratch.give(s.scratch)
	s.scratch = s.scratch[:0]
	s.out.Finish(s.usage, err)
}

func (e *Engine) releaseLeases(s *seq) {
	if !s.leased {
		return
	}
	e.cfg.Cache.Release(&s.ins)
	e.cfg.Cache.Release(&s.look)
	s.leased = false
}

func appendRange(dst []int32, from, to int) []int32 {
	for p := from; p < to; p++ {
		dst = append(dst, int32(p))
	}
	return dst
}

func countTrue(b []bool) int {
	n := 0
	for _, v := range b {
		if v {
			n++
		}
	}
	return n
}
