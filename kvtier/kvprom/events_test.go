package kvprom

import (
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"kvtier.dev/kvtier"
)

type fakeEvents kvtier.EventStats

func (f fakeEvents) EventStats() kvtier.EventStats { return kvtier.EventStats(f) }

func TestEvents(t *testing.T) {
	reg := prometheus.NewRegistry()
	reg.MustRegister(Events(fakeEvents{Last: 12, Lost: 3, Subscribers: 2}, "kvtier", nil)...)
	want := `
# HELP kvtier_event_subscribers Subscriptions to the manager's events.
# TYPE kvtier_event_subscribers gauge
kvtier_event_subscribers 2
# HELP kvtier_events_lost_total Block events subscribers lost by falling more than the event ring behind.
# TYPE kvtier_events_lost_total counter
kvtier_events_lost_total 3
# HELP kvtier_events_total Block events the manager made (stored in, removed from or cleared from a tier); the last one's number.
# TYPE kvtier_events_total counter
kvtier_events_total 12
`
	if err := testutil.GatherAndCompare(reg, strings.NewReader(want)); err != nil {
		t.Fatal(err)
	}
}
