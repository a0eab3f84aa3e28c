package replay

import (
	"fmt"
	"unsafe"

	"kvtier.dev/kvtier"
)

// The replay reads its trace lazily, one request ahead of the clock, and
// holds only the requests in flight: arrived and not yet done (queued for a
// prefill slot or GPU memory, prefilling or decoding). When the modelled
// server cannot keep up, or a trace bursts (300,000 requests at one
// timestamp), that is most of the trace at once; inFlight accounts what they
// hold and stops the replay with an error once it passes
// Config.MemoryBudget, instead of growing until the OS kills it.

// requestBytes estimates, from above, the memory a request in flight holds
// with keys block keys: the request itself, its keys, and its two leases'
// blocks and scratch once it runs (2.2 KiB at 16 keys; a request of 16
// keys waiting in a 50,000-request burst measured about 1 KiB of live
// heap, so the budget errs on the safe side).
func requestBytes(keys int) int64 {
	const leaseBytesPerKey = 2 * (int64(unsafe.Sizeof(kvtier.Block{})) + 8 + 8)
	return int64(unsafe.Sizeof(request{})) + int64(keys)*(int64(unsafe.Sizeof(kvtier.Key(0)))+leaseBytesPerKey)
}

// inFlight counts the requests in flight and their estimated bytes, and
// their peaks.
type inFlight struct {
	requests, peakRequests int64
	bytes, peakBytes       int64
	// ext is what each request holds beside requestBytes: its requestExt,
	// in the replays that keep one (engine.usesExt).
	ext int64
}

// arrive adds a request of keys blocks, read at line of the trace called
// name; past budget bytes (0: no limit) it returns an error that says so.
func (f *inFlight) arrive(keys int, budget Bytes, name string, line int) error {
	f.requests++
	f.bytes += requestBytes(keys) + f.ext
	f.peakRequests = max(f.peakRequests, f.requests)
	f.peakBytes = max(f.peakBytes, f.bytes)
	if budget > 0 && f.bytes > int64(budget) {
		return fmt.Errorf("replay: %s: at line %d, %d requests are in flight at once (arrived, not done), holding about %v: over the memory budget of %v (memory_budget, --memory-budget): the trace bursts faster than the modelled server serves it; raise the budget, add prefill_slots, or replay a slice of the trace",
			name, line, f.requests, mib(f.bytes), budget)
	}
	return nil
}

// done removes a finished request of keys blocks.
func (f *inFlight) done(keys int) {
	f.requests--
	f.bytes -= requestBytes(keys) + f.ext
}

// mib formats n bytes in MiB.
func mib(n int64) string { return fmt.Sprintf("%.1f MiB", float64(n)/(1<<20)) }
