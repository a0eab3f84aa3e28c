// Package transfer is kvtier's copy engine: it moves KV blocks between the
// server's GPU layout and the pinned host pool, and from NVMe through pinned
// staging buffers to the GPU, at the link's speed and without ever letting a
// buffer be reused while a copy still reads or writes it.
//
// What it promises:
//
//   - Onboard (host to device) and offload (device to host) run on two
//     dedicated streams, separate from the server's compute stream and from
//     each other: the H200's two copy directions run concurrently (80 GiB/s
//     both ways), so neither starves the other, and each has its own
//     submission lock. The onboard stream has the higher priority.
//   - An offload waits for the server's event for the step that produced the
//     KV on the device (cuStreamWaitEvent), never on a host synchronisation.
//   - An onboard records one event per layer, so the compute stream can start
//     layer 0 while later layers still load (Transfer.LayerEvent).
//   - Copies are coalesced where both sides are contiguous, then submitted
//     by Config.Method: small pieces to the copy kernel (SMs move them
//     between device memory and the pinned pool at 44-47 GiB/s on the H200),
//     large ones in batches (cuMemcpyBatchAsync, or the driver's fallback
//     loop). While the other direction has work in flight the switch moves
//     down (MethodAuto): both ways at once, the kernel's PCIe traffic tops
//     out near 57 GiB/s in sum where the copy engines reach 80. Descriptor
//     buffers are reused, so submission allocates nothing per block.
//   - Where the host side of a transfer is long runs of slots (as the
//     Manager's fresh allocations are), blocks scattered on the GPU cross
//     the link in a few large or strided DMAs through a ring of device
//     staging buffers, the copy kernel gathering them into it (offloads) or
//     scattering them out of it (onboards) at HBM speed on a second stream
//     per direction (gather.go, Config.GatherBuffers). Both directions then
//     run at once near the link's duplex rate for small blocks too, and the
//     SMs work only a small part of each chunk's time.
//   - A Transfer is done only when the device has completed its copies
//     (design.md, invariant 2). The memory it reads or writes — host slots,
//     GPU blocks — MUST NOT be reused by the caller before Done is closed, even
//     after Wait returned early because its context ended. Staging buffers
//     are the engine's own and are reused only after the event of the copy
//     that read them has completed (invariant 3).
//   - Cancellation stops issuing new copies; what was issued still completes
//     before the Transfer is done, and the Transfer reports the context's
//     error: its data MUST NOT be used.
//   - With Config.Polled the engine runs no goroutine of its own: Poll
//     completes, in stream order, the transfers the device has finished,
//     and runs their OnDone functions on its caller's goroutine. On the
//     simulated device's virtual clock that makes a replay of the serving
//     code deterministic (kvtier/replay).
//   - With Config.Sums, every offload and staged onboard also sums its
//     blocks on the GPU (internal/checksum's word sum, over each block's
//     bytes in host order) and is done only once the sums are in host
//     memory (Transfer.Sums, sums.go): the NVMe tier's checksums, without
//     the CPU reading a payload.
package transfer
