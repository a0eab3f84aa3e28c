// Package stack wires kvtier's parts into one cache for a server: Open
// takes the device (or one per GPU for tensor parallelism), the server's KV
// region and the tiers' sizes, and builds the pinned host pool, the copy
// engines, the NVMe store, the devmover.Mover, the kvtier.Manager and the
// remote tier over them, with sizes that agree. It is the one place that wires a device
// stack; servers, tools and tests use it instead of building the parts by
// hand.
//
// It promises:
//
//   - Sizes agree: the manager's host slots are the pool's slots (a block
//     rounded up to 4 KiB), its NVMe slots the store's, its GPU slots the
//     KV region's blocks; no host slot straddles two pinned registrations.
//   - Open returns once the first chunk of the host pool is pinned; the
//     host tier grows as the rest is (Cache.WaitHostPinned waits for all).
//   - Bad options are an error naming the field (Options.X), and change
//     nothing: everything Open built before the error is closed again.
//   - With an NVMe tier, payloads are checksummed on the GPU where the
//     device can sum (and no tier compresses), on the CPU otherwise.
//   - Options.Codecs makes the tiers below the GPU hold FP8 blocks, coded
//     on the GPU by the copy engines (on a simulator, in Go at the cost
//     model's rates); their slots shrink to the encoded size. Tiers of
//     different codecs are refused.
//   - The cache is bound to Options.Model: Cache.Salt folds it into every
//     block's salt, the NVMe tier clears a directory written for another
//     model (a Warn line names it), and the remote tier (Options.Remote)
//     refuses a prefix that holds another model's blocks and warns when
//     its checksums are unkeyed. A slab file the NVMe tier cannot use
//     fails Open unless Options.NVMeReformat.
//   - Close drains the copies in flight, then closes the remote tier, the
//     mover, the engines, the store and the pinned memory, in that order.
package stack
