package engine

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"kvtier.dev/examples/server/internal/httpapi"
	"kvtier.dev/examples/server/internal/model"
	"kvtier.dev/kvtier"
	"kvtier.dev/kvtier/costplan"
	"kvtier.dev/kvtier/remotetier"
	"kvtier.dev/kvtier/stack"
)

// Runner is the model's forward pass over the KV region (model.CPU and
// gpu.Model behind an adapter). The engine calls it from one goroutine.
type Runner interface {
	// Forward computes p over tokens (see model.Plan) and returns the
	// last position's logits (valid until the next call) and the greedy
	// next token. fromCache lists the region slots of p whose KV
	// kvtier provides (found in or loaded into the GPU tier) rather than
	// this runner: a runner whose memory is not the device's reads them
	// after p.Ready(layer), layer by layer. When Forward returns, the KV
	// it computed is in the device's slots, where kvtier copies it from.
	Forward(tokens []int32, p model.Plan, fromCache []int32) ([]float32, int32, error)
}

// Config configures an Engine.
type Config struct {
	// Model is the model's shape.
	Model model.Config
	// Runner runs it. Required.
	Runner Runner
	// Cache is kvtier over the region's first CacheSlots slots (its GPU
	// tier). Required unless Strategy is None.
	Cache *stack.Cache
	// CacheSlots is the cache's GPU tier's slots; ScratchSlots follow
	// them in the region. ScratchSlots MUST hold the longest sequence,
	// Model.Blocks(ContextTokens), so that every request can run.
	CacheSlots, ScratchSlots int
	// ContextTokens is the longest sequence, prompt plus generated tokens,
	// e.g. 16384.
	ContextTokens int
	// Remote, if set, is the shared remote tier behind Cache: a request's
	// missing blocks are fetched from it into the host tier while it
	// waits, off the scheduler's goroutine, and the host blocks a prompt
	// finds are published to it.
	Remote *remotetier.Tier
	// RemoteTimeout bounds a request's remote fetch as a whole; the
	// request waits for it (others prefill and decode meanwhile), then
	// recomputes what did not come. 0 means 1 s.
	RemoteTimeout time.Duration
	// LayerWait says where a prefill's pass waits for each layer's loads:
	// on the device (LayerWaitDevice, the zero value) or on the host.
	LayerWait LayerWait
	// Strategy says how the cache is used (see Strategy).
	Strategy costplan.Strategy
	// MaxQueue is the most requests waiting to prefill; one more gets
	// httpapi.ErrQueueFull (429). 0 means 64.
	MaxQueue int
	// MaxBatch is the most sequences decoding at once; 0 means 16.
	MaxBatch int
	// PrefetchBlocks, when above 0, has the request next in line for the
	// GPU bring up to this many of its blocks from NVMe into the host tier
	// while the prefill before it runs (kvtier.Manager.Prefetch), so that
	// its plan finds them there. Only the next in line: the blocks of a
	// request further back would be evicted by those of the requests
	// before it. 0: no prefetch.
	PrefetchBlocks int
	// Registerer, if set, receives the engine's own series
	// (kvserve_failed_loads_total, kvserve_prefill_seconds,
	// kvserve_decode_step_seconds).
	Registerer prometheus.Registerer
	// Observer, if set, learns from the engine's measured passes and loads
	// (the cost model's calibration).
	Observer Observer
	// Logger, nil: slog.Default().
	Logger *slog.Logger
}

// Engine is the scheduler. It implements httpapi.Backend.
type Engine struct {
	cfg   Config
	log   *slog.Logger
	bt    int
	block int64 // bytes per block

	mu      sync.Mutex
	queue   []*seq
	closed  bool
	wake    chan struct{} // one token: work arrived or Close
	done    chan struct{} // closed when the scheduler has exited
	scratch scratchPool   // owned by the scheduler goroutine

	failedLoads prometheus.Counter
	prefillSecs prometheus.Histogram
	decodeSecs  prometheus.Histogram

	prefilling  atomic.Bool   // a prefill is running
	prefetchers chan struct{} // one token a prefetch running
	prefetched  prometheus.Counter
	spaceWaits  prometheus.Counter // prefills that waited for GPU slots
	spaceSecs   prometheus.Counter

	kvEvents []kvtier.Event // layerEvents scratch (the scheduler's)
}

