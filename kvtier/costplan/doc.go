// Package costplan is the one planner of the server and the replay: a
// kvtier.Planner over kvtier/cost's model of the GPU and the links, and
// the vocabulary both use to name how a cache is used (Strategy).
//
// It promises:
//
//   - Each block of a request is loaded or recomputed, whichever brings
//     the whole prompt onto the GPU sooner in kvtier/cost's model: the
//     request as the manager describes it (kvtier.PlanRequest: every
//     block, the partial last one by its tokens), behind the backlog the
//     Mover reports on the links and the GPU.
//   - Tiers and actions map one to one: kvtier's GPU, Host and NVMe to
//     cost.TierGPU, TierHost and TierNVMe, a block no tier holds to
//     cost.TierMissing; cost's ActionNone, ActionLoad and ActionRecompute
//     back to Use, Load and Recompute.
//   - A Planner is safe for concurrent use, plans requests of any length,
//     and allocates nothing once its scratch has grown to the longest
//     request seen.
//   - A Strategy names one of five ways to use a cache, and gives the same
//     planner, tiers and policy to every client (server, replay, CLI).
package costplan
