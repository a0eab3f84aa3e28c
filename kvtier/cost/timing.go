package cost

import (
	"fmt"
	"time"
)

// planRun prices one plan as it runs, at nominal costs: its loads per
// tier, and its recomputed blocks in token order, each by
// PrefillCost.BlockSeconds (its pairs with the blocks recomputed before it
// at the attention rate, with the blocks present at the prefix rate); the
// pass then costs that, its own cost and its read of the tokens present,
// no less than the floor (plannerCosts.work), layer by layer behind the
// loads (passEnd).
type planRun struct {
	n                 [NumTiers]int
	compute           float64
	computed, present int // tokens before the next block
}

func (r *planRun) load(t Tier, tokens int) {
	r.n[t]++
	r.present += tokens
}

func (r *planRun) recompute(pc *PrefillCost, tokens int) {
	r.compute += pc.BlockSeconds(tokens, r.computed, r.present)
	r.computed += tokens
}

func (r *planRun) step(c *plannerCosts, a Action, b BlockSource, tokens int) {
	switch a {
	case ActionLoad:
		r.load(b.Tier, tokens)
	case ActionRecompute:
		r.recompute(&c.prefill, tokens)
	default:
		r.present += tokens
	}
}

func (r *planRun) time(c *plannerCosts, q *queue) time.Duration {
	pl := c.loads(&r.n, q.link, q.drive, false)
	return seconds(c.passEnd(&pl, c.work(r.compute, r.present), q.gpu))
}

// exactTimes runs, in one pass over the blocks, the plan of the cut k, the
// plan that loads every cached block and the one that recomputes every
// block not on the GPU (planRun), and returns their times from now.
func (p *Planner) exactTimes(c *plannerCosts, blocks []BlockSource, k cut, q *queue) (plan, loadAll, recomputeAll time.Duration) {
	bt := p.cfg.BlockTokens
	var pl, la, ra planRun
	for i, b := range blocks {
		tokens := blockTokens(b, bt)
		pl.step(c, c.action(i, b, k), b, tokens)
		switch {
		case b.Tier == TierGPU:
			la.present += tokens
			ra.present += tokens
		case b.Tier == TierMissing:
			la.recompute(&c.prefill, tokens)
			ra.recompute(&c.prefill, tokens)
		default:
			la.load(b.Tier, tokens)
			ra.recompute(&c.prefill, tokens)
		}
	}
	return pl.time(c, q), la.time(c, q), ra.time(c, q)
}

// Simulate is a plan's time on an idle link and GPU, as the pass runs it.
// It refuses an action its block cannot take.
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
	var r planRun
	for i, b := range blocks {
		r.step(c, actions[i], b, blockTokens(b, p.cfg.BlockTokens))
	}
	return r.time(c, &queue{}), nil
}
