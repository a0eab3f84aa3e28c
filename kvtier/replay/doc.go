// Package replay replays a request trace through kvtier's block manager,
// policies and cost model on a virtual clock, to size the tiers and compare
// strategies offline: the engine behind `kvtier replay`.
//
// # The model
//
// A discrete-event simulation, single-threaded and deterministic. Requests
// arrive at their trace timestamps and wait, first come first served, for a
// prefill slot (Config.PrefillSlots) and for GPU memory for all their blocks
// beside those of the requests prefilling or decoding (a server's
// scheduler: a waiting request holds nothing), and with Config.DecodeOnGPU
// for the GPU's decode round (below). A prefilling request has the
// GPU's compute to itself (one slot is one GPU; with slots 0 every request
// has its own), so its plan runs as the cost model timed it. When a request
// starts it
//
//  1. looks up its prefix (kvtier.Manager.LookupKeys, with the trace's block
//     keys and salt);
//  2. has the manager's Planner choose, block by block, load or recompute,
//     behind the loads already queued on the GPU's ingress by the requests
//     before it (kvtier/cost's PlanQueued; the GPU's backlog is always 0,
//     as each prefilling request has its GPU's compute to itself):
//     kvtier/cost's Planner over the whole prompt (costplan.Cost: the blocks
//     past the cached prefix are planned as missing, the partial last block
//     by its tokens), load everything (costplan.Reload) or recompute
//     everything not on the GPU (costplan.Recompute);
//  3. submits its loads (Onboard), and reserves GPU slots for every block it
//     will compute (InsertKeys); when copies out of the GPU still hold the
//     slots its loads or its blocks need, it waits until they have freed as
//     many as it lacked, and is tried again then, not after every copy
//     (space.go), as the model server does;
//  4. runs its prefill as the model server does and kvtier/cost's Planner
//     prices it: one forward pass over the positions it computes, whose
//     layer l runs once layer l-1 is done and layer l of every load has
//     landed, each layer a share of the pass's work (its recomputed
//     blocks' prefill, attention included, the pass's own cost and its
//     read of the present tokens, at least the weights' read from HBM,
//     Scenario.PassFloor); an Onboard's loads land layer by layer and
//     complete together;
//  5. emits its first token when its prefill ends (its TTFT is that, plus
//     its handling outside the GPU, Config.HandlingTime and
//     HandlingTokenTime, 0 by default, which delays nothing else), commits
//     its blocks, decodes its other output tokens at Config.DecodeTokenTime
//     each while holding them, then offloads its blocks to the host tier and
//     releases them.
//
// By default decode takes no GPU time: it only delays a request's end, and
// the next prefill starts as soon as the one before it has ended. With
// Config.DecodeOnGPU (one prefill slot) the replay runs the project's
// model server's scheduler (examples/server): its one GPU alternates one
// prefill and one decode round, a step of Config.DecodeTokenTime for every
// request decoding, back to back in the order they started (the request
// just prefilled joins last: its second token ends the round after its
// prefill). A request
// whose step was its last ends when that step does; the next queued
// prefill starts after the round, when fewer than Config.MaxBatch requests
// decode (the server's -max-batch), and while none may start the rounds go
// on back to back. A request that arrives during a round waits for its
// end, so under load decode delays the prefills after it
// (TestDecodeOnGPUByHand); the report counts the GPU time the rounds took
// (StrategyResult.DecodeBusySeconds) and the work offered the GPU, decode
// included (OfferedGPULoad).
//
// Alone on an idle system a request therefore takes the time the Planner
// predicted for its plan, on either mover (TestReplayExecutesThePlan);
// with others in flight, their loads and offloads share the links, and a
// plan made behind loads already queued still ends when it said, when
// nothing queued after it goes first (TestPlansSeeTheQueuedLoads).
//
// With Config.Calibration, a calibration file (kvtier/cost) replaces the
// presets' prefill rate and links for the planner and for the replay's own
// timing alike: each recomputed block's work as the fit prices it (its
// pairs with the blocks recomputed before it at the fit's attention rate,
// with the blocks present at its prefix rate: PrefillCost.BlockSeconds),
// plus the fit's per-pass cost and its read of the present tokens at the
// end (TestReplayExecutesTheCalibratedPlan), so that a prefill of n tokens
// after p present ones takes the fit's Seconds(n, p), as the server that
// measured it did.
//
// The copies the manager decides (loads, write-through copies, write-back
// demotions, offloads) go to the engine, which is the manager's Mover.
//
// Under Config.Mover "device" (the default) the copies between the GPU and
// the host tier are made by the code that serves: the engine hands them to
// kvtier.DeviceMover over a transfer.Engine, on cudastream's simulated
// device (device.go). The device is TimingOnly and its host pool reserved
// address space, so the tiers cost nothing but their bookkeeping; the
// engine is polled (transfer.Config.Polled), and the replay steps the
// device's virtual clock to each of its events (Sim.NextEvent) in the
// order of its own, so completions come at their modelled times, on one
// goroutine, in the same order on every run. An onboard is one copy call
// per layer (a descriptor per block, an event per layer: the host link's
// issue costs, cost.Link) and its blocks complete together, as the
// DeviceMover completes them for a server; the pass reads each layer's
// landing from the lease's layer events (kvtier.Layers), as the server
// waits for them.
//
// The copies to and from NVMe, and every copy under Config.Mover "model",
// cross a modelled channel, timed by kvtier/cost as the Planner times
// them: the GPU's ingress carries every load, an Onboard's as one job
// whose layers land where cost.Planner.PassLoads puts them (from the host
// tier over the host link; from NVMe read by the drive, then staged over
// the host link), PCIe GPU to host carries offloads to the host tier (full
// duplex, so offloads do not slow loads), and the NVMe drive's channel its
// writes, a block at a time: a copy other than a load occupies its
// channel for the block over the path's bandwidth and ends no sooner than
// the path's latency after it was submitted. A channel serves
// onboard copies before offloads; offloads beyond 64 GiB queued on a channel
// are dropped, as an offload engine drops what its link cannot keep up
// with. NVMe stays modelled because the DeviceMover's NVMe paths write real
// files through kvtier/nvme (780 GiB in a replay of the bundled trace). On
// the device a load from NVMe is read by the modelled drive, then copied to
// the GPU by the DeviceMover from staging slots, as its staged onboard
// does: the blocks read while one staged copy runs go together in the
// next, and they queue behind the host loads on the GPU's ingress.
//
// A configuration whose weights (per GPU) and KV cache do not fit in the
// GPU's memory is refused (Config.GPUBytes, Config.GPUMemoryBytes), and the
// report says when the trace offers more prefill than the GPU can do
// (StrategyResult.OfferedPrefillLoad).
//
// Baselines on the same trace and configuration: costplan.None (no prefix
// cache), costplan.GPUOnly (a prefix cache in GPU memory alone),
// costplan.Reload and costplan.Recompute.
//
// Capacities and links are per GPU: with tensor parallelism of degree tp,
// each GPU holds 1/tp of every block (kvtier/cost's KVBytesPerTokenPerRank)
// and loads it over its own link.
//
// # What the package promises
//
//   - The trace streams: the replay holds the requests in flight, never the
//     trace, so memory does not grow with the trace's length (as long as
//     the modelled server keeps up with it). A strategy whose requests in
//     flight pass Config.MemoryBudget stops with a *BudgetError; the others
//     are replayed and reported (Report.OverBudget names it).
//   - Determinism: the same trace and Config give byte-identical JSON
//     (Report holds no map and no wall-clock time), and byte-identical
//     request records (Options.OnRequest, RequestLines: one RequestRecord
//     per request and strategy, as each request ends, to compare request
//     by request with a measured server's).
//   - A malformed trace line stops the replay with an error naming its line
//     (or, with Source.SkipBad, is skipped and counted); a bad Config is an
//     error naming its JSON field.
package replay
