package kvprom

import (
	"github.com/prometheus/client_golang/prometheus"

	"kvtier.dev/kvtier"
)

// TenantSource is what Tenants reads; *kvtier.Manager satisfies it.
type TenantSource interface {
	TenantMetrics() []kvtier.TenantMetrics
	Pinned() int
	CapacitySlots(t kvtier.Tier) int
}

// TenantCollector exports the per-tenant counters (kvtier.TenantMetrics)
// with a "tenant" label: each configured tenant's name, and "other" for
// every salt not configured, so the label's values stay bounded. Without
// Config.Tenants it reports only the pinned-block gauge.
type TenantCollector struct {
	src                                         TenantSource
	lookups, lookupBlocks, hitBlocks, hitTokens *prometheus.Desc
	hits, bytesIn, bytesOut, evictions          *prometheus.Desc
	resident, capacity, weight, pinned          *prometheus.Desc
}

var _ prometheus.Collector = (*TenantCollector)(nil)

// Tenants returns the collector of src's tenants: <namespace>_tenant_*
// series and <namespace>_pinned_blocks.
func Tenants(src TenantSource, namespace string, constLabels prometheus.Labels) *TenantCollector {
	ten, tier := []string{"tenant"}, []string{"tenant", "tier"}
	d := func(name, help string, labels []string) *prometheus.Desc {
		return prometheus.NewDesc(prometheus.BuildFQName(namespace, "", name), help, labels, constLabels)
	}
	return &TenantCollector{
		src:          src,
		lookups:      d("tenant_lookups_total", "Lookups of the tenant's salt.", ten),
		lookupBlocks: d("tenant_lookup_blocks_total", "Full blocks the tenant's lookups asked for.", ten),
		hitBlocks:    d("tenant_hit_blocks_total", "Blocks in the prefixes the tenant's lookups returned.", ten),
		hitTokens:    d("tenant_hit_tokens_total", "Tokens of the blocks the tenant's lookups returned.", ten),
		hits:         d("tenant_hits_total", "The tenant's looked-up blocks served from the tier (their fastest).", tier),
		bytesIn:      d("tenant_bytes_in_total", "Bytes of the tenant's blocks written into the tier.", tier),
		bytesOut:     d("tenant_bytes_out_total", "Bytes of the tenant's blocks copied out of the tier.", tier),
		evictions:    d("tenant_evictions_total", "The tenant's blocks evicted from the tier.", tier),
		resident:     d("tenant_resident_blocks", "Slots of the tier holding the tenant's blocks.", tier),
		capacity:     d("tenant_cap_blocks", "The tenant's cap of the tier's slots (0: none).", tier),
		weight:       d("tenant_weight", "The tenant's weight in a contended tier.", ten),
		pinned:       d("pinned_blocks", "Blocks pinned (Manager.Pin) and not expired at the last eviction.", nil),
	}
}

// Describe implements prometheus.Collector.
func (c *TenantCollector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{c.lookups, c.lookupBlocks, c.hitBlocks, c.hitTokens,
		c.hits, c.bytesIn, c.bytesOut, c.evictions, c.resident, c.capacity, c.weight, c.pinned} {
		ch <- d
	}
}

// Collect implements prometheus.Collector.
func (c *TenantCollector) Collect(ch chan<- prometheus.Metric) {
	metric := func(d *prometheus.Desc, kind prometheus.ValueType, v float64, labels ...string) {
		ch <- prometheus.MustNewConstMetric(d, kind, v, labels...)
	}
	counter := prometheus.CounterValue
	gauge := prometheus.GaugeValue
	for _, tm := range c.src.TenantMetrics() {
		metric(c.lookups, counter, float64(tm.Lookups), tm.Name)
		metric(c.lookupBlocks, counter, float64(tm.LookupBlocks), tm.Name)
		metric(c.hitBlocks, counter, float64(tm.HitBlocks), tm.Name)
		metric(c.hitTokens, counter, float64(tm.HitTokens), tm.Name)
		metric(c.weight, gauge, tm.Weight, tm.Name)
		for t := range kvtier.NumTiers {
			if c.src.CapacitySlots(t) == 0 {
				continue // tier not configured
			}
			s, name := &tm.Tiers[t], t.String()
			metric(c.hits, counter, float64(s.Hits), tm.Name, name)
			metric(c.bytesIn, counter, float64(s.BytesIn), tm.Name, name)
			metric(c.bytesOut, counter, float64(s.BytesOut), tm.Name, name)
			metric(c.evictions, counter, float64(s.Evictions), tm.Name, name)
			metric(c.resident, gauge, float64(s.ResidentBlocks), tm.Name, name)
			metric(c.capacity, gauge, float64(s.CapSlots), tm.Name, name)
		}
	}
	metric(c.pinned, gauge, float64(c.src.Pinned()))
}
