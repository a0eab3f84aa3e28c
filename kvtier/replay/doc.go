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
// scheduler: a waiting request holds nothing). When a request starts it
//
//  1. looks up its prefix (kvtier.Manager.LookupKeys, with the trace's block
//     keys and salt);
//  2. has the manager's Planner choose, block by block, load or recompute:
//     kvtier/cost's Planner (StrategyCost; it assumes an idle GPU, so while
//     other prefills run or wait the replay loads every cached block),
//     load everything (StrategyReload) or recompute everything not on the
//     GPU (StrategyRecompute);
//  3. submits its loads (Onboard), and reserves GPU slots for every block it
//     will compute (InsertKeys);
//  4. prefills at the GPU's modelled rate (kvtier/cost's recompute time,
//     attention included): first the blocks before its first load, while the
//     loads cross the link, then, once every load has landed, the rest;
//     prefill work of different requests runs one at a time on the GPU;
//  5. emits its first token when its prefill ends (that is its TTFT), commits
//     its blocks, decodes its output tokens at Config.DecodeTokenTime each
//     while holding them, then offloads its blocks to the host tier and
//     releases them.
//
// The copies the manager decides (loads, write-through copies, write-back
// demotions, offloads) go to the engine, which is the manager's Mover. Each
// crosses a modelled channel, one block at a time, for the link's latency
// plus the block over its bandwidth (kvtier/cost presets): PCIe host to GPU,
// PCIe GPU to host (full duplex, so offloads do not slow loads), and the
// NVMe drive (reads and writes share it). A channel serves onboard copies
// before offloads; offloads beyond 256 queued on a channel are dropped, as
// an offload engine drops what its link cannot keep up with. The links are
// modelled here rather than on cudastream's simulated device, whose device
// memory is real host memory: tiers of tens of GiB of 160 MiB blocks would
// not fit a replay's memory or its time budget.
//
// Baselines on the same trace and configuration: StrategyNone (no prefix
// cache), StrategyGPUOnly (a prefix cache in GPU memory alone),
// StrategyReload and StrategyRecompute.
//
// Capacities and links are per GPU: with tensor parallelism of degree tp,
// each GPU holds 1/tp of every block (kvtier/cost's KVBytesPerTokenPerRank)
// and loads it over its own link.
//
// # What the package promises
//
//   - The trace streams: the replay holds the requests in flight, never the
//     trace, so memory does not grow with the trace's length (as long as
//     the modelled server keeps up with it).
//   - Determinism: the same trace and Config give byte-identical JSON
//     (Report holds no map and no wall-clock time).
//   - A malformed trace line stops the replay with an error naming its line
//     (or, with Source.SkipBad, is skipped and counted); a bad Config is an
//     error naming its JSON field.
package replay
