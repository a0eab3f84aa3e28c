package cost

import "math"

// cut is a plan in the search's terms: recompute the first j[t] blocks of
// each loadable tier t, load the others; missing blocks are always
// recomputed. Among blocks of one tier, loads cost the same and a later
// block's recompute costs more (it attends to more context), so the best
// plan recomputes a head of each tier. t is its pass's time (pass.go) at
// charged costs, behind the queues; q[t] is the position of tier t's
// first loaded block (B when none), set by search.
type cut struct {
	j, q [NumTiers]int
	t    float64
}

// queue is a Backlog in seconds.
type queue struct{ link, drive, gpu float64 }

// tierCounts counts blocks per tier.
type tierCounts [NumTiers]int32

// action is block i's action in the cut k.
func (c *plannerCosts) action(i int, b BlockSource, k cut) Action {
	switch {
	case b.Tier == TierGPU:
		return ActionNone
	case b.Tier == TierMissing || i < k.q[b.Tier]:
		return ActionRecompute
	}
	return ActionLoad
}

// search finds the best cut for blocks behind the queues: the best single
// cut (every tier cut at one position), then, with several tiers present,
// a coordinate descent over each tier's cut, from it and from each tier
// loaded or recomputed whole. A cut's time depends on how many blocks of
// each tier it loads and what it recomputes, so each costs O(1) from
// forwardPass's prefix sums; each scan is coarse to fine (minimize).
func (p *Planner) search(cs *plannerCosts, blocks []BlockSource, q *queue) cut {
	tiers := p.forwardPass(cs, blocks)
	B := len(blocks)
	best := p.singleCut(cs, B, q)
	if tiers > 1 {
		// A move of one tier's cut alone cannot trade one tier's loads
		// for another's: start from the tiers' extremes too.
		from := best
		best = p.descend(cs, from, q)
		for t := TierHost; t <= TierRemote; t++ {
			if p.tierN[t] == 0 {
				continue
			}
			for _, j := range [2]int{0, p.tierN[t]} {
				k := from
				k.j[t] = j
				k.t = p.cutTime(cs, &k.j, q)
				if d := p.descend(cs, k, q); d.t < best.t {
					best = d
				}
			}
		}
	}
	for t := TierHost; t <= TierRemote; t++ {
		best.q[t] = B
		if best.j[t] < p.tierN[t] {
			best.q[t] = int(p.tierPos[t][best.j[t]])
		}
	}
	return best
}

// forwardPass fills the prefix sums the cuts are priced by: per loadable
// tier, its blocks' positions (tierPos) and the recompute of its first j
// (tierRec, charged); per position, the loadable blocks of each tier
// before it (cnt); the missing blocks' recompute and the tokens on the
// GPU. It returns how many loadable tiers are present.
func (p *Planner) forwardPass(cs *plannerCosts, blocks []BlockSource) (tiers int) {
	p.cnt[0] = tierCounts{}
	p.gpuTokens, p.missing = 0, 0
	p.tierN = [NumTiers]int{}
	for t := TierHost; t <= TierRemote; t++ {
		p.tierRec[t][0] = 0
	}
	for i, b := range blocks {
		t := b.Tier
		c := cs.blockCost(i, b.Tokens, p.cfg.BlockTokens) * cs.chargeC
		p.cnt[i+1] = p.cnt[i]
		switch {
		case t == TierGPU:
			p.gpuTokens += blockTokens(b, p.cfg.BlockTokens)
		case t == TierMissing:
			p.missing += c
		default:
			j := p.tierN[t]
			p.tierPos[t][j] = int32(i)
			p.tierRec[t][j+1] = p.tierRec[t][j] + c
			p.tierN[t]++
			p.cnt[i+1][t]++
		}
	}
	for t := TierHost; t <= TierRemote; t++ {
		if p.tierN[t] > 0 {
			tiers++
		}
	}
	return tiers
}

// blockTokens is b's tokens: a full block's, or a short one's.
func blockTokens(b BlockSource, bt int) int {
	if b.Tokens == 0 {
		return bt
	}
	return b.Tokens
}

