package cudastream

import (
	_ "embed"
	"fmt"
)

// KernelCopier is an optional capability of a Stream: copies made by a
// kernel instead of the copy engines. The GPU's threads read or write pinned
// host memory directly, so thousands of small scattered blocks cost a few
// kernel launches instead of one DMA descriptor each: on the H200 a batch of
// 16 KiB copies runs several times faster this way than through
// cuMemcpyBatchAsync (benchmarks/results/transfer-h200.md). The price is a
// few SMs for the copy's duration (KernelCopyOptions.CTAs bounds them).
//
// Both devices implement it: the real one with the PTX in kernels/copy.ptx,
// loaded at first use with cuModuleLoadData, and the simulator with its own
// cost (LinkModel.KernelLaunch). Test for it with a type assertion:
//
//	if kc, ok := stream.(cudastream.KernelCopier); ok { ... }
type KernelCopier interface {
	// CopyKernel enqueues ops, all of one kind, as copy-kernel launches on
	// the stream. Descriptors are as for Stream.CopyBatch, and so is
	// ownership: the memory they name MUST stay valid and unmodified until
	// an event recorded after the call has completed; ops may be reused
	// once CopyKernel returns. Host addresses MUST lie in memory registered
	// with HostRegister, or allocated with HostAlloc or HostAllocVMM
	// (ErrNotRegistered otherwise). Every descriptor is checked before any
	// work is enqueued, so a bad one enqueues nothing. A driver without
	// the module entry points, or a device that cannot address host memory
	// at the host's own addresses, gives ErrNotSupported.
	CopyKernel(kind CopyKind, ops []Copy) error
	// SetKernelCopyOptions tunes later CopyKernel calls on this stream.
	SetKernelCopyOptions(o KernelCopyOptions) error
}

// KernelCopyOptions tunes the copy kernel. Zero fields take the defaults.
type KernelCopyOptions struct {
	// CTAs is the most thread blocks one launch uses. It bounds the SMs the
	// copy takes from the server's compute: 32 CTAs occupy at most 32 of the
	// H200's 132 SMs, and only a small part of each. Default 32.
	CTAs int
	// ThreadsPerCTA is a multiple of 32, at most 1024. Default 128: a small
	// CTA leaves room beside it for the server's kernels. On the H200 a
	// one-wave compute kernel (4 CTAs of 256 threads per SM) took 25% longer
	// (12.3 ms against 9.84) when copy CTAs of 512 threads were placed before
	// it, and 0.3% longer beside CTAs of 128 threads; placed after it,
	// neither slowed it, so its CTAs did not fit beside the large ones and
	// waited. 32 CTAs of 128 threads move 16 KiB pieces as fast as 16 of 512
	// (45.0 GiB/s host to device, 46.7 device to host;
	// benchmarks/results/copykernel-h200.md, TestCuCopyVariants).
	ThreadsPerCTA int
	// PieceBytes is the largest piece one CTA copies at a time: longer
	// copies (coalesced runs, 2 MiB blocks) are cut so that the CTAs share
	// the work evenly. A multiple of 16, at least 4096. Default 64 KiB.
	PieceBytes int64
	// Launches and PiecesPerLaunch shape the stream's descriptor ring: the
	// pieces of a launch are written to one of Launches slots of
	// PiecesPerLaunch pieces (longer calls take several), and a slot is
	// reused only once the launch that read it has completed, so a call
	// that finds every slot still pending waits on the host. A stream whose
	// launches wait on the device for other work (the gather path's, each
	// behind its chunk's DMA) needs as many slots as launches it queues.
	// The ring takes Launches*PiecesPerLaunch*24 bytes of pinned host and
	// of device memory, allocated at the stream's first CopyKernel; later
	// options cannot change its shape. Defaults 4 and 4096 (384 KiB each);
	// at most 1024 slots of [64, 65536] pieces.
	Launches, PiecesPerLaunch int
	// MappedDescriptors makes each launch read its descriptors from the
	// ring's pinned slot over the link, instead of from a device copy of
	// it made on the stream just before: a stream whose launches follow a
	// direction's large DMAs (the gather path's scatter behind its chunk's
	// DMA, or any launch while the other direction's copies run) would
	// otherwise queue that small host-to-device copy behind them on the
	// copy engines. The launch pays the link's latency per descriptor read
	// instead.
	MappedDescriptors bool
}