// New checks cfg and starts the scheduler. The caller MUST Close the
// engine.
func New(cfg Config) (*Engine, error) {
	c := cfg.Model
	if err := c.Validate(); err != nil {
		return nil, fmt.Errorf("engine: Config.Model: %w", err)
	}
	switch {
	case cfg.Runner == nil:
		return nil, errors.New("engine: Config.Runner is nil")
	case cfg.Cache == nil && cfg.Strategy != costplan.None:
		return nil, fmt.Errorf("engine: Config.Cache is nil with strategy %v (only %v runs without one)", cfg.Strategy, costplan.None)
	case cfg.ContextTokens < 2:
		return nil, fmt.Errorf("engine: Config.ContextTokens %d: want at least 2", cfg.ContextTokens)
	case cfg.ScratchSlots < c.Blocks(cfg.ContextTokens):
		return nil, fmt.Errorf("engine: Config.ScratchSlots %d: the longest sequence (%d tokens) takes %d blocks of %d tokens",
			cfg.ScratchSlots, cfg.ContextTokens, c.Blocks(cfg.ContextTokens), c.BlockTokens)
	case cfg.LayerWait >= NumLayerWaits:
		return nil, fmt.Errorf("engine: Config.LayerWait %v: want %v or %v", cfg.LayerWait, LayerWaitDevice, LayerWaitHost)
	case cfg.CacheSlots < 0 || cfg.MaxQueue < 0 || cfg.MaxBatch < 0 || cfg.PrefetchBlocks < 0:
		return nil, fmt.Errorf("engine: Config: CacheSlots %d, MaxQueue %d, MaxBatch %d and PrefetchBlocks %d must not be negative",
			cfg.CacheSlots, cfg.MaxQueue, cfg.MaxBatch, cfg.PrefetchBlocks)
	}
	if cfg.Cache != nil && cfg.Cache.BlockTokens() != c.BlockTokens {
		return nil, fmt.Errorf("engine: the cache's blocks hold %d tokens, the model's %d", cfg.Cache.BlockTokens(), c.BlockTokens)
	}
	if cfg.MaxQueue == 0 {
		cfg.MaxQueue = 64
	}
	if cfg.MaxBatch == 0 {
		cfg.MaxBatch = 16
	}
	e := &Engine{cfg: cfg, log: cfg.Logger, bt: c.BlockTokens, block: c.BlockBytes(),
		wake: make(chan struct{}, 1), done: make(chan struct{}),
		scratch: newScratchPool(int32(cfg.CacheSlots), cfg.ScratchSlots), prefetchers: make(chan struct{}, prefetchers)}
	if e.log == nil {
		e.log = slog.Default()
	}
	e.failedLoads = prometheus.NewCounter(prometheus.CounterOpts{Name: "kvserve_failed_loads_total",
		Help: "Prefills whose KV loads failed (a corrupt or lost block) and that were looked up again and recomputed."})
	e.prefillSecs = prometheus.NewHistogram(prometheus.HistogramOpts{Name: "kvserve_prefill_seconds",
		Help:    "Time from the start of a request's prefill (its lookup) to its first token, queueing excluded.",
		Buckets: prometheus.ExponentialBucketsRange(0.0005, 120, 24)})
	e.decodeSecs = prometheus.NewHistogram(prometheus.HistogramOpts{Name: "kvserve_decode_step_seconds",
		Help:    "Time of one decode step of one sequence (a forward pass of one position); the steps of the sequences decoding run one after the other between two prefills.",
		Buckets: prometheus.ExponentialBucketsRange(0.0005, 10, 24)})
	e.prefetched = prometheus.NewCounter(prometheus.CounterOpts{Name: "kvserve_prefetched_blocks_total",
		Help: "Blocks copied from NVMe into the host tier for requests while they waited for the GPU (Config.PrefetchBlocks)."})
	e.spaceWaits = prometheus.NewCounter(prometheus.CounterOpts{Name: "kvserve_space_waits_total",
		Help: "Prefills that waited for copies out of the GPU (write-through copies, offloads) to free the slots of the blocks they compute."})
	e.spaceSecs = prometheus.NewCounter(prometheus.CounterOpts{Name: "kvserve_space_wait_seconds_total",
		Help: "Time prefills waited for copies out of the GPU to free slots."})
	if cfg.Registerer != nil {
		for _, col := range []prometheus.Collector{e.failedLoads, e.prefillSecs, e.decodeSecs, e.prefetched, e.spaceWaits, e.spaceSecs} {
			if err := cfg.Registerer.Register(col); err != nil {
				return nil, fmt.Errorf("engine: metrics: %w", err)
			}
		}
	}
	go e.run()
	return e, nil
}

