package cost

import (
	"fmt"
	"time"
)

// planRun runs one plan through the model as it runs, block by block:
// the recurrences of simulateCut at nominal costs behind the queues, each
// recomputed block priced by PrefillCost.BlockSeconds (its pairs with the
// blocks recomputed before it at the attention rate, with the blocks
// present at the prefix rate), then the pass's end (its cost and the read
// of the tokens present), no sooner than the floor after the GPU is free.
// With the presets (one attention rate, no read term) its time is
// simulateCut's plus the pass cost.
type planRun struct {
	loadDone, computeDone, end float64
	computed, present          int // tokens before the next block
}

func (r *planRun) load(lat, s float64, tokens int) {
	r.loadDone = max(r.loadDone, lat) + s
	r.end = max(r.end, r.loadDone)
	r.present += tokens
}

func (r *planRun) recompute(pc *PrefillCost, tokens int) {
	r.computeDone = max(r.computeDone, r.loadDone) + pc.BlockSeconds(tokens, r.computed, r.present)
	r.end = max(r.end, r.computeDone)
	r.computed += tokens
}

func (r *planRun) step(c *plannerCosts, a Action, b BlockSource, tokens int, latQ *[NumTiers]float64) {
	switch a {
	case ActionLoad:
		r.load(latQ[b.Tier], c.loadS[b.Tier], tokens)
	case ActionRecompute:
		r.recompute(&c.prefill, tokens)
	default:
		r.present += tokens
	}
}

func (r *planRun) time(c *plannerCosts, gpuQ float64) time.Duration {
	return seconds(max(gpuQ+c.prefill.FloorSeconds, c.prefill.PassEndSeconds(r.present)+max(r.end, gpuQ)))
}

// exactTimes runs, in one pass over the blocks, the plan of the cut k, the
// plan that loads every cached block and the one that recomputes every
// block not on the GPU (planRun), and returns their times from now.
func (p *Planner) exactTimes(c *plannerCosts, blocks []BlockSource, k cut, latQ *[NumTiers]float64, gpuQ float64) (plan, loadAll, recomputeAll time.Duration) {
	bt := p.cfg.BlockTokens
	pl, la, ra := planRun{computeDone: gpuQ}, planRun{computeDone: gpuQ}, planRun{computeDone: gpuQ}
	for i, b := range blocks {
		tokens := b.Tokens
		if tokens == 0 {
			tokens = bt
		}
		pl.step(c, c.action(i, b, k), b, tokens, latQ)
		switch {
		case b.Tier == TierGPU:
			la.present += tokens
			ra.present += tokens
		case b.Tier == TierMissing:
			la.recompute(&c.prefill, tokens)
			ra.recompute(&c.prefill, tokens)
		default:
			la.load(latQ[b.Tier], c.loadS[b.Tier], tokens)
			ra.recompute(&c.prefill, tokens)
		}
	}
	return pl.time(c, gpuQ), la.time(c, gpuQ), ra.time(c, gpuQ)
}

// Simulate is a plan's time on an idle link and GPU, block by block. It
// refuses an action its block cannot take.
func (p *Planner) Simulate(blocks []BlockSource, actions []Action) (time.Duration, error) {
	if len(actions) != len(blocks) {
		return 0, fmt.Errorf("planner: %d actions for %d blocks", len(actions), len(blocks))
	}
	c := p.costs.Load()
	for i, b := range blocks {
		if err := p.checkBlock(c, i, b); err != nil {
			return 0, err
		}
		a := actions[i]
		ok := false
		switch b.Tier {
		case TierGPU:
			ok = a == ActionNone
		case TierMissing:
			ok = a == ActionRecompute
		case TierHost, TierNVMe, TierRemote:
			ok = a == ActionRecompute || (a == ActionLoad && c.configured[b.Tier])
		}
		if !ok {
			return 0, fmt.Errorf("planner: block %d in tier %s cannot take action %s", i, b.Tier, a)
		}
	}
	if len(blocks) == 0 {
		return 0, nil
	}
	r, idle := planRun{}, c.queuedLatency(Backlog{})
	for i, b := range blocks {
		tokens := b.Tokens
		if tokens == 0 {
			tokens = p.cfg.BlockTokens
		}
		r.step(c, actions[i], b, tokens, &idle)
	}
	return r.time(c, 0), nil
}
