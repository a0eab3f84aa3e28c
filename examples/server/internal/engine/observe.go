package engine

import (
	"time"

	"kvtier.dev/kvtier"
)

// Observer learns from what the engine measures: the server's cost-model
// calibration (kvtier/cost.Calibration, through an adapter in package main)
// so that its planner prices prefills and loads as this GPU does them. The
// engine calls it from its scheduler goroutine: it MUST NOT block.
//
// Only clean measurements are reported, so that the fit sees what its
// terms mean: a pass that waited for no load, and a load whose completion
// the engine saw as it happened.
type Observer interface {
	// Pass reports one forward pass that computed tokens positions after
	// prefix positions already present (a contiguous suffix: no hole, no
	// recomputed head behind a loaded tail) and waited for no load, in d
	// of wall time: plan upload, kernels and the logits' read-back.
	Pass(prefix, tokens int, d time.Duration)
	// Load reports one onboard of bytes of KV, every block from tier, that
	// took d from Onboard until its last layer was on the GPU, with no
	// other onboard queued before it.
	Load(tier kvtier.Tier, bytes int64, d time.Duration)
}

// minObservedWait is how long the wait for the last layer must have blocked
// for its return to mark the load's completion: a shorter wait found the
// load already done, at a moment the engine did not see.
const minObservedWait = 20 * time.Microsecond

// loadClock times one attempt's onboard for the Observer.
type loadClock struct {
	onboard time.Time // when Onboard was called
	done    time.Time // when the last layer's wait returned, if it blocked
	tier    kvtier.Tier
	bytes   int64
	mixed   bool // blocks came from more than one tier
	split   bool // submitted in more than one Onboard, a wait for GPU slots between
	// watch, when set, is closed by the goroutine that watches the last
	// layer's events under LayerWaitDevice (watchLoad); watching says it
	// started.
	watch    chan struct{}
	watching bool
}

// wait wraps the last layer's wait: it records its return when it blocked.
func (lc *loadClock) wait(f func() error) error {
	t0 := time.Now()
	err := f()
	if t1 := time.Now(); err == nil && t1.Sub(t0) >= minObservedWait {
		lc.done = t1
	}
	return err
}

// add counts one loading block of tier.
func (lc *loadClock) add(tier kvtier.Tier, bytes int64) {
	if lc.bytes > 0 && tier != lc.tier {
		lc.mixed = true
	}
	lc.tier = tier
	lc.bytes += bytes
}

// report tells o the load's time, when it was seen.
func (lc *loadClock) report(o Observer) {
	if o == nil || lc.bytes == 0 || lc.mixed || lc.split || lc.done.IsZero() {
		return
	}
	o.Load(lc.tier, lc.bytes, lc.done.Sub(lc.onboard))
}

// suffixStart returns the first computed block when the computed blocks
// are exactly a suffix of the full blocks (every block from it on is
// computed, none before), and false otherwise.
func suffixStart(compute []bool) (int, bool) {
	k := len(compute)
	for k > 0 && compute[k-1] {
		k--
	}
	for _, c := range compute[:k] {
		if c {
			return 0, false
		}
	}
	return k, true
}
