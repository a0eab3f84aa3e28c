// Package kvprom exports kvtier's metrics to Prometheus: the block
// manager's (Collector), the mover's and the NVMe store's (Mover, Store),
// and the shared remote tier's (Remote).
// It is the only kvtier package that imports prometheus/client_golang, so
// that the parts themselves do not depend on it.
//
// Each scrape takes one kvtier.Metrics snapshot (atomic counters and gauges
// read under the manager's lock for a moment) and reports it; nothing is
// kept between scrapes. Per-tier series carry a "tier" label (gpu, host,
// nvme) and exist only for the tiers configured.
package kvprom

import (
	"github.com/prometheus/client_golang/prometheus"

	"kvtier.dev/kvtier"
)

// Source is what the collector reads; *kvtier.Manager satisfies it.
type Source interface {
	Metrics() kvtier.Metrics
}

// Collector implements prometheus.Collector over a Source.
type Collector struct {
	src Source

	hits, misses, bytesIn, bytesOut, evictions, demotions *prometheus.Desc
	resident, inUse, capacity                             *prometheus.Desc
	lookups, lookupBlocks, hitBlocks                      *prometheus.Desc
	mismatches, noSpace, moveFailures, records            *prometheus.Desc
	droppedTouches, invalidations, holeBlocks, recomputes *prometheus.Desc
	refused                                               *prometheus.Desc
}

var _ prometheus.Collector = (*Collector)(nil)

// New returns a collector of src's metrics. namespace prefixes every metric
// name ("kvtier" gives kvtier_hits_total); constLabels are added to every
// series (for example the model or the server instance).
func New(src Source, namespace string, constLabels prometheus.Labels) *Collector {
	tier := []string{"tier"}
	d := func(name, help string, labels []string) *prometheus.Desc {
		return prometheus.NewDesc(prometheus.BuildFQName(namespace, "", name), help, labels, constLabels)
	}
	return &Collector{
		src:          src,
		hits:         d("hits_total", "Looked-up blocks served from the tier (their fastest ready tier).", tier),
		misses:       d("misses_total", "Looked-up blocks the tier could not serve and no faster tier served.", tier),
		bytesIn:      d("bytes_in_total", "Bytes written into the tier by completed copies and committed inserts.", tier),
		bytesOut:     d("bytes_out_total", "Bytes copied out of the tier by completed copies.", tier),
		evictions:    d("evictions_total", "Blocks evicted from the tier to make room (demoted or dropped).", tier),
		demotions:    d("demotions_total", "Evicted blocks copied to the next tier (write-back).", tier),
		resident:     d("resident_blocks", "Slots of the tier holding a block (being written, ready or being evicted).", tier),
		inUse:        d("in_use_blocks", "Resident blocks of the tier held by a lease or a copy.", tier),
		capacity:     d("capacity_blocks", "Slots of the tier.", tier),
		lookups:      d("lookups_total", "Lookups.", nil),
		lookupBlocks: d("lookup_blocks_total", "Full blocks asked for by lookups.", nil),
		hitBlocks:    d("hit_blocks_total", "Blocks in the prefixes lookups returned.", nil),
		mismatches:   d("mismatches_total", "Blocks whose key matched but whose salt, parent, position or tokens did not (served as misses).", nil),
		noSpace:      d("no_space_total", "Slot allocations that found nothing to evict.", nil),
		moveFailures: d("move_failures_total", "Copies the mover reported as failed.", nil),
		records:      d("records", "Blocks known to the manager.", nil),
		droppedTouches: d("dropped_touches_total",
			"Policy touches and admission records of lookups dropped because their stripe's queue was full (recency is then approximate).", nil),
		invalidations: d("invalidations_total", "Blocks forgotten by Invalidate or InvalidateSalt.", nil),
		holeBlocks:    d("hole_blocks_total", "Missing blocks lookups skipped to return cached blocks after them.", nil),
		recomputes: d("onboard_recomputes_total",
			"Blocks the plan said to load that Onboard recomputed, by reason (no_gpu_slot, gpu_busy, source_lost).", []string{"reason"}),
		refused: d("writes_refused_total",
			"Copies into the tier the manager did not make, by reason (not_admitted, not_worth, over_rate, over_endurance, queue_full).", []string{"tier", "reason"}),
	}
}

// Describe implements prometheus.Collector.
func (c *Collector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{
		c.hits, c.misses, c.bytesIn, c.bytesOut, c.evictions, c.demotions,
		c.resident, c.inUse, c.capacity,
		c.lookups, c.lookupBlocks, c.hitBlocks, c.mismatches, c.noSpace, c.moveFailures, c.records,
		c.droppedTouches, c.invalidations, c.holeBlocks, c.recomputes, c.refused,
	} {
		ch <- d
	}
}

// Collect implements prometheus.Collector.
func (c *Collector) Collect(ch chan<- prometheus.Metric) {
	m := c.src.Metrics()
	counter := func(d *prometheus.Desc, v uint64, labels ...string) {
		ch <- prometheus.MustNewConstMetric(d, prometheus.CounterValue, float64(v), labels...)
	}
	gauge := func(d *prometheus.Desc, v int64, labels ...string) {
		ch <- prometheus.MustNewConstMetric(d, prometheus.GaugeValue, float64(v), labels...)
	}
	for t := range kvtier.NumTiers {
		tm := &m.Tiers[t]
		if tm.CapacitySlots == 0 {
			continue // tier not configured
		}
		name := t.String()
		counter(c.hits, tm.Hits, name)
		counter(c.misses, tm.Misses, name)
		counter(c.bytesIn, tm.BytesIn, name)
		counter(c.bytesOut, tm.BytesOut, name)
		counter(c.evictions, tm.Evictions, name)
		counter(c.demotions, tm.Demotions, name)
		gauge(c.resident, tm.ResidentBlocks, name)
		gauge(c.inUse, tm.InUseBlocks, name)
		gauge(c.capacity, tm.CapacitySlots, name)
		for r := kvtier.NotAdmitted; r < kvtier.NumRefusals; r++ {
			counter(c.refused, tm.Refused[r], name, r.String())
		}
	}
	counter(c.lookups, m.Lookups)
	counter(c.lookupBlocks, m.LookupBlocks)
	counter(c.hitBlocks, m.HitBlocks)
	counter(c.mismatches, m.Mismatches)
	counter(c.noSpace, m.NoSpace)
	counter(c.moveFailures, m.MoveFailures)
	counter(c.droppedTouches, m.DroppedTouches)
	counter(c.invalidations, m.Invalidations)
	counter(c.holeBlocks, m.HoleBlocks)
	for why := kvtier.Planned + 1; why < kvtier.NumReasons; why++ {
		counter(c.recomputes, m.Recomputes[why], why.String())
	}
	gauge(c.records, m.Records)
}
