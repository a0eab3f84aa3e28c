package httpapi

import (
	"strconv"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"kvtier.dev/kvtier"
)

// metrics are the server's Prometheus series, all named kvserve_*. Per-tier
// and per-code children are made once, so that a request's observations
// allocate nothing.
type metrics struct {
	requests        *prometheus.CounterVec
	codes           map[int]prometheus.Counter // the codes this package answers
	canceled        prometheus.Counter
	ttft, interTok  prometheus.Histogram
	inFlight        prometheus.Gauge
	decoding        prometheus.Gauge
	prefilled       prometheus.Counter
	recomputed      prometheus.Counter
	generated       prometheus.Counter
	loadedTokens    [kvtier.NumTiers]prometheus.Counter
	loadedBytes     [kvtier.NumTiers]prometheus.Counter
	queueDepthGauge prometheus.GaugeFunc
}

// codeCanceled labels requests whose client went away before the end.
const codeCanceled = "canceled"

func newMetrics(reg prometheus.Registerer, queueDepth func() int) (*metrics, error) {
	m := &metrics{
		requests: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "kvserve_requests_total",
			Help: "Completion requests answered, by HTTP status code (canceled: the client went away)."}, []string{"code"}),
		ttft: prometheus.NewHistogram(prometheus.HistogramOpts{Name: "kvserve_ttft_seconds",
			Help:    "Time from a completion request's arrival to its first token.",
			Buckets: prometheus.ExponentialBucketsRange(0.001, 300, 24)}),
		interTok: prometheus.NewHistogram(prometheus.HistogramOpts{Name: "kvserve_inter_token_seconds",
			Help:    "Time between two consecutive tokens of one request.",
			Buckets: prometheus.ExponentialBucketsRange(0.0001, 10, 20)}),
		inFlight: prometheus.NewGauge(prometheus.GaugeOpts{Name: "kvserve_in_flight_requests",
			Help: "Completion requests being answered (queued, prefilling or decoding)."}),
		decoding: prometheus.NewGauge(prometheus.GaugeOpts{Name: "kvserve_decoding_requests",
			Help: "Completion requests whose body is being read and decoded, not yet in flight (at most Config.MaxDecodes)."}),
		prefilled: prometheus.NewCounter(prometheus.CounterOpts{Name: "kvserve_prefilled_tokens_total",
			Help: "Prompt tokens whose KV was computed (recomputed ones included)."}),
		recomputed: prometheus.NewCounter(prometheus.CounterOpts{Name: "kvserve_recomputed_tokens_total",
			Help: "Prompt tokens whose KV a tier held but that were computed anyway."}),
		generated: prometheus.NewCounter(prometheus.CounterOpts{Name: "kvserve_generated_tokens_total",
			Help: "Tokens generated."}),
		queueDepthGauge: prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "kvserve_queue_depth",
			Help: "Requests waiting to prefill."}, func() float64 { return float64(queueDepth()) }),
		codes: map[int]prometheus.Counter{},
	}
	loadedTokens := prometheus.NewCounterVec(prometheus.CounterOpts{Name: "kvserve_loaded_tokens_total",
		Help: "Prompt tokens whose KV was loaded from a tier instead of computed, by tier."}, []string{"tier"})
	loadedBytes := prometheus.NewCounterVec(prometheus.CounterOpts{Name: "kvserve_loaded_bytes_total",
		Help: "KV bytes read from a tier for requests, by tier."}, []string{"tier"})
	for t := range kvtier.NumTiers {
		m.loadedTokens[t] = loadedTokens.WithLabelValues(t.String())
		m.loadedBytes[t] = loadedBytes.WithLabelValues(t.String())
	}
	for _, c := range []int{200, 400, 408, 413, 429, 500, 503} {
		m.codes[c] = m.requests.WithLabelValues(strconv.Itoa(c))
	}
	m.canceled = m.requests.WithLabelValues(codeCanceled)
	for _, c := range []prometheus.Collector{m.requests, m.ttft, m.interTok, m.inFlight, m.decoding, m.prefilled,
		m.recomputed, m.generated, m.queueDepthGauge, loadedTokens, loadedBytes} {
		if err := reg.Register(c); err != nil {
			return nil, err
		}
	}
	return m, nil
}

// answered counts a request answered with code.
func (m *metrics) answered(code int) {
	if c, ok := m.codes[code]; ok {
		c.Inc()
		return
	}
	m.requests.WithLabelValues(strconv.Itoa(code)).Inc()
}

// usage counts a finished request's prompt tokens by where their KV came
// from, and its generated tokens.
func (m *metrics) usage(u *Usage, promptTokens, generated int) {
	m.prefilled.Add(float64(promptTokens - u.CachedTokens()))
	m.recomputed.Add(float64(u.RecomputedTokens))
	m.generated.Add(float64(generated))
	for t := range kvtier.NumTiers {
		m.loadedTokens[t].Add(float64(u.LoadedTokens[t]))
		m.loadedBytes[t].Add(float64(u.LoadedBytes[t]))
	}
}

// tokenTimer observes a request's TTFT and inter-token gaps.
type tokenTimer struct {
	m     *metrics
	start time.Time
	last  time.Time
	n     int
}

func (t *tokenTimer) token(now time.Time) {
	if t.n == 0 {
		t.m.ttft.Observe(now.Sub(t.start).Seconds())
	} else {
		t.m.interTok.Observe(now.Sub(t.last).Seconds())
	}
	t.last = now
	t.n++
}
