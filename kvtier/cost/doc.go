// Package cost is kvtier's cost model: the bytes of KV a model keeps per
// token, how long reloading and recomputing them take, and the decisions:
// reload or recompute for one request (Scenario), and block by block for a
// prefix spread over tiers (Planner).
//
// It promises:
//   - every figure it starts from is a named, documented preset (a model's
//     published config.json, a GPU's datasheet, a link's achievable rate)
//     that the caller or a measurement can replace (LoadProbe, Calibration);
//   - bad input is rejected with an error that names the field (FieldError),
//     and nothing is half-built;
//   - times are time.Duration in the public API, computed in float64
//     seconds inside; rates carry their unit in their name (BytesPerS, FLOPS);
//   - (*Planner).Plan, the block manager's hot path, plans a prefix of any
//     length and allocates nothing once its scratch space holds it;
//   - a plan is priced as a model server runs it: one forward pass whose
//     layer l waits for layer l of every load, each tier's loads one
//     onboard with the copy engine's per-layer issue costs (Link), the
//     pass ending later while its loads copy (PrefillFit.LoadSlowdown),
//     and PassLoads gives a replay the same layer landings;
//   - a tier that holds compressed blocks (Path.Codec) is priced by its
//     encoded bytes, computed from the Model's shape, and the GPU's
//     decode of them;
//   - a Calibration learns what this server's GPU and links actually do,
//     passes with loads in flight included, and the Planner reads it
//     without a lock.
//
// It imports none of kvtier's packages. docs/cost.md derives the timing
// model, the Planner's search and the Calibration's fit, with the
// measurements behind them.
package cost
