package cost

import "math"

// cut is a plan in the search's terms: recompute every non-GPU block
// before q1; in [q1, q2) load the fast blocks (charged per-block load
// cost at most thr) and recompute the slow ones; from q2 on load
// everything. Missing blocks are always recomputed. A single cut has
// q1 == q2. t is its time under the closed form, at charged costs, with
// no pass cost and no floor.
type cut struct {
	q1, q2 int
	thr, t float64
}

// action is block i's action in the cut k.
func (c *plannerCosts) action(i int, b BlockSource, k cut) Action {
	switch {
	case b.Tier == TierGPU:
		return ActionNone
	case b.Tier == TierMissing || i < k.q1 || (i < k.q2 && c.chargedS[b.Tier] > k.thr):
		return ActionRecompute
	}
	return ActionLoad
}

// search finds the best cut for blocks behind the queues, in passes over
// the scratch space: forward, backward, the single cut, and the nested
// cuts when the blocks present load at different costs.
func (p *Planner) search(cs *plannerCosts, blocks []BlockSource, latQ *[NumTiers]float64, gpuQ float64) cut {
	fastS := p.forwardPass(cs, blocks, latQ)
	slow := p.backwardPass(cs, blocks, latQ, fastS)
	best := p.singleCut(len(blocks), fastS, gpuQ)
	if slow {
		best = p.nestedCut(cs, blocks, best, gpuQ)
	}
	return best
}

// forwardPass (pass 1) fills the per-block costs and the prefix sums of
// load time (S) and of the recompute time of every non-GPU block. Costs
// are the charged ones (equal to nominal when the fit is exact). It
// returns each tier's load latency behind the queued copies and the
// cheapest per-block load present.
func (p *Planner) forwardPass(cs *plannerCosts, blocks []BlockSource, latQ *[NumTiers]float64) (fastS float64) {
	p.loadPre[0], p.recPre[0] = 0, 0
	fastS = math.Inf(1)
	for i, b := range blocks {
		t := b.Tier
		s := cs.chargedS[t]
		p.blkS[i], p.blkLat[i] = s, latQ[t]
		p.loadPre[i+1] = p.loadPre[i] + s
		c := cs.blockCost(i, b.Tokens, p.cfg.BlockTokens) * cs.chargeC
		p.blkC[i] = c
		if t == TierGPU {
			c = 0
		} else if t.loadable() && s < fastS {
			fastS = s
		}
		p.recPre[i+1] = p.recPre[i] + c
	}
	return fastS
}

// backwardPass (pass 2) fills the suffix arrays. F(x) = S[x] +
// R_missing[x,B) is the value of a path that leaves the load line at x;
// fSuf[x] is its maximum over x' >= x. A path starting at loaded block j
// is lat_j - S[j] + fSuf[j+1]; pathSuf[i] is the longest such path over
// loadable j >= i. It reports whether a block's load is dearer than the
// cheapest present (fastS).
func (p *Planner) backwardPass(cs *plannerCosts, blocks []BlockSource, latQ *[NumTiers]float64, fastS float64) (slow bool) {
	B := len(blocks)
	negInf := math.Inf(-1)
	p.missSuf[B] = 0
	p.pathSuf[B] = negInf
	p.fSuf[B] = p.loadPre[B] // F(B): every load done
	p.hand[B] = 0
	for i := B - 1; i >= 0; i-- {
		t := blocks[i].Tier
		m := p.missSuf[i+1]
		if t == TierMissing {
			m += p.blkC[i]
		}
		p.missSuf[i] = m
		best := p.pathSuf[i+1]
		if t.loadable() {
			if v := latQ[t] - p.loadPre[i] + p.fSuf[i+1]; v > best {
				best = v
			}
			slow = slow || cs.chargedS[t] > fastS
		}
		p.pathSuf[i] = best
		p.hand[i] = p.fSuf[i+1] - p.loadPre[i]
		f := p.loadPre[i] + m
		if g := p.fSuf[i+1]; g > f {
			f = g
		}
		p.fSuf[i] = f
	}
	return slow
}

