package cost

import (
	"cmp"
	"slices"
)

// A pass runs slower while loads copy into the GPU: measured on the H200
// (benchmarks/results/layerwait-h200.md) a pass with 1.63 GB loading
// meanwhile took 105 ms against 99.6 ms with the prefix already present,
// and the served passes with host loads ran 5-15% past the pass model
// (serve-fidelity-h200-run5), whether their compute or their loads set
// the end. PrefillFit.LoadSlowdown prices it: a pass of work seconds whose
// own loads copy for overlap seconds of it ends LoadSlowdown × min(work,
// overlap) later than the pass model (passEnd) says
// (PrefillCost.SlowdownSeconds).
//
// The Calibration learns it from the passes the server reports with loads
// in flight (PrefillSample.LoadBytes): each is priced as the Planner prices
// it, its compute by the other terms (which learn only from passes without
// loads) and its loads by the link's fit from when they were submitted;
// what it took beyond that, over the time its loads overlapped it, is one
// estimate. The fit is their median, each weighted by its overlap (a long
// overlap says more than a short one).

// MaxLoadedSamples bounds the passes with loads a Calibration keeps.
const MaxLoadedSamples = 128

// The slowdown's fit: it keeps the prior until minSlowdownSamples passes
// qualify. A pass qualifies when its loads overlapped at least
// minOverlapShare of its compute, and they took at most maxLoadStretch
// times what they are priced at (longer, they waited behind other copies,
// which the sample does not see).
const (
	minSlowdownSamples = 8
	minOverlapShare    = 0.1
	maxLoadStretch     = 2.0
	maxLoadSlowdown    = 2.0
)

// weighted is one estimate and its weight.
type weighted struct{ v, w float64 }

func checkLoads(s PrefillSample) error {
	switch {
	case s.LoadBytes < 0 || s.LoadBytes > 1<<50:
		return fieldErr("load_bytes", s.LoadBytes, "must be between 0 (no loads) and 2^50")
	case s.LoadBytes == 0 && (s.LoadBlocks != 0 || s.LoadLink != "" || s.LoadStartSeconds != 0 || s.LoadEndSeconds != 0 || s.LoadWhole):
		return fieldErr("load_bytes", s.LoadBytes, "is 0, but load_blocks, load_link, load_start_s, load_end_s or load_whole is set")
	case s.LoadBytes == 0:
		return nil
	case s.LoadBlocks < 1 || int64(s.LoadBlocks) > s.LoadBytes:
		return fieldErr("load_blocks", s.LoadBlocks, "must be between 1 and load_bytes (%d)", s.LoadBytes)
	case s.LoadLink == "":
		return fieldErr("load_link", s.LoadLink, "a pass with loads names the link they crossed")
	case !(s.LoadStartSeconds >= -1e6) || s.LoadStartSeconds > 1e6:
		return fieldErr("load_start_s", s.LoadStartSeconds, "must be between -1e6 and 1e6")
	case !(s.LoadEndSeconds >= s.LoadStartSeconds) || s.LoadEndSeconds > 1e6:
		return fieldErr("load_end_s", s.LoadEndSeconds, "must be between load_start_s (%g) and 1e6", s.LoadStartSeconds)
	}
	return nil
}

// loadSlowdownLocked fits LoadSlowdown to the loaded passes under θ: the
// prior's value until enough passes qualify.
func (c *Calibration) loadSlowdownLocked(theta *[maxTerms]float64) (float64, int) {
	est := c.slowdowns[:0]
	c.loaded.each(func(e *prefillEntry) {
		if g, w, ok := c.slowdownOf(e, theta); ok {
			est = append(est, weighted{g, w})
		}
	})
	c.slowdowns = est
	if len(est) < minSlowdownSamples {
		return c.priorSlowdown, 0
	}
	return min(maxLoadSlowdown, max(0, weightedMedian(est))), len(est)
}

// wholeLoadChunkBlocks is the blocks a LoadWhole sample's onboard issued
// at a time: the codec path's chunk (transfer.DefaultCodecChunkBlocks,
// the fp8-e4m3 preset's ChunkBlocks).
const wholeLoadChunkBlocks = 8

// slowdownOf is e's estimate of the slowdown and its weight (the seconds
// its loads overlapped it), when it qualifies: its pass priced as the
// Planner prices it from its start, its loads one onboard over the link's
// fit submitted at LoadStartSeconds, its layers landing one after another
// or, LoadWhole, all at its end.
func (c *Calibration) slowdownOf(e *prefillEntry, theta *[maxTerms]float64) (g, w float64, ok bool) {
	s := &e.s
	ls := c.links.find(s.LoadLink)
	if ls == nil || e.layers < 1 {
		return 0, 0, false
	}
	link := ls.prior // its descriptor and event costs
	link.BandwidthBytesPerS, link.Latency = ls.fit.BandwidthBytesPerS, seconds(ls.fit.LatencySeconds)
	path := DirectPath(link)
	tp := passCosts(&path, float64(s.LoadBytes)/float64(s.LoadBlocks), 0)
	if s.LoadWhole { // issued as whole blocks, a chunk at a time
		tp.chunk = wholeLoadChunkBlocks
	}
	layers := float64(e.layers)
	var pl passLoads
	u := tp.onboardLayer(s.LoadBlocks, tp.in, layers)
	if s.LoadWhole {
		pl.add(s.LoadStartSeconds+layers*u, 0) // every layer at the end
	} else {
		pl.add(s.LoadStartSeconds, u)
	}
	pl.busy = layers * u
	if s.LoadEndSeconds-s.LoadStartSeconds > maxLoadStretch*pl.busy {
		return 0, 0, false
	}
	work := dot(&e.row.x, theta)
	overlap := min(work, pl.busy, pl.landed(e.layers-1))
	if overlap < minOverlapShare*work {
		return 0, 0, false
	}
	return (s.Seconds - passEnd(&pl, work, layers, 0)) / overlap, overlap, true
}

// weightedMedian is the value at half the total weight. It sorts est.
func weightedMedian(est []weighted) float64 {
	slices.SortFunc(est, func(a, b weighted) int { return cmp.Compare(a.v, b.v) })
	total := 0.0
	for _, e := range est {
		total += e.w
	}
	acc := 0.0
	for _, e := range est {
		acc += e.w
		if acc >= total/2 {
			return e.v
		}
	}
	return est[len(est)-1].v
}
