// Package pinned builds kvtier's host tier: one large linear buffer of host
// memory, page-locked and registered for DMA, made in seconds rather than the
// minutes cuMemHostAlloc takes for hundreds of GiB.
//
// Alloc maps the whole region once, faults its pages in with worker
// goroutines pinned one per CPU, and hands finished chunks, in address order,
// to a single registering goroutine on its own physical core, so that
// faulting hides behind registration (the serial driver step that bounds the
// whole). Registration is the small Registrar interface: a
// cudastream.Device satisfies it, and MlockRegistrar page-locks with mlock
// where there is no GPU.
//
// What the package promises:
//
//   - The region's address range is one mapping; chunks are registered in
//     order, never overlapping and never past the end, each call smaller than
//     512 GiB.
//   - ReadyBytes only grows, and every byte below it is registered: a server
//     may use the leading bytes while the rest is still being pinned.
//   - A failure or a cancelled context stops the workers, unregisters what
//     was registered and unmaps the region; the error names the chunk (index,
//     offset, length), the stage and the cause. Nothing is left mapped or
//     locked.
//   - Bad options and sizes are rejected before anything is mapped, with an
//     error that names the field and the value.
package pinned
