// Package transfer is kvtier's copy engine: it moves KV blocks between the
// server's GPU layout and the pinned host pool, and from NVMe through pinned
// staging buffers to the GPU, without ever letting a buffer be reused while
// a copy still reads or writes it.
//
// What it promises:
//
//   - Onboards (host to device) and offloads (device to host) run on two
//     streams of their own, apart from the server's compute stream and from
//     each other, with a submission lock each; the onboard stream has the
//     higher priority.
//   - An offload waits on the device for the server's events for the steps
//     that produced its KV (cuStreamWaitEvent), never on the host.
//   - An onboard records one event per layer, so the compute stream can
//     start layer 0 while later layers still load (Transfer.LayerEvent).
//   - Config.Method says how copies are submitted (MethodAuto: by measured
//     switches). Submission allocates nothing per block.
//   - A Transfer is done only when the device has completed its copies
//     (design.md, invariant 2). Its host slots and GPU blocks MUST NOT be
//     reused before Done is closed, even after Wait returned early. The
//     engine's own staging buffers are reused only after the copy that read
//     them has completed (invariant 3).
//   - Cancellation stops issuing copies; what was issued still completes
//     before the Transfer is done, which reports the context's error: its
//     data MUST NOT be used.
//   - With Config.Polled the engine runs no goroutine of its own: Poll
//     completes finished transfers in stream order and runs their OnDone
//     functions on its caller's goroutine.
//   - With Config.Sums, offloads and staged onboards also sum their blocks
//     on the GPU, and are done only once the sums are in host memory.
//   - With Config.Codec the host pool and staging buffers hold encoded
//     blocks (package codec's format, byte for byte): offloads quantize on
//     the device and onboards dequantize there, through device scratch
//     allocated by New (codec.go), with cudacodec's kernels, or package
//     codec in Go on a simulated device. An onboard's layer events are
//     then all recorded after its last chunk.
//
// The measurements behind the methods and their defaults: docs/transfer.md.
package transfer