// Defaults of KernelCopyOptions.
const (
	DefaultKernelCTAs            = 32
	DefaultKernelThreadsPerCTA   = 128
	DefaultKernelPieceBytes      = 64 << 10
	DefaultKernelLaunches        = 4
	DefaultKernelPiecesPerLaunch = 4096
)

// withDefaults fills zero fields and checks the rest.
func (o KernelCopyOptions) withDefaults() (KernelCopyOptions, error) {
	if o.CTAs == 0 {
		o.CTAs = DefaultKernelCTAs
	}
	if o.ThreadsPerCTA == 0 {
		o.ThreadsPerCTA = DefaultKernelThreadsPerCTA
	}
	if o.PieceBytes == 0 {
		o.PieceBytes = DefaultKernelPieceBytes
	}
	if o.Launches == 0 {
		o.Launches = DefaultKernelLaunches
	}
	if o.PiecesPerLaunch == 0 {
		o.PiecesPerLaunch = DefaultKernelPiecesPerLaunch
	}
	switch {
	case o.CTAs < 0 || o.CTAs > 1<<16:
		return o, fmt.Errorf("cudastream: KernelCopyOptions.CTAs must be in [1, 65536] (0 for %d), got %d: %w", DefaultKernelCTAs, o.CTAs, ErrInvalidValue)
	case o.ThreadsPerCTA < 32 || o.ThreadsPerCTA > 1024 || o.ThreadsPerCTA%32 != 0:
		return o, fmt.Errorf("cudastream: KernelCopyOptions.ThreadsPerCTA must be a multiple of 32 in [32, 1024] (0 for %d), got %d: %w", DefaultKernelThreadsPerCTA, o.ThreadsPerCTA, ErrInvalidValue)
	case o.PieceBytes < 4096 || o.PieceBytes%16 != 0:
		return o, fmt.Errorf("cudastream: KernelCopyOptions.PieceBytes must be a multiple of 16 and at least 4096 (0 for %d), got %d: %w", DefaultKernelPieceBytes, o.PieceBytes, ErrInvalidValue)
	case o.Launches < 1 || o.Launches > 1024:
		return o, fmt.Errorf("cudastream: KernelCopyOptions.Launches must be in [1, 1024] (0 for %d), got %d: %w", DefaultKernelLaunches, o.Launches, ErrInvalidValue)
	case o.PiecesPerLaunch < 64 || o.PiecesPerLaunch > 1<<16:
		return o, fmt.Errorf("cudastream: KernelCopyOptions.PiecesPerLaunch must be in [64, 65536] (0 for %d), got %d: %w", DefaultKernelPiecesPerLaunch, o.PiecesPerLaunch, ErrInvalidValue)
	}
	return o, nil
}

// ComputeLoader is an optional capability of a real Stream: it enqueues the
// module's FMA kernel (kvtier_fma), a stand-in for a model's compute kernel
// when measuring how much copies slow compute. The simulator does not
// implement it.
type ComputeLoader interface {
	// LaunchFMA enqueues one launch of ctasPerSM CTAs of 256 threads per
	// SM, in which every thread runs iterations rounds of four fused
	// multiply-adds. ctasPerSM = 4 is one wave with half the SM's threads;
	// 8 and more run in waves, as a large model kernel does.
	LaunchFMA(ctasPerSM, iterations int) error
}

// copyPTX is kernels/copy.ptx, built from kernels/copy.cu (see its header).
//
//go:embed kernels/copy.ptx
var copyPTX string

// checkCopyOps checks what every implementation of CopyKernel checks before
// it looks at addresses.
func checkCopyOps(call string, kind CopyKind, ops []Copy) error {
	if kind >= NumCopyKinds {
		return fmt.Errorf("cudastream: %s: %w: unknown copy kind %d", call, ErrInvalidValue, kind)
	}
	for i := range ops {
		if ops[i].Bytes < 0 {
			return fmt.Errorf("cudastream: %s: %w: descriptor %d has negative size %d", call, ErrInvalidValue, i, ops[i].Bytes)
		}
	}
	return nil
}
