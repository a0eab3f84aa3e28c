// Package cost is kvtier's cost model: how many bytes of KV a model keeps per
// token, how long bringing those bytes back from a lower tier takes over a
// given link, how long recomputing them with prefill takes on a given GPU,
// and from those, the decisions: reload or recompute, the break-even context
// length, the best split between the two, and a per-block plan for a prefix
// whose blocks sit in different tiers.
//
// It promises:
//   - every figure it starts from is a named, documented preset (a model's
//     published config.json, a GPU's datasheet, a link's achievable rate) and
//     every figure can be overridden or replaced by a measurement
//     (LoadProbe reads `kvtier probe --json`);
//   - bad input is rejected with an error that names the field (FieldError),
//     and nothing is half-built;
//   - times are time.Duration in the public API, computed in float64 seconds
//     inside; rates carry their unit in their name (BytesPerS, FLOPS);
//   - (*Planner).Plan, the block manager's hot path, allocates nothing (once
//     its scratch space holds the request: any length is planned, 65,536
//     blocks in under 2 ms on the development machine);
//   - a Calibration learns what this server's GPU and links actually do, and
//     the Planner reads it without a lock.
//
// The package imports none of kvtier's packages.
//
// # The timing model
//
// Reload of n tokens over a path: the stages' latencies plus n times the KV
// bytes per token (per GPU, see Model.KVBytesPerTokenPerRank) over the
// bandwidth; a two-stage path (NVMe then PCIe, NIC then PCIe) pipelined runs
// at its slower stage, serial pays both.
//
// Recompute of n tokens after p tokens already present, on tp GPUs:
//
//	linear    = 2 × ActiveParams × n
//	attention = 2 × Layers × QHeads × (QKHeadDim + VHeadDim) × (n·p + n(n+1)/2)
//	time      = FLOPs / (GPU.PeakFLOPS × GPU.Efficiency × tp)
//
// The attention term counts QKᵀ (2·QKHeadDim FLOPs per query-key pair per
// head) and A·V (2·VHeadDim) over the causal context: new token i (1-based)
// attends to p+i positions, and the sum over the n new tokens is
// n·p + n(n+1)/2. For standard and grouped-query attention QKHeadDim =
// VHeadDim = HeadDim, so the factor is 4 × Layers × QHeads × HeadDim.
// Linear FLOPs count every active parameter, embeddings included (about 1%
// high for the presets), as the usual 2·N·tokens rule does.
//
// # Calibration
//
// The presets are a prior: a fixed efficiency cannot fit one GPU (on the
// H200 they read 0.41-0.92 of the measured time for short prefills), and
// every server differs. A Calibration fits, from measurements,
//
//	prefill = fixed + weights × 4096/width / WeightBytesPerS
//	        + linear FLOPs/LinearFLOPS
//	        + attention FLOPs among the new tokens/AttentionFLOPS
//	        + attention FLOPs with the prefix/PrefixAttentionFLOPS
//	        + the prefix's KV bytes/PrefixReadBytesPerS             (PrefillFit)
//	copy    = latency + bytes/bandwidth, per link                (LinkFit)
//
// by relative least squares with non-negative terms, pulled toward the
// presets (so that a handful of samples cannot run away; the prefix rate
// is pulled toward the attention rate instead, so that it takes a rate of
// its own only from samples with a prefix), and robust to
// outliers (Huber, then Tukey's biweight at the Huber fit's scale: one
// prefill that waited behind something else carries no weight). The
// weight term is the ramp of a pass's efficiency with its tokens, stated
// for a model 4,096 wide (RampWidth; PrefillFit says why it scales with
// the width). It keeps the newest samples in a
// bounded window, refits on each sample (tens of microseconds), and
// publishes an immutable Fit through an atomic pointer: Current costs one
// load. A Fit reports its sample count and error width; the Planner charges
// each figure its width, so that a close decision goes to the option that
// stays good if the less certain figure is wrong.
//
// A server feeds it from its own work:
//
//	cal, _ := cost.LoadCalibrationFile("h200.json", gpu, model) // or NewCalibration(gpu)
//	cfg.Calibration = cal                                       // PlannerConfig
//	...
//	cal.AddPrefill(model, tp, prefix, tokens, elapsed)          // after each prefill
//	cal.AddCopy(hostLink, bytes, elapsed)                       // after each copy, link by name
//	...
//	cal.WriteFile("h200.json")                                  // at shutdown, or now and then
//
// All of Calibration's methods are safe for concurrent use. The file is
// JSON (WriteJSON documents it); LoadCalibration also reads `kvtier probe
// --json`. `kvtier calc --prefill-samples` fits samples offline and prints
// each one's error; `kvtier calc --calibration` and `kvtier replay
// --calibration` use a file.
//
// # Queues
//
// PlanQueued plans behind work already queued: copies on the GPU's ingress
// delay this request's loads, prefill queued on the GPU its recompute, so
// that under load a request recomputes what would wait behind a busy link
// and loads what would wait behind a busy GPU.
package cost