// singleCut (pass 3) returns the best single cut of B blocks: T(q) =
// max(all recompute, longest load-started path), for every cut q. Ties go
// to the smaller q: less GPU work.
func (p *Planner) singleCut(B int, fastS, gpuQ float64) cut {
	best := cut{thr: fastS, t: math.Inf(1)}
	for q := 0; q <= B; q++ {
		tq := gpuQ + p.recPre[q] + p.missSuf[q]
		if v := p.pathSuf[q]; v > tq {
			tq = v
		}
		if tq < best.t {
			best.q1, best.q2, best.t = q, q, tq
		}
	}
	return best
}

// nestedCut improves on the best single cut with nested cuts, which also
// recompute the slow blocks in [q1, q2) while the fast ones there load:
// for each way to split the tiers present into fast and slow by load cost
// (splits), a coordinate descent (descend).
func (p *Planner) nestedCut(cs *plannerCosts, blocks []BlockSource, single cut, gpuQ float64) cut {
	best := single
	thrs, n := splits(cs, blocks)
	for _, thr := range thrs[:n] {
		best = p.descend(blocks, single.q1, thr, gpuQ, best)
	}
	return best
}

// splits returns the thresholds that split the loadable tiers present
// into fast and slow: each present tier's charged per-block load cost
// below the dearest's, once (at most two with three loadable tiers).
func splits(cs *plannerCosts, blocks []BlockSource) (thrs [NumTiers]float64, n int) {
	var present [NumTiers]bool
	for _, b := range blocks {
		present[b.Tier] = true
	}
	maxS := 0.0
	for t := TierHost; t <= TierRemote; t++ {
		if present[t] && cs.chargedS[t] > maxS {
			maxS = cs.chargedS[t]
		}
	}
tiers:
	for t := TierHost; t <= TierRemote; t++ {
		st := cs.chargedS[t]
		if !present[t] || st >= maxS {
			continue // absent, or splits nothing off
		}
		for _, done := range thrs[:n] {
			if done == st {
				continue tiers
			}
		}
		thrs[n] = st
		n++
	}
	return thrs, n
}

// descend is the coordinate descent over (q1, q2) for the split thr, from
// q1 = 0 and from q1 = single (the best single cut): best q2 for q1, best
// q1 for that q2, best q2 again. It returns the best of best and the cuts
// it meets. Every candidate is a valid plan whose time is exact, so the
// result is never worse than the single cut.
func (p *Planner) descend(blocks []BlockSource, single int, thr, gpuQ float64, best cut) cut {
	for _, start := range [2]int{0, single} {
		q2, t2 := p.scanQ2(blocks, start, thr, gpuQ)
		q1, t1 := p.scanQ1(blocks, q2, thr, gpuQ)
		q2b, t3 := q2, t2
		if q1 != start {
			q2b, t3 = p.scanQ2(blocks, q1, thr, gpuQ)
		}
		for _, c := range [3]cut{{start, q2, thr, t2}, {q1, q2, thr, t1}, {q1, q2b, thr, t3}} {
			if c.t < best.t {
				best = c
			}
		}
		if single == 0 {
			break
		}
	}
	return best
}

// simulateCut runs the cut k through the recurrences, at charged or
// nominal costs, behind the queues, and returns the longest path (no pass
// cost, no floor).
func (p *Planner) simulateCut(c *plannerCosts, blocks []BlockSource, k cut, latQ *[NumTiers]float64, gpuQ float64, charged bool) float64 {
	loadDone, computeDone, end := 0.0, gpuQ, 0.0
	for i, b := range blocks {
		switch c.action(i, b, k) {
		case ActionLoad:
			s := c.loadS[b.Tier]
			if charged {
				s = c.chargedS[b.Tier]
			}
			loadDone = max(loadDone, latQ[b.Tier]) + s
			end = math.Max(end, loadDone)
		case ActionRecompute:
			cost := c.blockCost(i, b.Tokens, p.cfg.BlockTokens)
			if charged {
				cost *= c.chargeC
			}
			computeDone = math.Max(computeDone, loadDone) + cost
			end = math.Max(end, computeDone)
		}
	}
	return end
}

