package kvprom

import (
	"github.com/prometheus/client_golang/prometheus"

	"kvtier.dev/kvtier/remote"
	"kvtier.dev/kvtier/remotetier"
)

// Remote returns the collectors of the shared remote tier: its store's
// reads and writes by result (<namespace>_remote_reads_total,
// <namespace>_remote_writes_total), the bytes moved
// (<namespace>_remote_bytes_total by dir), its circuit breaker
// (<namespace>_remote_breaker_open, 1 while open or probing, and
// <namespace>_remote_breaker_opens_total), and what the tier did with them
// (<namespace>_remote_fetched_blocks_total, _fetch_misses_total,
// _published_blocks_total). A read's "corrupt" result is a value that did
// not verify (forged, another deployment's, or damaged): it is deleted.
func Remote(rt *remotetier.Tier, namespace string, constLabels prometheus.Labels) []prometheus.Collector {
	c := rt.Cache()
	stat := func(f func(remote.Stats) uint64) func() float64 {
		return func() float64 { return float64(f(c.Stats())) }
	}
	type series struct {
		label string
		f     func(remote.Stats) uint64
	}
	var cs []prometheus.Collector
	counters := func(name, help, label string, ss []series) {
		fq := prometheus.BuildFQName(namespace, "remote", name)
		for _, s := range ss {
			cs = append(cs, prometheus.NewCounterFunc(prometheus.CounterOpts{Name: fq, Help: help,
				ConstLabels: with(constLabels, label, s.label)}, stat(s.f)))
		}
	}
	counters("reads_total", "Blocks read from the remote tier, by result.", "result", []series{
		{"hit", func(s remote.Stats) uint64 { return s.Hits }},
		{"absent", func(s remote.Stats) uint64 { return s.Absent }},
		{"incomplete", func(s remote.Stats) uint64 { return s.Incomplete }},
		{"corrupt", func(s remote.Stats) uint64 { return s.Corrupt }},
		{"refused", func(s remote.Stats) uint64 { return s.Refused }},
		{"failed", func(s remote.Stats) uint64 { return s.Failed }},
	})
	counters("writes_total", "Blocks offered to the remote tier, by what became of them.", "result", []series{
		{"written", func(s remote.Stats) uint64 { return s.Written }},
		{"deduplicated", func(s remote.Stats) uint64 { return s.Deduplicated }},
		{"dropped_full", func(s remote.Stats) uint64 { return s.DroppedFull }},
		{"dropped_pending", func(s remote.Stats) uint64 { return s.DroppedPending }},
		{"dropped_open", func(s remote.Stats) uint64 { return s.DroppedOpen }},
		{"rejected", func(s remote.Stats) uint64 { return s.Rejected }},
		{"error", func(s remote.Stats) uint64 { return s.WriteErrors }},
	})
	counters("bytes_total", "Payload bytes moved to and from the remote tier, by direction.", "dir", []series{
		{"read", func(s remote.Stats) uint64 { return s.BytesRead }},
		{"write", func(s remote.Stats) uint64 { return s.BytesWritten }},
	})
	cs = append(cs,
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: prometheus.BuildFQName(namespace, "remote", "breaker_open"),
			Help: "1 while the remote tier's circuit breaker is open or probing (reads miss at once, writes are dropped), else 0.", ConstLabels: constLabels},
			func() float64 {
				if c.Stats().BreakerOpen {
					return 1
				}
				return 0
			}),
		prometheus.NewCounterFunc(prometheus.CounterOpts{Name: prometheus.BuildFQName(namespace, "remote", "breaker_opens_total"),
			Help: "Times the remote tier's circuit breaker opened.", ConstLabels: constLabels}, stat(func(s remote.Stats) uint64 { return s.BreakerOpens })))
	tier := func(name, help string, f func(remotetier.Stats) uint64) prometheus.Collector {
		return prometheus.NewCounterFunc(prometheus.CounterOpts{Name: prometheus.BuildFQName(namespace, "remote", name), Help: help, ConstLabels: constLabels},
			func() float64 { return float64(f(rt.Stats())) })
	}
	return append(cs,
		tier("fetched_blocks_total", "Blocks fetched from the remote tier into the host tier.", func(s remotetier.Stats) uint64 { return s.Fetched }),
		tier("fetch_misses_total", "Blocks a fetch asked the remote tier for and did not get.", func(s remotetier.Stats) uint64 { return s.FetchMisses }),
		tier("published_blocks_total", "Blocks queued for writing to the remote tier.", func(s remotetier.Stats) uint64 { return s.Published }))
}
