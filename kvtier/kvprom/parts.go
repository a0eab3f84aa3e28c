package kvprom

import (
	"github.com/prometheus/client_golang/prometheus"

	"kvtier.dev/kvtier/devmover"
	"kvtier.dev/kvtier/nvme"
)

// Collectors of the parts below the manager: the mover's copies by path
// and the NVMe store's checksums. Like Collector, they read the parts'
// atomic counters at each scrape and keep nothing.

// Mover returns the collectors of mv's counters: <namespace>_mover_ops_total
// by path (onboard, offload, nvme_write, nvme_read, staged_load,
// bounce_write) and <namespace>_mover_failures_total (the manager's
// move_failures_total counts the same failures, without the path).
func Mover(mv *devmover.Mover, namespace string, constLabels prometheus.Labels) []prometheus.Collector {
	stat := func(f func(devmover.Stats) uint64) func() float64 {
		return func() float64 { return float64(f(mv.Stats())) }
	}
	paths := []struct {
		name string
		f    func(devmover.Stats) uint64
	}{
		{"onboard", func(s devmover.Stats) uint64 { return s.Onboards }},
		{"offload", func(s devmover.Stats) uint64 { return s.Offloads }},
		{"nvme_write", func(s devmover.Stats) uint64 { return s.NVMeWrites }},
		{"nvme_read", func(s devmover.Stats) uint64 { return s.NVMeReads }},
		{"staged_load", func(s devmover.Stats) uint64 { return s.StagedLoads }},
		{"bounce_write", func(s devmover.Stats) uint64 { return s.BounceWrites }},
	}
	name := prometheus.BuildFQName(namespace, "mover", "ops_total")
	var cs []prometheus.Collector
	for _, p := range paths {
		cs = append(cs, prometheus.NewCounterFunc(prometheus.CounterOpts{Name: name,
			Help: "Block copies the mover started, by path.", ConstLabels: with(constLabels, "path", p.name)}, stat(p.f)))
	}
	cs = append(cs, prometheus.NewCounterFunc(prometheus.CounterOpts{Name: prometheus.BuildFQName(namespace, "mover", "failures_total"),
		Help: "Block copies the mover completed with an error.", ConstLabels: constLabels}, stat(func(s devmover.Stats) uint64 { return s.Failures })),
		prometheus.NewCounterFunc(prometheus.CounterOpts{Name: prometheus.BuildFQName(namespace, "mover", "dropped_writes_total"),
			Help: "NVMe writes not made because their block was no longer wanted when their turn came.", ConstLabels: constLabels},
			stat(func(s devmover.Stats) uint64 { return s.Dropped })))
	return append(cs, driveCollectors(mv, namespace, constLabels)...)
}

// driveCollectors are the NVMe drive's gauges as the mover measures it:
// its write queue and its read and write rates.
func driveCollectors(mv *devmover.Mover, namespace string, constLabels prometheus.Labels) []prometheus.Collector {
	rate := func(write bool) func() float64 {
		return func() float64 {
			r := mv.DriveRates()
			if write {
				return r.WriteBytesPerS
			}
			return r.ReadBytesPerS
		}
	}
	name := prometheus.BuildFQName(namespace, "drive", "bytes_per_second")
	return []prometheus.Collector{
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: prometheus.BuildFQName(namespace, "drive", "queued_writes"),
			Help: "NVMe writes waiting for their turn on the drive or in flight.", ConstLabels: constLabels},
			func() float64 { return float64(mv.QueuedWrites()) }),
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: name,
			Help: "The NVMe drive's rate as the mover measures it (a moving average of its I/Os), by direction.", ConstLabels: with(constLabels, "dir", "read")}, rate(false)),
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: name,
			Help: "The NVMe drive's rate as the mover measures it (a moving average of its I/Os), by direction.", ConstLabels: with(constLabels, "dir", "write")}, rate(true)),
	}
}

// Store returns the collectors of s's checksum counters:
// <namespace>_nvme_checked_blocks_total, the blocks read by where their
// payload was checked (on the GPU when the engine sums, by the store on the
// CPU otherwise), and <namespace>_nvme_corrupt_blocks_total, the blocks
// found corrupt either way and dropped.
func Store(s *nvme.Store, namespace string, constLabels prometheus.Labels) []prometheus.Collector {
	checked := func(gpu bool) func() float64 {
		return func() float64 {
			st := s.Stats()
			if gpu {
				return float64(st.DeferredChecks)
			}
			return float64(st.Reads - min(st.Reads, st.DeferredChecks))
		}
	}
	name := prometheus.BuildFQName(namespace, "nvme", "checked_blocks_total")
	return []prometheus.Collector{
		prometheus.NewCounterFunc(prometheus.CounterOpts{Name: name,
			Help: "NVMe blocks read, by where their payload was checked.", ConstLabels: with(constLabels, "on", "gpu")}, checked(true)),
		prometheus.NewCounterFunc(prometheus.CounterOpts{Name: name,
			Help: "NVMe blocks read, by where their payload was checked.", ConstLabels: with(constLabels, "on", "cpu")}, checked(false)),
		prometheus.NewCounterFunc(prometheus.CounterOpts{Name: prometheus.BuildFQName(namespace, "nvme", "corrupt_blocks_total"),
			Help: "NVMe blocks found corrupt (by the store, or on the GPU) and dropped.", ConstLabels: constLabels},
			func() float64 { return float64(s.Stats().CorruptDrops) }),
	}
}

// with returns labels plus name=value, leaving labels as it was.
func with(labels prometheus.Labels, name, value string) prometheus.Labels {
	out := make(prometheus.Labels, len(labels)+1)
	for k, v := range labels {
		out[k] = v
	}
	out[name] = value
	return out
}
