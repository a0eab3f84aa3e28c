package cost

import "time"

// A plan runs as one forward pass over the positions it computes, layer by
// layer: before layer l the pass waits until layer l of every block it
// loads is on the GPU, so loads and compute overlap a layer apart
// (docs/cost.md, "The pass"). This file prices that pass.

// tierPass is how one tier's loads cross into the GPU during a pass, in
// seconds: the copy engine copies a pass's loads of one tier as one
// onboard, layer by layer (one copy call per layer, a descriptor per block
// and layer, an event per layer); a tier behind a source hop (a drive, a
// NIC) is read whole block by block first, into staging.
type tierPass struct {
	in, inCharged   float64 // a block's time on the ingress (its decode when slower)
	src, srcCharged float64 // a block's read over the source hop; 0 without one
	srcLat          float64 // the source hop's latency, once
	call            float64 // the ingress's copy call, once per layer (Link.Latency)
	desc            float64 // per block and layer (Link.DescriptorCost)
	event           float64 // per layer (Link.EventCost)
	pipelined       bool    // the ingress copies what the source has read while it reads on
	// A compressed tier's decode of a block, and the blocks of a chunk:
	// an onboard of k blocks is issued a chunk at a time (onboardLayer)
	// and lands the decode of its last chunk, min(k, chunk) blocks, after
	// its copies (tail). chunk 0: no codec.
	decode float64
	chunk  int
	// whole: the onboard's layers all land at its end, as a compressed
	// tier's do (the copy engine decodes whole blocks; transfer.Config.
	// CodecLayerGroups 1, its default), not layer after layer.
	whole bool
}

// layerLine is when a group of loads' layers land: layer l at
// a + (l+1)·u. A staged tier's onboards are summed up in one line through
// the latest of their first and of their last layers: the pass's end
// depends on those alone (passEnd), and between them it is no later than
// theirs.
type layerLine struct{ a, u float64 }

// passLoads is when each layer of a pass's loads lands, relative to now:
// the latest of its lines (at most one per tier).
type passLoads struct {
	lines      [NumTiers]layerLine
	n          int
	ingressEnd float64 // the ingress has copied every layer of them
	busy       float64 // the ingress's time copying them (PrefillCost.LoadedSeconds)
}

func (pl *passLoads) add(a, u float64) {
	pl.lines[pl.n] = layerLine{a, u}
	pl.n++
}

// tail is the decode of the last chunk of an onboard of k blocks, after
// its copies (0 without a codec).
func (tp *tierPass) tail(k int) float64 { return float64(min(k, tp.chunk)) * tp.decode }

// land adds the line of an onboard of k blocks that starts at start and
// copies a layer in u: layer l lands at start + (l+1)·u, or, whole, every
// layer at start + L·u; a compressed tier's after its last chunk's decode.
func (tp *tierPass) land(pl *passLoads, k int, start, u, L float64) {
	if tp.whole {
		pl.add(start+L*u+tp.tail(k), 0)
		return
	}
	pl.add(start+tp.tail(k), u)
}

// onboardLayer is the ingress's time for one layer of k blocks of tier
// tp: a copy call, a descriptor and the layer's bytes per block, and an
// event. A compressed tier's onboard is not issued layer by layer but a
// chunk at a time (transfer's codec path: a copy call and an event a
// chunk, a descriptor a block): its time is spread over the layers.
func (tp *tierPass) onboardLayer(k int, perBlock float64, layers float64) float64 {
	if tp.chunk > 0 {
		chunks := float64((k + tp.chunk - 1) / tp.chunk)
		return (chunks*(tp.call+tp.event) + float64(k)*(tp.desc+perBlock)) / layers
	}
	return tp.call + float64(k)*(tp.desc+perBlock/layers) + tp.event
}

// loads prices n[t] loads per tier in one pass, behind the ingress's
// backlog link and the drive's drive (seconds), at charged or nominal
// costs. The ingress copies the tiers in order (host, NVMe, remote), each
// as one onboard but a tier behind a source, which is read block by block
// into staging and copied as the copy engine's staged onboards copy it
// (staged).
func (c *plannerCosts) loads(n *[NumTiers]int, link, drive float64, charged bool) passLoads {
	var pl passLoads
	L := c.layers
	free := link
	for t := TierHost; t <= TierRemote; t++ {
		k := n[t]
		if k <= 0 || !c.configured[t] {
			continue
		}
		tp := &c.pass[t]
		in, src := tp.in, tp.src
		if charged {
			in, src = tp.inCharged, tp.srcCharged
		}
		if src == 0 {
			uk := tp.onboardLayer(k, in, L)
			tp.land(&pl, k, free, uk, L)
			free += L * uk
			pl.busy += L * uk
			continue
		}
		d0 := tp.srcLat
		if t == TierNVMe {
			d0 += drive
		}
		if !tp.pipelined {
			uk := tp.onboardLayer(k, in, L)
			start := max(free, d0+float64(k)*src)
			tp.land(&pl, k, start, uk, L)
			free = start + L*uk
			pl.busy += L * uk
			continue
		}
		var first, last, busy float64
		first, last, free, busy = tp.staged(k, in, src, d0, free, L)
		pl.busy += busy
		u := 0.0
		if L > 1 {
			u = (last - first) / (L - 1)
		}
		// The staged onboards' sizes are not kept: the tail is of a
		// chunk's, or of k blocks', whichever is fewer.
		if tp.whole {
			pl.add(last+tp.tail(k), 0)
		} else {
			pl.add(first-u+tp.tail(k), u)
		}
	}
	pl.ingressEnd = free
	return pl
}

