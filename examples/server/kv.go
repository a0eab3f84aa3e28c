package main

import (
	"context"
	"errors"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"kvtier.dev/examples/server/internal/httpapi"
	"kvtier.dev/examples/server/internal/kvevents"
	"kvtier.dev/kvtier/kvprom"
)

// kvRoutes configures the API's /v1/kv routes over the cache, or none
// without one (-strategy none).
func kvRoutes(p *parts, s shape) *httpapi.KV {
	if p.cache == nil {
		return nil
	}
	bt := s.model.BlockTokens
	// The engine looks up the full blocks before the one holding the
	// prompt's last position, which it always computes (engine.attempt).
	kv := &httpapi.KV{Manager: p.cache.Manager, LookupTokens: func(n int) int { return (n - 1) / bt * bt }, Salt: p.cache.Salt}
	if rt := p.cache.Remote; rt != nil {
		kv.InvalidateRemote, kv.InvalidateRemoteSalt = rt.Invalidate, rt.InvalidateSalt
	}
	return kv
}

// startKVEvents registers the event stream's metrics and, with
// -kv-events-zmq, publishes the cache's events in vLLM's wire format until
// p closes (which lets the last events out first, for up to a second).
func startKVEvents(c *config, p *parts, reg prometheus.Registerer) error {
	if p.cache == nil || c.kvEventBuffer == 0 {
		if c.kvEventsZMQ != "" {
			return errors.New("-kv-events-zmq with -strategy none: there is no cache to publish the events of")
		}
		return nil
	}
	m := p.cache.Manager
	reg.MustRegister(kvprom.Events(m, "kvtier", nil)...)
	if c.kvEventsZMQ == "" {
		return nil
	}
	pub, err := kvevents.Start(kvevents.Config{Manager: m, PubAddr: c.kvEventsZMQ, ReplayAddr: c.kvEventsReplay,
		ReplayBatches: c.kvEventsReplayBatches, Topic: c.kvEventsTopic, Logger: c.log})
	if err != nil {
		return err
	}
	p.closers = append(p.closers, func() error {
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		defer cancel()
		return errors.Join(pub.WaitPublished(ctx, m.EventStats().Last), pub.Close())
	})
	stat := func(f func(kvevents.Stats) uint64) func() float64 {
		return func() float64 { return float64(f(pub.Stats())) }
	}
	for _, s := range []struct {
		name, help string
		f          func(kvevents.Stats) uint64
	}{
		{"messages_total", "EventBatches published on -kv-events-zmq (sequence numbers used).", func(s kvevents.Stats) uint64 { return s.Messages }},
		{"dropped_total", "EventBatches not sent to a subscriber whose connection fell behind.", func(s kvevents.Stats) uint64 { return s.Dropped }},
		{"lost_total", "Cache events the publisher lost behind the event ring (-kv-events-buffer).", func(s kvevents.Stats) uint64 { return s.Lost }},
		{"replays_total", "Replay requests answered on -kv-events-replay.", func(s kvevents.Stats) uint64 { return s.Replays }},
	} {
		reg.MustRegister(prometheus.NewCounterFunc(prometheus.CounterOpts{Name: "kvserve_kv_events_" + s.name, Help: s.help}, stat(s.f)))
	}
	reg.MustRegister(prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "kvserve_kv_events_published_seq",
		Help: "The number of the cache's last event published on -kv-events-zmq (or lost): kvtier_events_total once all are out."},
		func() float64 { return float64(pub.Stats().Upto) }))
	attrs := []any{"zmq", pub.Addr().String(), "topic", c.kvEventsTopic}
	if a := pub.ReplayAddr(); a != nil {
		attrs = append(attrs, "replay", a.String())
	}
	c.log.Info("server: the cache's events published in vLLM's wire format", attrs...)
	return nil
}
