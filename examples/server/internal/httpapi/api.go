package httpapi

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"runtime"
	"sync"
	"sync/atomic"
	"time"

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
	// MaxBodyBytes bounds a request body; 0 derives it from the model's
	// context: 16 KiB plus 16 bytes per token (32 KiB at a 1,024-token
	// context, 2 MiB at 131,072). A body whose Content-Length is over it
	// gets 413 before a byte of it is read.
	MaxBodyBytes int64
	// MaxDecodes bounds the completion requests whose bodies are read and
	// decoded at once; the others wait for a turn before their body is
	// read, so that bodies hold at most about MaxDecodes×MaxBodyBytes. 0
	// means twice GOMAXPROCS.
	MaxDecodes int
	// BodyTimeout bounds the time from a completion request's headers to
	// the end of its body, a wait for a decode turn included; a body not in
	// by then gets 408. 0 means 30 s (a 2 MiB body at 70 KB/s).
	BodyTimeout time.Duration
	// WriteTimeout bounds the time a client may take to accept one write of
	// its response (a streamed chunk, or a whole response); one that takes
	// longer is cut off and its request cancelled. 0 means 30 s.
	WriteTimeout time.Duration
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
	bodyTimeout  time.Duration
	writeTimeout time.Duration
	decodeTurns  chan struct{} // a token per body being read and decoded
	nextID       atomic.Uint64
	kv           *KV
	// streams ends when Drain begins: long-lived streams (/v1/kv/events)
	// stop then, as they are not requests in flight.
	streams    context.Context
	endStreams context.CancelFunc

	// drainCtx is cancelled when Drain begins: it refuses the requests
	// waiting for a decode turn and ends the body reads in progress.
	drainCtx   context.Context
	startDrain context.CancelFunc

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
		maxBodyBytes: cfg.MaxBodyBytes, bodyTimeout: cfg.BodyTimeout, writeTimeout: cfg.WriteTimeout, idle: make(chan struct{})}
	if err := a.setLimits(cfg); err != nil {
		return nil, err
	}
	if a.reg == nil {
		a.reg = prometheus.NewRegistry()
		a.reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
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

// setLimits fills the request limits of cfg, defaults for zeros, and
// refuses negative ones.
func (a *API) setLimits(cfg Config) error {
	switch {
	case cfg.DefaultMaxTokens < 0:
		return fmt.Errorf("httpapi: Config.DefaultMaxTokens %d is negative", cfg.DefaultMaxTokens)
	case cfg.MaxBodyBytes < 0:
		return fmt.Errorf("httpapi: Config.MaxBodyBytes %d is negative", cfg.MaxBodyBytes)
	case cfg.MaxDecodes < 0:
		return fmt.Errorf("httpapi: Config.MaxDecodes %d is negative", cfg.MaxDecodes)
	case cfg.BodyTimeout < 0:
		return fmt.Errorf("httpapi: Config.BodyTimeout %v is negative", cfg.BodyTimeout)
	case cfg.WriteTimeout < 0:
		return fmt.Errorf("httpapi: Config.WriteTimeout %v is negative", cfg.WriteTimeout)
	}
	if a.defaultMax == 0 {
		a.defaultMax = 16
	}
	if a.maxBodyBytes == 0 {
		a.maxBodyBytes = bodyCap(a.limits)
	}
	decodes := cfg.MaxDecodes
	if decodes == 0 {
		decodes = 2 * runtime.GOMAXPROCS(0)
	}
	a.decodeTurns = make(chan struct{}, decodes)
	if a.bodyTimeout == 0 {
		a.bodyTimeout = 30 * time.Second
	}
	if a.writeTimeout == 0 {
		a.writeTimeout = 30 * time.Second
	}
	a.drainCtx, a.startDrain = context.WithCancel(context.Background())
	return nil
}

// ServeHTTP serves the API's routes.
func (a *API) ServeHTTP(w http.ResponseWriter, r *http.Request) { a.mux.ServeHTTP(w, r) }

// Registry returns the registry /metrics serves.
func (a *API) Registry() *prometheus.Registry { return a.reg }

// Drain stops taking completion requests (new ones get 503, /healthz says
// draining; so do those whose body is still being read: their reads end)
// and waits until every request in flight has been answered, or ctx is
// done. The caller then shuts the HTTP server down and closes the
// engine (finishing its write-backs). Drain may be called more than once.
func (a *API) Drain(ctx context.Context) error {
	a.endStreams()
	a.mu.Lock()
	if !a.draining {
		a.draining = true
		a.startDrain()
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

// begin admits a decoded request unless the API is draining: from here
// until end, Drain waits for it.
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
