// Package engine is the model server's scheduler: it implements
// httpapi.Backend over a model Runner (the GPU model, or the CPU reference
// over the simulated device) and a kvtier.Cache.
//
// One goroutine owns the model. It prefills queued requests one at a time
// in arrival order and, between two prefills, runs one decode step of every
// sequence that is generating (iteration-level continuous batching: the
// model's forward pass takes one sequence, so the steps of a batch run back
// to back rather than in one kernel).
//
// A request's prompt goes through kvtier as follows: Lookup (the longest
// cached prefix, leased), Plan (the strategy's planner: the cost model, load
// all, recompute all), Onboard (copies into GPU slots), Insert of the
// prompt's full blocks into the GPU tier (slots for the blocks to compute),
// one forward pass that computes the blocks not present (the head the
// planner chose to recompute, misses, the suffix) and waits, layer by
// layer, only for that layer's loads (Config.LayerWait: on the device, the
// runner's stream waiting on Lease.LayerEvents through
// model.Plan.LayerEvents; or on the host, Lease.WaitLayer through
// model.Plan.Ready), Commit once the pass has written the KV, and Release
// when the sequence ends. Write-through copies the committed blocks down to
// the host tier and on to NVMe in the background.
//
// A GPU block is not evictable while such a copy reads it. When Onboard or
// Insert finds too few GPU slots while copies out of the GPU are in flight,
// the prefill waits for as many of them to end and tries again
// (kvtier.Manager.WaitCopiesFrom), as kvtier/replay's requests do; only
// with no copy left does it recompute the loads refused a slot and compute
// the blocks without one in scratch, uncached.
//
// A load that fails (a corrupt NVMe block: the store drops it) is seen
// after the pass (Manager.Wait) when the pass waits on the device, before
// the layer that needed it when it waits on the host; either way nothing
// the pass computed is sent or committed, the request is looked up again
// and the lost blocks are recomputed. Wrong KV never reaches a response or
// the cache, and the failure is never fatal: it is counted
// (kvserve_failed_loads_total).
//
// Slots: the KV region is the cache's GPU tier (slots [0, CacheSlots)) and
// after it ScratchSlots slots the engine hands out itself, for what kvtier
// does not hold: the prompt's last partial block, the generated tokens, and
// full blocks the GPU tier had no room for (or every block of a no-cache
// request). A request waits in the queue until the scratch slots it may
// need are free.
package engine