// staged prices k blocks read one after another from d0, src each, and
// copied to the GPU as the copy engine's staged onboards copy them: the
// first read goes alone, once the ingress is free; the blocks read while
// an onboard copies go together in the next when it is done. It returns
// the latest landing of a first layer and of a last layer among the
// onboards, and when the ingress is free again. Once the ingress is idle
// before each next read and one block's onboard is shorter than a read,
// every block left goes alone as it is read: only the last counts.
func (tp *tierPass) staged(k int, in, src, d0, free, L float64) (first, last, end, busy float64) {
	read := func(j int) float64 { return d0 + float64(j+1)*src }
	one := L * tp.onboardLayer(1, in, L)
	i, at := 0, read(0)
	for i < k {
		if read(i) >= free && one <= src {
			s := read(k - 1)
			u := tp.onboardLayer(1, in, L)
			first, last = max(first, s+u), max(last, s+L*u)
			return first, last, s + one, busy + float64(k-i)*one
		}
		at = max(at, read(i))
		m := min(k, int((at-d0)/src*(1+1e-12))) - i // the blocks read by then
		m = max(1, m)
		s := max(free, at)
		u := tp.onboardLayer(m, in, L)
		first, last = max(first, s+u), max(last, s+L*u)
		free = s + L*u
		busy += L * u
		at, i = free, i+m
	}
	return first, last, free, busy
}

// landed is when layer l of every load has landed (0 with no loads).
func (pl *passLoads) landed(l int) float64 {
	t := 0.0
	for _, ln := range pl.lines[:pl.n] {
		t = max(t, ln.a+float64(l+1)*ln.u)
	}
	return t
}

// passEnd is passEnd for these costs, the pass ending later as its loads
// copy meanwhile (PrefillCost.SlowdownSeconds), which they do from when it
// starts, gpuQ, until their last layer lands, for pl.busy at most.
func (c *plannerCosts) passEnd(pl *passLoads, work, gpuQ float64) float64 {
	return slowedPassEnd(pl, work, c.layers, gpuQ, &c.prefill)
}

// slowedPassEnd is passEnd plus the slowdown pc prices for pl's copies
// overlapping the pass.
func slowedPassEnd(pl *passLoads, work, layers, gpuQ float64, pc *PrefillCost) float64 {
	end := passEnd(pl, work, layers, gpuQ)
	if pl.n > 0 {
		end += pc.SlowdownSeconds(work, min(pl.busy, pl.landed(int(layers)-1)-gpuQ))
	}
	return end
}

// passEnd is when a pass of work seconds of compute (its floor and its own
// cost included), spread evenly over its layers, ends: layer l starts once
// layer l-1 is done and layer l of the loads has landed, the first no
// sooner than gpuQ. Each line is linear in l, so the longest path leaves it
// at the first layer or the last.
func passEnd(pl *passLoads, work, layers, gpuQ float64) float64 {
	c := work / layers
	end := gpuQ + work
	for _, ln := range pl.lines[:pl.n] {
		end = max(end, ln.a+ln.u+work, ln.a+layers*ln.u+c)
	}
	return end
}

// PassLoads is when the layers of a pass's loads land, from the moment
// they are submitted: the Planner's model of the copy engine, for a
// replay that executes it (kvtier/replay's modelled channels).
type PassLoads struct {
	pl     passLoads
	layers int
}

// PassLoads prices n[t] loads per tier submitted now, behind q's ingress
// and drive backlogs, as Plan prices them (nominal costs).
func (p *Planner) PassLoads(n [NumTiers]int, q Backlog) PassLoads {
	c := p.costs.Load()
	return PassLoads{pl: c.loads(&n, q.Link.Seconds(), q.Drive.Seconds(), false), layers: p.cfg.Model.Layers}
}

// Layers is the model's layer count.
func (pl *PassLoads) Layers() int { return pl.layers }

// LayerLanded is when layer l of every load has landed.
func (pl *PassLoads) LayerLanded(l int) time.Duration { return seconds(pl.pl.landed(l)) }

// Landed is when every layer of every load has landed.
func (pl *PassLoads) Landed() time.Duration { return pl.LayerLanded(pl.layers - 1) }

// Busy is the ingress's time copying them, the loads' share of
// IngressEnd: what slows their pass (cost.PrefillCost.LoadedTime).
func (pl *PassLoads) Busy() time.Duration { return seconds(pl.pl.busy) }

// IngressEnd is when the ingress has copied them: what a later load waits
// behind.
func (pl *PassLoads) IngressEnd() time.Duration { return seconds(pl.pl.ingressEnd) }

// work is a pass's compute: the recompute's seconds, the pass's cost and
// its read of the present tokens, no less than the floor.
func (c *plannerCosts) work(compute float64, present int) float64 {
	return max(c.prefill.FloorSeconds, c.prefill.PassEndSeconds(present)+compute)
}
