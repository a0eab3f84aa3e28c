package kvprom

import (
	"github.com/prometheus/client_golang/prometheus"

	"kvtier.dev/kvtier/pinned"
	"kvtier.dev/kvtier/transfer"
)

// Engine returns the collectors of a copy engine's counters (one GPU's
// transfer.Engine): <namespace>_copy_bytes_total by direction (onboard:
// into the GPU; offload: out of it), whose rate is the link's achieved
// rate, and the counts behind it: transfers, block pieces before
// coalescing and descriptors after, those the copy kernel and the gather
// path moved, those submitted while the other direction was busy, and the
// staged loads that waited for a staging buffer.
func Engine(e *transfer.Engine, namespace string, constLabels prometheus.Labels) []prometheus.Collector {
	stat := func(f func(transfer.Stats) int64) func() float64 {
		return func() float64 { return float64(f(e.Stats())) }
	}
	counter := func(name, help string, labels prometheus.Labels, f func(transfer.Stats) int64) prometheus.Collector {
		return prometheus.NewCounterFunc(prometheus.CounterOpts{Name: prometheus.BuildFQName(namespace, "copy", name),
			Help: help, ConstLabels: labels}, stat(f))
	}
	const bytesHelp = "Bytes the copy engine moved between the GPU and pinned host memory, by direction (onboard: into the GPU)."
	return []prometheus.Collector{
		counter("bytes_total", bytesHelp, with(constLabels, "direction", "onboard"), func(s transfer.Stats) int64 { return s.OnboardBytes }),
		counter("bytes_total", bytesHelp, with(constLabels, "direction", "offload"), func(s transfer.Stats) int64 { return s.OffloadBytes }),
		counter("transfers_total", "Transfers (one Submit's copies in one direction) the copy engine made.", constLabels,
			func(s transfer.Stats) int64 { return s.Transfers }),
		counter("block_pieces_total", "Pieces (a block's layer part) the copy engine was asked to copy, before coalescing.", constLabels,
			func(s transfer.Stats) int64 { return s.Blocks }),
		counter("descriptors_total", "Copies the copy engine issued after coalescing (batch descriptors, single copies, gather chunks).", constLabels,
			func(s transfer.Stats) int64 { return s.Descriptors }),
		counter("kernel_descriptors_total", "Pieces the copy kernel moved (the rest went to the DMA engines).", constLabels,
			func(s transfer.Stats) int64 { return s.KernelDescriptors }),
		counter("contended_descriptors_total", "Descriptors submitted while the other direction had copies in flight.", constLabels,
			func(s transfer.Stats) int64 { return s.ContendedDescriptors }),
		counter("gather_transfers_total", "Transfers that took the gather/scatter path through device staging.", constLabels,
			func(s transfer.Stats) int64 { return s.GatherTransfers }),
		counter("staging_waits_total", "Staged loads from NVMe that waited for a staging buffer's previous copy.", constLabels,
			func(s transfer.Stats) int64 { return s.StagingWaits }),
	}
}

// Pinned returns the gauges of a pinned host region (the host tier's
// pool, pinned.Region): its size, the bytes faulted in and registered
// with the device so far (the host tier grows as they are), the
// allocation's time and the rate of each of its stages (GiB/s; 0 until
// the allocation ends).
func Pinned(r *pinned.Region, namespace string, constLabels prometheus.Labels) []prometheus.Collector {
	gauge := func(name, help string, labels prometheus.Labels, f func(pinned.Stats) float64) prometheus.Collector {
		return prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: prometheus.BuildFQName(namespace, "pinned", name),
			Help: help, ConstLabels: labels}, func() float64 { return f(r.Stats()) })
	}
	const rateHelp = "The pinned allocation's rate by stage (touch: faulting pages in; register: inside cuMemHostRegister; total: end to end), GiB/s; 0 until it ends."
	return []prometheus.Collector{
		gauge("bytes", "Size of the pinned host region.", constLabels, func(s pinned.Stats) float64 { return float64(s.SizeBytes) }),
		gauge("faulted_bytes", "Bytes of the region faulted in so far.", constLabels, func(s pinned.Stats) float64 { return float64(s.FaultedBytes) }),
		gauge("registered_bytes", "Bytes of the region registered with the device so far (usable for copies).", constLabels,
			func(s pinned.Stats) float64 { return float64(s.RegisteredBytes) }),
		gauge("alloc_seconds", "Time from the allocation's start to its last chunk registered; 0 until it ends.", constLabels,
			func(s pinned.Stats) float64 { return s.TotalTime.Seconds() }),
		gauge("rate_gib_per_second", rateHelp, with(constLabels, "stage", "touch"), func(s pinned.Stats) float64 { return s.TouchGiBPerSec() }),
		gauge("rate_gib_per_second", rateHelp, with(constLabels, "stage", "register"), func(s pinned.Stats) float64 { return s.RegisterGiBPerSec() }),
		gauge("rate_gib_per_second", rateHelp, with(constLabels, "stage", "total"), func(s pinned.Stats) float64 { return s.TotalGiBPerSec() }),
	}
}
