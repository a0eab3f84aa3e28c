package httpapi

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"sync"
	"sync/atomic"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"kvtier.dev/internal/openai"
)

// Config configures an API.
type Config struct {
	// Backend is the model engine. Required.
	Backend Backend
	// Registry receives the server's metrics and is what /metrics serves;
	// register kvtier's collector (kvprom) in it too. nil makes a new one
	// with the Go runtime's and the process's collectors (memory, CPU,
	// file descriptors) in it.
	Registry *prometheus.Registry
	// DefaultMaxTokens is max_tokens when a request omits it; 0 means 16,
	// OpenAI's default.
	DefaultMaxTokens int
	// MaxBodyBytes bounds a request body; 0 means 16 MiB (a 128k-token
	// prompt as an id array is about 1 MiB).
	MaxBodyBytes int64
	// KV, when set, serves the /v1/kv routes over the cache (kv.go).
	KV *KV
}

// API serves the routes of the package doc over a Backend. It is an
// http.Handler.
type API struct {
	backend      Backend
	limits       Limits
	reg          *prometheus.Registry
	m            *metrics
	mux          *http.ServeMux
	defaultMax   int
	maxBodyBytes int64
	nextID       atomic.Uint64
	kv           *KV
	// streams ends when Drain begins: long-lived streams (/v1/kv/events)
	// stop then, as they are not requests in flight.
	streams    context.Context
	endStreams context.CancelFunc

	mu       sync.Mutex
	inFlight int
	draining bool
	idle     chan struct{} // closed once draining with nothing in flight
}

// New returns an API over cfg.Backend.
func New(cfg Config) (*API, error) {
	if cfg.Backend == nil {
		return nil, errors.New("httpapi: Config.Backend is nil")
	}
	lim := cfg.Backend.Limits()
	if lim.ContextTokens < 2 {
		return nil, fmt.Errorf("httpapi: Limits.ContextTokens %d: want at least 2 (one prompt token, one generated)", lim.ContextTokens)
	}
	if lim.VocabSize < 1 {
		return nil, fmt.Errorf("httpapi: Limits.VocabSize %d: want at least 1", lim.VocabSize)
	}
	a := &API{backend: cfg.Backend, limits: lim, reg: cfg.Registry, defaultMax: cfg.DefaultMaxTokens,
		maxBodyBytes: cfg.MaxBodyBytes, idle: make(chan struct{})}
	if a.reg == nil {
		a.reg = prometheus.NewRegistry()
		a.reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	}
	if a.defaultMax == 0 {
		a.defaultMax = 16
	}
	if a.defaultMax < 0 {
		return nil, fmt.Errorf("httpapi: Config.DefaultMaxTokens %d is negative", a.defaultMax)
	}
	if a.maxBodyBytes == 0 {
		a.maxBodyBytes = 16 << 20
	}
	var err error
	if a.m, err = newMetrics(a.reg, cfg.Backend.QueueDepth); err != nil {
		return nil, fmt.Errorf("httpapi: metrics: %w", err)
	}
	a.mux = http.NewServeMux()
	a.mux.HandleFunc("POST "+openai.CompletionsPath, a.completions)
	a.mux.Handle("GET /metrics", promhttp.HandlerFor(a.reg, promhttp.HandlerOpts{}))
	a.mux.HandleFunc("GET /healthz", a.healthz)
	a.streams, a.endStreams = context.WithCancel(context.Background())
	if cfg.KV != nil {
		if err := a.kvRoutes(cfg.KV); err != nil {
			return nil, err
		}
	}
	return a, nil
}

// ServeHTTP serves the API's routes.
func (a *API) ServeHTTP(w http.ResponseWriter, r *http.Request) { a.mux.ServeHTTP(w, r) }

// Registry returns the registry /metrics serves.
func (a *API) Registry() *prometheus.Registry { return a.reg }

// Drain stops taking completion requests (new ones get 503, /healthz says
// draining) and waits until every request in flight has been answered, or
// ctx is done. The caller then shuts the HTTP server down and closes the
// engine (finishing its write-backs). Drain may be called more than once.
func (a *API) Drain(ctx context.Context) error {
	a.endStreams()
	a.mu.Lock()
	if !a.draining {
		a.draining = true
		if a.inFlight == 0 {
			close(a.idle)
		}
	}
	a.mu.Unlock()
	select {
	case <-a.idle:
		return nil
	case <-ctx.Done():
		a.mu.Lock()
		n := a.inFlight
		a.mu.Unlock()
		return fmt.Errorf("httpapi: drain: %d requests still in flight: %w", n, ctx.Err())
	}
}

// begin admits a request unless the API is draining.
func (a *API) begin() bool {
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.draining {
		return false
	}
	a.inFlight++
	a.m.inFlight.Inc()
	return true
}

// end marks an admitted request answered.
func (a *API) end() {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.inFlight--
	a.m.inFlight.Dec()
	if a.draining && a.inFlight == 0 {
		close(a.idle)
	}
}

func (a *API) healthz(w http.ResponseWriter, _ *http.Request) {
	a.mu.Lock()
	draining := a.draining
	a.mu.Unlock()
	w.Header().Set("Content-Type", "text/plain; charset=utf-8")
	if draining {
		w.WriteHeader(http.StatusServiceUnavailable)
		fmt.Fprintln(w, "draining")
		return
	}
	fmt.Fprintln(w, "ok")
}