// A cut's time, from backwardPass's arrays:
//
//	T = max( Rtot,
//	         max over x in (q1, q2] of E(x) + R_missing[x,B) + Cslow[x, q2),
//	         E(q2) - S[q2] + fSuf[q2+1],  pathSuf[q2] )
//
// where E(x) is when the fast loads in [q1, x) finish (the load recurrence
// over them alone) and Cslow sums the recompute of slow blocks. scanQ2 finds
// the best q2 for a q1 and scanQ1 the best q1 for a q2, each in O(B).

// scanQ2 returns the best q2 in [q1, B] and its time.
func (p *Planner) scanQ2(blocks []BlockSource, q1 int, thr, gpuQ float64) (int, float64) {
	B := len(blocks)
	negInf := math.Inf(-1)
	base := gpuQ + p.recPre[q1] + p.missSuf[q1] // Rtot without the slow blocks in [q1, q2)
	e := negInf                                 // E(x): no fast load yet
	m1 := negInf                                // max of E(x) + R_missing[x,B) - Cslow[q1, x)
	cslow := 0.0                                // Cslow[q1, q2)
	blkS, blkLat, rec := p.blkS[:B], p.blkLat[:B], p.blkC[:B]
	missSuf, pathSuf, hand := p.missSuf[:B+1], p.pathSuf[:B+1], p.hand[:B+1]
	bestQ2, bestT := q1, math.Inf(1)
	for q2 := q1; q2 <= B; q2++ {
		if q2 > q1 {
			// Block q2-1 joins [q1, q2).
			i := q2 - 1
			if s := blkS[i]; s > thr {
				cslow += rec[i]
			} else if s > 0 {
				if l := blkLat[i]; e < l {
					e = l
				}
				e += s
			}
			if v := e + missSuf[q2] - cslow; v > m1 {
				m1 = v
			}
		}
		tq := base + cslow
		if v := m1 + cslow; v > tq {
			tq = v
		}
		if v := e + hand[q2]; v > tq {
			tq = v
		}
		if v := pathSuf[q2]; v > tq {
			tq = v
		}
		if tq < bestT {
			bestQ2, bestT = q2, tq
		}
	}
	return bestQ2, bestT
}

// scanQ1 returns the best q1 in [0, q2] and its time. It walks q1 down
// from q2, keeping U = Sfast[q1, q2) and V = Cslow[q1, q2), so that a fast
// load at j that hands over to recompute at x has length
// lat_j + U(j) - U(x) + R_missing[x,B) + V(x).
func (p *Planner) scanQ1(blocks []BlockSource, q2 int, thr, gpuQ float64) (int, float64) {
	B := len(blocks)
	negInf := math.Inf(-1)
	u, v := 0.0, 0.0
	h := negInf  // max over x in (q1, q2] of -U(x) + R_missing[x,B) + V(x)
	a1 := negInf // max over fast j in [q1, q2) of lat_j + U(j) + h(j)
	a2 := negInf // max over fast j in [q1, q2) of lat_j + U(j), i.e. E(q2)
	bestQ1 := q2
	bestT := gpuQ + p.recPre[q2] + p.missSuf[q2]
	if w := p.pathSuf[q2]; w > bestT {
		bestT = w
	}
	blkS, blkLat, rec := p.blkS[:B], p.blkLat[:B], p.blkC[:B]
	missSuf, recPre := p.missSuf[:B+1], p.recPre[:B+1]
	// The paths that reach q2 on the load line continue the same way for
	// every q1: fold them into one constant.
	after, hand := p.pathSuf[q2], p.hand[q2]
	for i := q2 - 1; i >= 0; i-- {
		if w := -u + missSuf[i+1] + v; w > h {
			h = w
		}
		if s := blkS[i]; s > thr {
			v += rec[i]
		} else if s > 0 {
			u += s
			l := blkLat[i]
			if w := l + u + h; w > a1 {
				a1 = w
			}
			if w := l + u; w > a2 {
				a2 = w
			}
		}
		tq := gpuQ + recPre[i] + missSuf[i] + v
		if a1 > tq {
			tq = a1
		}
		if w := a2 + hand; w > tq {
			tq = w
		}
		if after > tq {
			tq = after
		}
		if tq <= bestT {
			bestQ1, bestT = i, tq
		}
	}
	return bestQ1, bestT
}
