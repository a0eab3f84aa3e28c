package engine

import (
	"time"

	"kvtier.dev/kvtier"
	"kvtier.dev/kvtier/cost"
)

// Observer learns from what the engine measures: the server's cost-model
// calibration (kvtier/cost.Calibration, through an adapter in package main)
// so that its planner prices prefills and loads as this GPU does them. The
// engine calls it from its scheduler goroutine: it MUST NOT block.
//
// Only clean measurements are reported, so that the fit sees what its
// terms mean: a pass whose loads, if any, came from one tier in one
// Onboard and whose end the engine saw, and a load whose completion the
// engine saw as it happened.
type Observer interface {
	// Pass reports one forward pass in the calibration's terms (its Model,
	// TP and LoadLink are the observer's to fill): s.Tokens positions
	// computed with s.Prefix present (s.PrefixPairs when not one run
	// after them), in s.Seconds of wall time: plan upload, kernels and the
	// logits' read-back. With s.LoadBytes set its loads, all from tier
	// from, were in flight from s.LoadStartSeconds to s.LoadEndSeconds
	// after the pass began (the start is negative: submitted before it), in
	// s.LoadBlocks blocks.
	Pass(s cost.PrefillSample, from kvtier.Tier)
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
	blocks  int
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
	lc.blocks++
}

// report tells o the load's time, when it was seen.
func (lc *loadClock) report(o Observer) {
	if o == nil || lc.bytes == 0 || lc.mixed || lc.split || lc.done.IsZero() {
		return
	}
	o.Load(lc.tier, lc.bytes, lc.done.Sub(lc.onboard))
}

// passSample is a pass's sample for the Observer: the positions it
// computed (compute[b] per full block of bt tokens, then the rest up to
// n), the tokens present, the pairs between them, and its loads as lc
// timed them from start. false: its loads were of several tiers or
// Onboards, or their end was not seen.
func (lc *loadClock) passSample(compute []bool, bt, n int, start time.Time, d time.Duration) (cost.PrefillSample, bool) {
	tokens, present, pairs := passShape(compute, bt, n)
	s := cost.PrefillSample{Prefix: present, Tokens: tokens, Seconds: d.Seconds()}
	if pairs != int64(tokens)*int64(present) {
		if pairs == 0 {
			return s, false // no pair at all: PrefixPairs cannot say it
		}
		s.PrefixPairs = pairs
	}
	if lc.bytes == 0 {
		return s, true
	}
	if lc.mixed || lc.split || lc.done.IsZero() {
		return s, false
	}
	s.LoadBytes, s.LoadBlocks = lc.bytes, lc.blocks
	s.LoadStartSeconds, s.LoadEndSeconds = lc.onboard.Sub(start).Seconds(), lc.done.Sub(start).Seconds()
	return s, true
}

// passShape counts a pass's computed tokens, its present tokens, and the
// pairs of a computed token with a present one before it: compute[b] says
// whether full block b (of bt tokens) is computed; the positions from the
// full blocks' end to n are.
func passShape(compute []bool, bt, n int) (tokens, present int, pairs int64) {
	for _, c := range compute {
		if c {
			tokens += bt
			pairs += int64(bt) * int64(present)
		} else {
			present += bt
		}
	}
	tail := n - len(compute)*bt
	return tokens + tail, present, pairs + int64(tail)*int64(present)
}
