package kvprom

import (
	"github.com/prometheus/client_golang/prometheus"

	"kvtier.dev/kvtier"
)

// EventSource is what Events reads; *kvtier.Manager satisfies it.
type EventSource interface {
	EventStats() kvtier.EventStats
}

// Events returns the collectors of the manager's event stream:
// <namespace>_events_total (events made), <namespace>_events_lost_total
// (events subscribers lost by falling behind the ring) and
// <namespace>_event_subscribers.
func Events(src EventSource, namespace string, constLabels prometheus.Labels) []prometheus.Collector {
	name := func(n string) string { return prometheus.BuildFQName(namespace, "", n) }
	return []prometheus.Collector{
		prometheus.NewCounterFunc(prometheus.CounterOpts{Name: name("events_total"), ConstLabels: constLabels,
			Help: "Block events the manager made (stored in, removed from or cleared from a tier); the last one's number."},
			func() float64 { return float64(src.EventStats().Last) }),
		prometheus.NewCounterFunc(prometheus.CounterOpts{Name: name("events_lost_total"), ConstLabels: constLabels,
			Help: "Block events subscribers lost by falling more than the event ring behind."},
			func() float64 { return float64(src.EventStats().Lost) }),
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: name("event_subscribers"), ConstLabels: constLabels,
			Help: "Subscriptions to the manager's events."},
			func() float64 { return float64(src.EventStats().Subscribers) }),
	}
}
