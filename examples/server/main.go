// Server is a model server built on kvtier: an OpenAI-style completions
// endpoint over a Llama-architecture model with seeded weights, whose KV
// cache lives in kvtier's GPU, pinned host and NVMe tiers.
//
//	go run ./examples/server                          # the tiny model; on the CPU without a GPU
//	go run ./examples/server -model llama-3.1-8b -gpu-kv 4GiB -host 64GiB -nvme 256GiB -nvme-dir /data/kv
//	curl -s localhost:8080/v1/completions -d '{"prompt": "Hello", "max_tokens": 8}'
//	kvtier bench-serve --url http://127.0.0.1:8080 --vocab 512   # the tiny model's vocabulary
//
// Routes: POST /v1/completions (prompt as text, byte-level tokens, or token
// ids; max_tokens; stream; user or salt select the tenant, whose KV is never
// shared with another's; no_cache for a reference answer), GET /metrics
// (kvtier's series and the server's), GET /healthz, and for routers
// POST /v1/kv/lookup (how much of a prompt each tier holds) and GET
// /v1/kv/events (the cache's block events; -kv-events-zmq also publishes
// them in vLLM's wire format). With -admin-addr, an operator's API on its
// own address, behind -admin-token-file's bearer token (mode 0600): evict
// or invalidate a prefix or a tenant, flush, drain, the tiers' state
// (/admin/v1/, see internal/httpapi's admin.go). See internal/httpapi for
// the status codes and internal/engine for the scheduler and the path of a
// request through kvtier.
//
// Without a GPU (or with -device cpu) the model runs on the CPU, the
// reference backend, and kvtier's copies go through the simulated device
// with the H200's link model; the log says so at start.
//
// -strategy makes the server its own baseline: cost (kvtier's cost model
// decides load or recompute per block), reload, recompute, gpu-only (prefix
// caching in GPU memory alone) and none (no prefix cache).
//
// What a client can hold is bounded (-header-timeout, -body-timeout,
// -write-timeout, -idle-timeout, -max-conns; a body's size by -context).
//
// SIGTERM or SIGINT drains: new requests get 503, those in flight finish,
// the write-backs finish (Cache.Flush), the NVMe store closes; with
// -nvme-dir the next start adopts the blocks left there.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"

	"kvtier.dev/examples/server/internal/engine"
	"kvtier.dev/examples/server/internal/httpapi"
	"kvtier.dev/internal/bytesize"
	"kvtier.dev/kvtier"
	"kvtier.dev/kvtier/kvprom"
)

