package replay

import "time"

// Decode on the GPU (Config.DecodeOnGPU): the model server's scheduler
// (examples/server/internal/engine, Engine.run). One GPU prefills queued
// requests one at a time in arrival order and, between two prefills, runs
// a decode round: one step of every request decoding, back to back, in the
// order they started (the server's forward pass takes one sequence). The
// scheduler's loop is
//
//	for {
//		if a request is queued, fewer than MaxBatch decode and it fits {
//			prefill it; if it has more tokens to generate, it joins the batch
//		}
//		run one step of every request in the batch; those done leave
//		if the batch is empty and nothing is queued, wait for a request
//	}
//
// so a request that arrives during a round waits for the round's end, and
// the request just prefilled takes its first step in the round right after
// its prefill. Here the GPU is in one of three states: prefilling (the
// prefill slot is taken: inPrefill 1), running a round (inRound), or idle.

// mayPrefill reports whether the GPU may start a prefill now, beside the
// prefill slot admit checks: always, unless decode runs on the GPU; then
// not during a round, nor while Config.MaxBatch requests decode.
func (e *engine) mayPrefill() bool {
	return !e.cfg.DecodeOnGPU || (!e.inRound && len(e.decoding) < e.cfg.maxBatch())
}

// prefilledOnGPU goes on once r's prefill has ended and its blocks are
// committed: r joins the batch, or leaves if its first token was its only
// one; then the GPU runs a round if any request is decoding, and otherwise
// starts the next prefill.
func (e *engine) prefilledOnGPU(r *request) {
	if r.outTokens <= 1 {
		e.decodeDone(r)
	} else {
		r.ext.decodeLeft = r.outTokens - 1
		e.decoding = append(e.decoding, r)
		e.res.MaxDecoding = max(e.res.MaxDecoding, int64(len(e.decoding)))
	}
	if len(e.decoding) > 0 {
		e.startRound()
		return
	}
	e.admit()
}

// startRound runs one decode step of every request decoding, back to back,
// each of Config.DecodeTokenTime: a request whose step is its last leaves
// the batch now and ends (decodeDone) when that step does; the round ends
// after the last step (roundDone). The departures are scheduled before the
// round's end, so that at the same instant they come first.
func (e *engine) startRound() {
	if e.inRound || e.inPrefill > 0 || len(e.decoding) == 0 {
		return
	}
	e.inRound = true
	step, at := time.Duration(e.cfg.DecodeTokenTime), e.now
	kept := e.decoding[:0]
	for _, r := range e.decoding {
		at += step
		r.ext.decodeLeft--
		if r.ext.decodeLeft > 0 {
			kept = append(kept, r)
			continue
		}
		e.schedule(event{at: at, kind: evDecodeDone, r: r})
	}
	n := len(e.decoding)
	clear(e.decoding[len(kept):])
	e.decoding = kept
	e.res.DecodeSteps += int64(n)
	e.res.DecodeBusy.Add(at - e.now)
	e.schedule(event{at: at, kind: evRoundDone})
}

// roundDone ends a decode round: the next queued prefill starts if it may,
// or else, while requests decode, the next round.
func (e *engine) roundDone() {
	e.inRound = false
	e.admit()
	e.startRound() // nothing if a prefill started, or nothing decodes
}
