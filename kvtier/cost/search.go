package cost

import (
	"math"
)

// action is block i's action in the nested cut (q1, q2) at threshold thr
// (charged per-block load cost): see scanQ2.
func (c *plannerCosts) action(i int, b BlockSource, q1, q2 int, thr float64) Action {
	switch {
	case b.Tier == TierGPU:
		return ActionNone
	case b.Tier == TierMissing || i < q1 || (i < q2 && c.chargedS[b.Tier] > thr):
		return ActionRecompute
	}
	return ActionLoad
}

// simulateCut runs the plan (q1, q2, thr) through the recurrences, at
// charged or nominal costs, behind the queues, and returns the longest
// path (no pass cost, no floor).
func (p *Planner) simulateCut(c *plannerCosts, blocks []BlockSource, q1, q2 int, thr, linkQ, gpuQ float64, charged bool) float64 {
	loadDone, computeDone, end := 0.0, gpuQ, 0.0
	for i, b := range blocks {
		switch c.action(i, b, q1, q2, thr) {
		case ActionLoad:
			s := c.loadS[b.Tier]
			if charged {
				s = c.chargedS[b.Tier]
			}
			loadDone = max(loadDone, c.latS[b.Tier], linkQ) + s
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

// The nested plan (q1, q2) for a split of the tiers into fast (per-block
// load cost <= thr) and slow: recompute every non-GPU block before q1; in
// [q1, q2) load the fast blocks and recompute the slow ones; from q2 on load
// everything. Missing blocks are always recomputed. Its time, from pass 2's
// arrays:
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
