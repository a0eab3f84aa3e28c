// Package devmover is the kvtier.Mover of a server with real memory: it
// moves blocks between the GPU, the pinned host tier and the NVMe tier with
// kvtier/transfer's copy engine and kvtier/nvme's store.
//
// Slots map one to one: the manager's GPU slot s is the engine's GPU block
// s, its host slot s is the engine's host slot s (Config.Host), and its NVMe
// slot s is one of the store slots the mover took at New.
//
// It promises:
//
//   - An op completes only after the copy or I/O that reads or writes its
//     slots has completed (the engine's transfer is done, or the store call
//     has returned), so the manager never reuses a slot under a copy
//     (invariants 2 and 3). With nvme.Config.Durable an NVMe write
//     completes only once synced.
//   - Nothing is served from NVMe that its header does not name: a read
//     whose header names another block (key, parent, salt, position,
//     tokens) or whose checksum fails completes with an error wrapping
//     kvtier.ErrSourceLost, and the store drops the slot.
//   - Checksums stay where the bytes are: when the engine sums on the GPU
//     (transfer.Config.Sums) and the store is not keyed, an offload's sums
//     travel with its host slots to the store, and a load from NVMe into
//     the GPU is checked there, not on the CPU.
//   - Loads into the GPU report per-layer readiness (kvtier.Layers), so a
//     compute stream waits for each layer on the device.
//   - A restarted server keeps its NVMe tier: with Config.KeepBlocks the
//     blocks the store recovered are listed by Recovered for
//     kvtier.Manager.Adopt.
//
// The paths (GPU and host, NVMe reads and writes, staged loads from NVMe,
// the bounce path from the GPU to NVMe) and their measurements are in
// docs/design-notes.md ("Wiring the tiers together").
package devmover