// cutTime is the pass's time, at charged costs, of the plan that
// recomputes the first j[t] blocks of each tier t and loads the others.
func (p *Planner) cutTime(cs *plannerCosts, j *[NumTiers]int, q *queue) float64 {
	var n [NumTiers]int
	comp, loaded := p.missing, 0
	for t := TierHost; t <= TierRemote; t++ {
		n[t] = p.tierN[t] - j[t]
		comp += p.tierRec[t][j[t]]
		loaded += n[t]
	}
	pl := cs.loads(&n, q.link, q.drive, true)
	return cs.passEnd(&pl, cs.work(comp, p.gpuTokens+loaded*p.cfg.BlockTokens), q.gpu)
}

// singleCut returns the best single cut of B blocks: recompute every
// non-GPU block before a position, load every loadable one from it on.
func (p *Planner) singleCut(cs *plannerCosts, B int, q *queue) cut {
	var k [NumTiers]int
	at, t := minimize(0, B, func(at int) float64 {
		for t := TierHost; t <= TierRemote; t++ {
			k[t] = int(p.cnt[at][t])
		}
		return p.cutTime(cs, &k, q)
	})
	for t := TierHost; t <= TierRemote; t++ {
		k[t] = int(p.cnt[at][t])
	}
	return cut{j: k, t: t}
}

// descendRounds bounds the coordinate descent: each round scans every
// tier present once.
const descendRounds = 4

// descend is the coordinate descent over the tiers' cuts from best: for
// each tier present in turn, the best cut of that tier with the others
// fixed, until a round improves nothing. Every candidate is a valid plan
// priced exactly, so the result is never worse than where it started.
func (p *Planner) descend(cs *plannerCosts, best cut, q *queue) cut {
	for range descendRounds {
		moved := false
		for t := TierHost; t <= TierRemote; t++ {
			if p.tierN[t] == 0 {
				continue
			}
			k := best.j
			j, tj := minimize(0, p.tierN[t], func(j int) float64 {
				k[t] = j
				return p.cutTime(cs, &k, q)
			})
			if tj < best.t {
				best.j[t], best.t, moved = j, tj, true
			}
		}
		if !moved {
			break
		}
	}
	return best
}

// scanAll is how many candidates minimize tries one by one; past it, it
// tries scanAll evenly spaced, then as many around the best at a finer
// step, until the step is 1.
const scanAll = 64

// minimize returns the x in [lo, hi] where f is least and f(x), ties to
// the smaller x: exact over at most scanAll+1 candidates, coarse to fine
// over more (a plan's time is smooth in a tier's cut but for the kinks
// where the pass's longest path changes, so the finer scans search the
// neighbourhood of the coarse best).
func minimize(lo, hi int, f func(int) float64) (int, float64) {
	bestX, bestT := lo, math.Inf(1)
	for {
		step := max(1, (hi-lo)/scanAll)
		for x := lo; x <= hi; x += step {
			if t := f(x); t < bestT || (t == bestT && x < bestX) {
				bestX, bestT = x, t
			}
		}
		if step == 1 {
			return bestX, bestT
		}
		lo, hi = max(lo, bestX-step), min(hi, bestX+step)
	}
}

// chargedTime prices the cut k's plan from its actions, block by block, at
// charged costs: what cutTime computes from prefix sums.
func (p *Planner) chargedTime(cs *plannerCosts, blocks []BlockSource, k cut, q *queue) float64 {
	var n [NumTiers]int
	comp, present := 0.0, 0
	for i, b := range blocks {
		switch cs.action(i, b, k) {
		case ActionLoad:
			n[b.Tier]++
			present += p.cfg.BlockTokens
		case ActionRecompute:
			comp += cs.blockCost(i, b.Tokens, p.cfg.BlockTokens) * cs.chargeC
		default:
			present += blockTokens(b, p.cfg.BlockTokens)
		}
	}
	pl := cs.loads(&n, q.link, q.drive, true)
	return cs.passEnd(&pl, cs.work(comp, present), q.gpu)
}
