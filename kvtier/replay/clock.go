package replay

import (
	"fmt"
	"math"
	"time"

	"kvtier.dev/kvtier/trace"
)

// The virtual clock counts int64 nanoseconds: it ends 292 years after the
// trace's zero. Every time the replay adds to it must fit, or the TTFTs it
// reports wrap round to nonsense (even negative). Two checks keep it
// honest: each request is checked as it is read (checkRequestClock), so that
// an arrival, an output length or a decode time too large for the clock is
// an input error naming the field and the line; and every event scheduled
// is checked (clockGuard), so that what the checks per request cannot see
// (time accumulated over queues of requests) is an error, never a wrap.

// addClock returns a+b for non-negative durations, and false when the sum
// does not fit in a time.Duration.
func addClock(a, b time.Duration) (time.Duration, bool) {
	if a < 0 || b < 0 || a > math.MaxInt64-b {
		return 0, false
	}
	return a + b, true
}

// mulClock returns n×d for non-negative n and d, and false when the product
// does not fit in a time.Duration.
func mulClock(n int64, d time.Duration) (time.Duration, bool) {
	if n < 0 || d < 0 {
		return 0, false
	}
	if n != 0 && int64(d) > math.MaxInt64/n {
		return 0, false
	}
	return time.Duration(n) * d, true
}

// checkRequestClock checks that what request tr can add to the clock fits
// after its arrival: its decode (output tokens × Config.DecodeTokenTime),
// its prefill and a load of every block over the slowest link. line is its
// trace line; the error names the field.
func (e *engine) checkRequestClock(tr *trace.Request, name string, line int) error {
	bad := func(field, format string, args ...any) error {
		return &trace.LineError{Name: name, Line: line, Field: field,
			Msg: fmt.Sprintf(format, args...) + ": the replay's virtual clock (int64 nanoseconds, 292 years) would overflow"}
	}
	outField, arrField := "output_tokens", "arrival_us"
	if e.src != nil && e.src.Format() == trace.FormatMooncake {
		outField, arrField = "output_length", "timestamp"
	}
	decode, ok := mulClock(int64(max(0, tr.OutputTokens-1)), time.Duration(e.cfg.DecodeTokenTime))
	if !ok {
		return bad(outField, "%d output tokens × decode_token_time %v", tr.OutputTokens, e.cfg.DecodeTokenTime)
	}
	// A load of every block over the slowest path, its latency included: an
	// upper bound of the copies it waits for.
	var perCopy time.Duration
	for from := range e.copyStream {
		for to := range e.copyStream[from] {
			perCopy = max(perCopy, e.copyLatency[from][to]+e.copyStream[from][to])
		}
	}
	loads, ok := mulClock(int64(len(tr.Keys)), perCopy)
	work := decode
	if ok {
		work, ok = addClock(work, loads)
	}
	if ok && e.bt > 0 {
		work, ok = addClock(work, e.scen.RecomputeTime(tr.InputTokens, 0, true))
	}
	if !ok {
		return bad(outField, "%d output tokens at %v each, %d blocks to load and %d tokens to prefill",
			tr.OutputTokens, e.cfg.DecodeTokenTime, len(tr.Keys), tr.InputTokens)
	}
	inField := "input_tokens"
	if e.src != nil && e.src.Format() == trace.FormatMooncake {
		inField = "input_length"
	}
	handling, ok := e.handlingOf(tr.InputTokens)
	if ok {
		work, ok = addClock(work, handling)
	}
	if !ok {
		return bad(inField, "%d prompt tokens at handling_token_time %v each, plus handling_time %v",
			tr.InputTokens, e.cfg.HandlingTokenTime, e.cfg.HandlingTime)
	}
	if _, ok := addClock(tr.Arrival, work); !ok {
		return bad(arrField, "arrival %v plus the request's own work %v", tr.Arrival, work)
	}
	return nil
}

// clockGuard catches a time that wrapped round when an event was scheduled:
// every event is at or after the clock's now (durations are never
// negative), so one before it is an overflow. The first one is kept and
// stops the replay.
type clockGuard struct {
	err error
}

// checkEventTime is called with each event scheduled, at time at.
func (e *engine) checkEventTime(at time.Duration, kind eventKind) {
	if at >= e.now || e.clock.err != nil {
		return
	}
	line := 0
	if e.src != nil {
		line = e.src.Line()
	}
	e.clock.err = fmt.Errorf("replay: %s: near line %d, an event (kind %d) after the virtual time %v overflows the clock (int64 nanoseconds, 292 years): the trace's arrivals and durations, or decode_token_time, are too large",
		e.name, line, kind, e.now)
}

// handlingOf is a request of tokens prompt tokens' handling time
// (Config.HandlingTime, HandlingTokenTime), false when it does not fit
// the clock.
func (e *engine) handlingOf(tokens int) (time.Duration, bool) {
	d, ok := mulClock(int64(max(0, tokens)), time.Duration(e.cfg.HandlingTokenTime))
	if !ok {
		return 0, false
	}
	return addClock(d, time.Duration(e.cfg.HandlingTime))
}
