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
//   - (*Planner).Plan, the block manager's hot path, allocates nothing.
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
package cost
