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
	tail            float64 // a compressed tier's decode of its last chunk
	pipelined       bool    // the ingress copies what the source has read while it reads on
}

// layerLine is a layer's landing time that grows by u per layer: layer l
// lands at a + (l+1)·u.
type layerLine struct{ a, u float64 }

// passLoads is when each layer of a pass's loads lands, relative to now:
// the latest of its lines (at most two per tier).
type passLoads struct {
	lines      [2 * NumTiers]layerLine
	n          int
	ingressEnd float64 // the ingress has copied every layer of them
}

func (pl *passLoads) add(a, u float64) {
	pl.lines[pl.n] = layerLine{a, u}
	pl.n++
}

// onboardLayer is the ingress's time for layer l of k blocks of tier tp:
// a copy call, a descriptor and the layer's bytes per block, and an event.
func (tp *tierPass) onboardLayer(k int, perBlock float64, layers float64) float64 {
	return tp.call + float64(k)*(tp.desc+perBlock/layers) + tp.event
}

// loads prices n[t] loads per tier in one pass, behind the ingress's
// backlog link and the drive's drive (seconds), at charged or nominal
// costs. The ingress copies the tiers in order (host, NVMe, remote); a
// tier behind a source is read block by block, and its onboards start
// once its first block is read and the ingress is free: its layer l lands
// no sooner than the last block's read plus l+1 layers of one block's
// onboard, nor than l+1 layers of an onboard of all of them after the
// first read (the copy engine's staged onboards between those).
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
		uk := tp.onboardLayer(k, in, L)
		if src == 0 {
			pl.add(free+tp.tail, uk)
			free += L * uk
			continue
		}
		d0 := tp.srcLat
		if t == TierNVMe {
			d0 += drive
		}
		first, all := d0+src, d0+float64(k)*src
		if !tp.pipelined {
			start := max(free, all)
			pl.add(start+tp.tail, uk)
			free = start + L*uk
			continue
		}
		u1 := tp.onboardLayer(1, in, L)
		start := max(free, first)
		pl.add(all+tp.tail, u1)
		pl.add(start+tp.tail, uk)
		free = max(all+L*u1, start+L*uk)
	}
	pl.ingressEnd = free
	return pl
}

// landed is when layer l of every load has landed (0 with no loads).
func (pl *passLoads) landed(l int) float64 {
	t := 0.0
	for _, ln := range pl.lines[:pl.n] {
		t = max(t, ln.a+float64(l+1)*ln.u)
	}
	return t
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

// IngressEnd is when the ingress has copied them: what a later load waits
// behind.
func (pl *PassLoads) IngressEnd() time.Duration { return seconds(pl.pl.ingressEnd) }

// work is a pass's compute: the recompute's seconds, the pass's cost and
// its read of the present tokens, no less than the floor.
func (c *plannerCosts) work(compute float64, present int) float64 {
	return max(c.prefill.FloorSeconds, c.prefill.PassEndSeconds(present)+compute)
}
