package transfer

import "sync/atomic"

// Stats is a snapshot of the engine's counters.
type Stats struct {
	OnboardBytes, OffloadBytes int64
	Transfers                  int64
	// Blocks and Descriptors show what coalescing saved: each block of each
	// layer is one copy before coalescing.
	Blocks, Descriptors int64
	// KernelDescriptors counts the descriptors the copy kernel moved (the
	// rest went to batches or single copies).
	KernelDescriptors int64
	// ContendedDescriptors counts the descriptors submitted while the other
	// direction had work in flight (MethodAuto's busy column).
	ContendedDescriptors int64
	// StagingWaits counts staged onboards that waited for a staging
	// buffer's previous copy before refilling it.
	StagingWaits int64
	// GatherTransfers counts the transfers that took the gather/scatter
	// path, GatherChunks the device staging chunks they moved (their link
	// descriptors are in Descriptors), and GatherKernelDescriptors the
	// device-side pieces the gather and scatter kernels copied.
	GatherTransfers, GatherChunks, GatherKernelDescriptors int64
	// CodecChunks counts the chunks the codec path (Config.Codec) coded,
	// both ways.
	CodecChunks int64
}

// counters are the live counters behind Stats.
type counters struct {
	onboardBytes, offloadBytes, transfers  atomic.Int64
	blocks, descriptors, kernelDescriptors atomic.Int64
	contendedDescriptors, stagingWaits     atomic.Int64
	gatherTransfers, gatherChunks          atomic.Int64
	gatherKernelDescriptors                atomic.Int64
	codecChunks                            atomic.Int64
}

// Stats returns a snapshot of the engine's counters; each is read
// atomically, the set is not.
func (e *Engine) Stats() Stats {
	c := &e.stats
	return Stats{
		OnboardBytes: c.onboardBytes.Load(), OffloadBytes: c.offloadBytes.Load(),
		Transfers: c.transfers.Load(), Blocks: c.blocks.Load(), Descriptors: c.descriptors.Load(),
		KernelDescriptors: c.kernelDescriptors.Load(), ContendedDescriptors: c.contendedDescriptors.Load(),
		StagingWaits:    c.stagingWaits.Load(),
		GatherTransfers: c.gatherTransfers.Load(), GatherChunks: c.gatherChunks.Load(),
		GatherKernelDescriptors: c.gatherKernelDescriptors.Load(),
		CodecChunks:             c.codecChunks.Load(),
	}
}