func main() {
	c, err := parseArgs(os.Args[1:], os.Stderr)
	if errors.Is(err, flag.ErrHelp) {
		return
	}
	if err != nil {
		fmt.Fprintf(os.Stderr, "server: %v\n", err)
		os.Exit(2)
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := run(ctx, &c, nil); err != nil {
		c.log.Error("server: " + err.Error())
		os.Exit(1)
	}
}

// run serves until ctx is done, then drains and closes. listening, if set,
// is told the address once the server listens.
func run(ctx context.Context, c *config, listening func(addr string)) error {
	ctx, drain := context.WithCancel(ctx) // the operator's API drains as SIGTERM does
	defer drain()
	s, err := c.shape()
	if err != nil {
		return err
	}
	p, err := build(ctx, c, s)
	if err != nil {
		return err
	}
	p.startDrive(ctx, c, s)
	if p.cache != nil && !c.serveWhilePinning {
		start := time.Now()
		switch err := p.cache.WaitHostPinned(ctx); {
		case ctx.Err() != nil:
			return errors.Join(fmt.Errorf("stopped while the host tier was being pinned: %w", err), p.close())
		case err != nil: // the tier keeps what was pinned (the cache logged why)
			c.log.Warn("server: the host tier is smaller than asked", "slots", p.cache.CapacitySlots(kvtier.Host), "err", err)
		default:
			c.log.Info("server: host tier pinned before listening (-serve-while-pinning to listen sooner)", "waited_s", time.Since(start).Seconds())
		}
	}
	if err := p.warmUp(c, s); err != nil {
		return errors.Join(err, p.close())
	}
	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	if p.cache != nil {
		reg.MustRegister(kvprom.New(p.cache.Manager, "kvtier", nil))
		reg.MustRegister(kvprom.Tenants(p.cache.Manager, "kvtier", nil))
		reg.MustRegister(kvprom.Mover(p.cache.Mover, "kvserve", nil)...)
		reg.MustRegister(kvprom.Engine(p.cache.Engine, "kvserve", nil)...)
		reg.MustRegister(kvprom.Pinned(p.cache.Pool(), "kvserve", nil)...)
		if p.remote != nil {
			reg.MustRegister(kvprom.Remote(p.remote, "kvserve", nil)...)
		}
		if p.cache.Store != nil {
			reg.MustRegister(kvprom.Store(p.cache.Store, "kvserve", nil)...)
			blocks := s.model.Blocks(s.context)
			reg.MustRegister(prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "kvserve_nvme_break_even_block",
				Help: "The first block of the context from which a load from NVMe beats recomputing it at the drive's current rates (-1: none, the tier writes nothing worth it)."},
				func() float64 { return float64(p.nvme.breakEven(blocks)) }))
		}
	}
	if err := startKVEvents(c, p, reg); err != nil {
		return errors.Join(err, p.close())
	}
	eng, err := engine.New(engine.Config{Model: s.model, Runner: p.runner, Cache: p.cache, Remote: p.remote, RemoteTimeout: c.remoteFetchTimeout, CacheSlots: s.cacheSlots,
		ScratchSlots: s.scratch, ContextTokens: s.context, Strategy: c.strategy, LayerWait: c.layerWait, MaxQueue: c.maxQueue,
		MaxBatch: c.maxBatch, PrefetchBlocks: c.prefetchBlocks, Observer: p.cal.observer(), Registerer: reg, Logger: c.log})
	if err != nil {
		return errors.Join(err, p.close())
	}
	api, err := httpapi.New(httpapi.Config{Backend: eng, Registry: reg, DefaultMaxTokens: c.defaultMaxTokens,
		BodyTimeout: c.http.bodyTimeout, WriteTimeout: c.http.writeTimeout, KV: kvRoutes(p, s)})
	if err != nil {
		return errors.Join(err, eng.Close(), p.close())
	}
	if err := startAdmin(c, p, api, drain); err != nil {
		return errors.Join(err, eng.Close(), p.close())
	}
	ln, err := net.Listen("tcp", c.addr)
	if err != nil {
		return errors.Join(fmt.Errorf("-addr: %w", err), eng.Close(), p.close())
	}
	srv, served := c.http.serve(api, ln)
	tiers := []any{"addr", ln.Addr().String(), "max_conns", c.http.connLimit(), "model", s.model.Name, "strategy", c.strategy.String(), "context", s.context,
		"gpu_kv", bytesize.Format(int64(s.cacheSlots) * s.blockBytes), "scratch", bytesize.Format(int64(s.scratch) * s.blockBytes)}
	if p.cache != nil {
		tiers = append(tiers, "host_slots", p.cache.CapacitySlots(kvtier.Host), "nvme_slots", p.cache.CapacitySlots(kvtier.NVMe))
	}
	c.log.Info("server: listening", tiers...)
	if listening != nil {
		listening(ln.Addr().String())
	}

	select {
	case <-ctx.Done():
	case err := <-served:
		return errors.Join(fmt.Errorf("serve: %w", err), eng.Close(), p.close())
	}
	return shutdown(c, api, srv, eng, p)
}

// shutdown drains the API, stops the HTTP server, lets the engine finish,
// writes the cache's blocks down to its slowest tier when a next start may
// adopt them (gateHandle.flushAtExit) and closes everything.
func shutdown(c *config, api *httpapi.API, srv *http.Server, eng *engine.Engine, p *parts) error {
	c.log.Info("server: draining")
	ctx, cancel := context.WithTimeout(context.Background(), c.drainTimeout)
	defer cancel()
	var errs []error
	if err := api.Drain(ctx); err != nil {
		errs = append(errs, err)
	}
	if err := srv.Shutdown(ctx); err != nil {
		errs = append(errs, fmt.Errorf("http shutdown: %w", err))
	}
	errs = append(errs, eng.Close())
	if p.cache != nil {
		st := p.cache.Mover.Stats()
		attrs := []any{"onboards", st.Onboards, "offloads", st.Offloads, "nvme_writes", st.NVMeWrites,
			"nvme_reads", st.NVMeReads, "staged_loads", st.StagedLoads, "bounce_writes", st.BounceWrites, "failures", st.Failures}
		if err := p.cache.Mover.LastError(); err != nil {
			attrs = append(attrs, "last_failure", err.Error())
		}
		c.log.Info("server: copies", attrs...)
	}
	if p.cache != nil && p.cache.Store != nil {
		st := p.cache.Store.Stats()
		c.log.Info("server: nvme", "reads", st.Reads, "writes", st.Writes, "checked_on_gpu", st.DeferredChecks,
			"corrupt", st.CorruptDrops, "corrupt_on_gpu", st.ReportedCorrupt, "invalidated", st.SlotsInvalidated)
		if !p.nvme.flushAtExit(c) {
			c.log.Info("server: nothing written down to NVMe at exit (a temporary -nvme-dir, or gated writes the drive is worth none of: -nvme-persist keeps the cache)")
		} else if err := p.cache.Flush(ctx); err != nil && !errors.Is(err, kvtier.ErrNoSpace) {
			errs = append(errs, err)
		}
	}
	errs = append(errs, p.cal.close(c.costCalibrationOut), p.close())
	err := errors.Join(errs...)
	if err == nil {
		c.log.Info("server: stopped cleanly")
	}
	return err
}