// Limits implements httpapi.Backend.
func (e *Engine) Limits() httpapi.Limits {
	return httpapi.Limits{Model: e.cfg.Model.Name, ContextTokens: e.cfg.ContextTokens, VocabSize: e.cfg.Model.Vocab}
}

// errClosed answers a Submit after Close.
var errClosed = errors.New("engine: closed")

// Submit implements httpapi.Backend: it queues req, or returns
// httpapi.ErrQueueFull.
func (e *Engine) Submit(ctx context.Context, req *httpapi.Request, out *httpapi.Stream) error {
	if n := len(req.Tokens) + req.MaxTokens - 1; n > e.cfg.ContextTokens || len(req.Tokens) == 0 || req.MaxTokens < 1 {
		return fmt.Errorf("engine: request %s: %d prompt tokens and max_tokens %d do not fit the context of %d", req.ID, len(req.Tokens), req.MaxTokens, e.cfg.ContextTokens)
	}
	if e.cfg.Cache != nil {
		// The tenant's salt folded with the model's: no block another
		// model computed (an NVMe directory or remote prefix it wrote) is
		// ever a hit. Every lookup and insert below uses req.Salt.
		req.Salt = e.cfg.Cache.Salt(req.Salt)
	}
	s := &seq{req: req, ctx: ctx, out: out, noCache: req.NoCache || e.cfg.Strategy == costplan.None, submitted: time.Now()}
	e.mu.Lock()
	switch {
	case e.closed:
		e.mu.Unlock()
		return errClosed
	case len(e.queue) >= e.cfg.MaxQueue:
		e.mu.Unlock()
		return fmt.Errorf("engine: %d requests waiting: %w", len(e.queue), httpapi.ErrQueueFull)
	}
	e.startFetch(s)
	e.queue = append(e.queue, s)
	var head *seq
	if e.prefilling.Load() {
		head = e.headLocked()
	}
	e.mu.Unlock()
	e.signal()
	e.prefetch(head)
	return nil
}

// QueueDepth implements httpapi.Backend.
func (e *Engine) QueueDepth() int {
	e.mu.Lock()
	defer e.mu.Unlock()
	return len(e.queue)
}

func (e *Engine) signal() {
	select {
	case e.wake <- struct{}{}:
	default:
	}
}

// Close stops taking requests, lets the scheduler finish every request
// queued or generating, and returns once it has. It does not close the
// cache: the caller does, after Close (Cache.Close waits for the
// write-backs and closes the NVMe store).
func (e *Engine) Close() error {
	e.mu.Lock()
	e.closed = true
	e.mu.Unlock()
	e.signal()
	<-e.done
	return nil
}

// run is the scheduler: one prefill, then one decode step of each
// generating sequence, until closed with nothing left.
func (e *Engine) run() {
	defer close(e.done)
	var active []*seq
	for {
		s := e.next(len(active))
		if s != nil && e.prefill(s) {
			active = append(active, s)
		}
		kept := active[:0]
		for _, s := range active {
			if e.decode(s) {
				kept = append(kept, s)
			}
		}
		clear(active[len(kept):])
		active = kept
		if len(active) > 0 {
			continue
		}
		e.mu.Lock()
		empty := len(e.queue) == 0
		closed := e.closed
		e.mu.Unlock()
		if empty && closed {
			return
		}
		if empty || s == nil { // nothing queued, or nothing ready: a fetch's end or Submit wakes it
			<-e.wake
		}
	}
}

// next pops the oldest queued request whose remote fetch has ended, if a
// sequence may start: fewer than MaxBatch generating and the scratch
// slots it may need free. A request still fetching is passed over, not
// waited for.
func (e *Engine) next(active int) *seq {
	if active >= e.cfg.MaxBatch {
		return nil
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	i := 0
	for i < len(e.queue) && !e.queue[i].fetchDone() {
		i++
	}
	if i == len(e.queue) {
		return nil
	}
	s := e.queue[i]
	if e.scratch.free() < e.cfg.Model.Blocks(s.positions()) {
		return nil // the decodes under way free scratch slots as they end
	}
	copy(e.queue[i:], e.queue[i+1:])
	e.queue[len(e.queue)-1] = nil
	e.queue = e.queue[:len(e.queue)-1]
	e.prefetch(e.headLocked()) // it waits for s's prefill at least
	return s
}
