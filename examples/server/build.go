package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"time"

	"kvtier.dev/cudastream"
	"kvtier.dev/examples/server/internal/engine"
	"kvtier.dev/examples/server/internal/gpu"
	"kvtier.dev/examples/server/internal/model"
	"kvtier.dev/internal/bytesize"
	"kvtier.dev/kvtier"
	"kvtier.dev/kvtier/cost"
	"kvtier.dev/kvtier/costplan"
	"kvtier.dev/kvtier/nvme"
	"kvtier.dev/kvtier/policy"
	"kvtier.dev/kvtier/remotetier"
	"kvtier.dev/kvtier/stack"
	"kvtier.dev/kvtier/transfer"
)

// parts is what the server is built from; close undoes build.
type parts struct {
	dev     cudastream.Device
	region  cudastream.DevicePtr
	runner  engine.Runner
	gpu     *gpu.Model // nil on the CPU backend
	cache   *stack.Cache
	remote  *remotetier.Tier // nil without -remote
	cal     *calibration     // nil: the model has no cost preset, or neither -cost-learn nor -cost-calibration
	nvme    *gateHandle      // the NVMe tier's gate, if any
	nvmeDir string           // the NVMe tier's directory, "" without one
	onGPU   bool
	closers []func() error // in the order to call them
}

func (p *parts) close() error {
	var errs []error
	for i := len(p.closers) - 1; i >= 0; i-- {
		errs = append(errs, p.closers[i]())
	}
	p.closers = nil
	return errors.Join(errs...)
}

// build opens the device, the model and, unless the strategy is none, the
// cache. On error what was built is closed again.
func build(ctx context.Context, c *config, s shape) (p *parts, err error) {
	p = &parts{}
	defer func() {
		if err != nil {
			err = errors.Join(err, p.close())
			p = nil
		}
	}()
	slots := s.cacheSlots + s.scratch
	regionBytes := int64(slots) * s.blockBytes
	if c.device != "cpu" {
		dev, err := cudastream.Open(0)
		switch {
		case err == nil:
			p.dev, p.onGPU = dev, true
		case errors.Is(err, cudastream.ErrNoDriver) && c.device == "auto":
			c.log.Info("server: no CUDA driver: running the model on the CPU (reference backend) over the simulated device", "reason", err)
		default:
			return p, fmt.Errorf("-device %s: %w", c.device, err)
		}
	}
	if p.dev == nil {
		if !c.gatherStagingSet {
			c.gatherStaging = 0 // the simulated link has nothing to gain from it
		}
		sim, err := cudastream.NewSim(cudastream.SimConfig{MemoryBytes: regionBytes + c.gatherStaging + 1<<20, Link: cudastream.H200Link(), Clock: cudastream.SimWallClock})
		if err != nil {
			return p, err
		}
		p.dev = sim
	}
	p.closers = append(p.closers, p.dev.Close)
	if p.region, err = p.dev.Alloc(regionBytes); err != nil {
		return p, fmt.Errorf("KV region of %d blocks (%s): %w", slots, bytesize.Format(regionBytes), err)
	}
	p.closers = append(p.closers, func() error { return p.dev.Free(p.region) })

	if p.onGPU {
		m, err := gpu.New(s.model, c.seed, p.region, slots, gpu.Options{MaxTokens: s.context, MaxContext: s.context, ExactRows: c.exactRows})
		if err != nil {
			return p, err
		}
		p.closers = append(p.closers, m.Close)
		p.runner, p.gpu = engine.GPURunner{M: m}, m
		c.log.Info("server: model on the GPU", "device", p.dev.Info().Name, "model", s.model.Name, "params", s.model.Params(), "cublas", m.Library())
	} else {
		m, err := model.NewCPU(s.model, c.seed, slots)
		if err != nil {
			return p, err
		}
		r, err := engine.NewCPURunner(m, p.dev, p.region, s.cacheSlots)
		if err != nil {
			return p, err
		}
		p.closers = append(p.closers, r.Close)
		p.runner = r
		c.log.Info("server: model on the CPU (reference backend); KV copies on the simulated device with the H200's link model", "model", s.model.Name, "params", s.model.Params())
	}
	if err := c.codecs.resolve(c, s); err != nil {
		return p, err
	}
	if p.cal, err = openCalibration(c, s); err != nil {
		return p, err
	}
	if err := p.cal.setRuntime(p.runtimeName()); err != nil {
		return p, err
	}
	if p.gpu != nil {
		if err := p.cal.setAttentionWave(p.gpu.AttentionRows() * p.dev.Info().SMCount); err != nil {
			return p, err
		}
	}
	if !c.strategy.Caches() {
		return p, nil
	}
	if p.cache, err = openCache(ctx, c, s, p); err != nil {
		switch {
		case errors.Is(err, stack.ErrRemote):
			err = fmt.Errorf("-remote %s (-remote-prefix %q): %w", c.remote, c.remotePrefix, err)
		case !c.nvmeReformat && (errors.Is(err, nvme.ErrConfig) || errors.Is(err, nvme.ErrUnsafeDir)):
			err = fmt.Errorf("-nvme-dir: %w; -nvme-reformat empties and reformats a slab file the tier cannot use (its blocks are lost)", err)
		}
		return p, err
	}
	p.closers = append(p.closers, p.cache.Close) // it closes the remote tier too
	if p.remote = p.cache.Remote; p.remote != nil {
		c.log.Info("server: remote tier", "nodes", c.remote, "prefix", c.remotePrefix, "user", c.remoteUser,
			"keyed", p.remote.Cache().Keyed(), "tls", c.remoteTLS || c.remoteTLSCA != "" || c.remoteTLSCert != "")
	}
	return p, nil
}

// openCache opens kvtier over the region's first cacheSlots blocks, sized
// and planned as the strategy says.
func openCache(ctx context.Context, c *config, s shape, p *parts) (*stack.Cache, error) {
	m := s.model
	layout, err := transfer.BlockFirstLayout(p.region, m.Layers, 2, s.cacheSlots, m.PartBytes())
	if err != nil {
		return nil, err
	}
	o := stack.Options{Device: p.dev, GPU: layout, BlockTokens: m.BlockTokens, HostBytes: s.hostBytes,
		WriteThrough: true, MaxHoleBlocks: c.maxHoles, GatherStaging: c.gatherStaging, Logger: c.log, Policy: policyOf(c.policy),
		Model: modelIdentity(c, m), NVMeReformat: c.nvmeReformat && s.nvmeBytes > 0 && c.strategy != costplan.GPUOnly,
		EventBuffer: c.kvEventBuffer, Tenants: c.tenants}
	if o.Remote, err = remoteOptions(c); err != nil {
		return nil, err
	}
	var model *cost.Planner
	if c.strategy == costplan.Cost || c.strategy.LowerTiers() {
		if model, err = costModel(c, s, p.cal); err != nil {
			return nil, err
		}
	}
	if model == nil && c.strategy == costplan.Cost {
		o.Planner = kvtier.LoadAll{} // the cost model has no preset of this model
	} else if o.Planner, err = c.strategy.Planner(model); err != nil {
		return nil, err
	}
	if c.strategy == costplan.GPUOnly {
		// The copy engine needs a host tier: one slot, never read.
		o.HostBytes = (m.BlockBytes() + 4095) &^ 4095
	} else if s.nvmeBytes > 0 {
		dir := c.nvmeDir
		if dir == "" {
			if dir, err = os.MkdirTemp("", "kvtier-server-"); err != nil {
				return nil, err
			}
			p.closers = append(p.closers, func() error { return os.RemoveAll(dir) })
		} else if err := os.MkdirAll(dir, 0o700); err != nil {
			return nil, fmt.Errorf("-nvme-dir: %w", err)
		}
		o.NVMeDirs, o.NVMeBytes, o.KeepNVMe = []string{dir}, s.nvmeBytes, c.nvmeDir != ""
		drive, err := driveLinks(c)
		if err != nil {
			return nil, err
		}
		if p.nvme, err = nvmeWrites(c, &o, model, drive, p.cal, s.nvmeBytes/s.blockBytes); err != nil {
			return nil, err
		}
		p.nvme.blocks = s.model.Blocks(s.context)
		p.nvmeDir = dir
	}
	if o.Codecs, err = c.codecs.options(m, o.NVMeBytes > 0, o.Remote != nil); err != nil {
		return nil, err
	}
	o.OnCodecKernel = p.cal.codecKernels()
	return stack.Open(ctx, o)
}

// modelIdentity is the model the cache is bound to (stack.Options.Model):
// its seeded weights, its shape, bf16 KV, byte-level token ids. A restart
// with another -seed, -model or -block-tokens finds the NVMe tier another
// model's (cleared) and the remote prefix another's (refused).
func modelIdentity(c *config, m model.Config) stack.Model {
	return stack.Model{Weights: fmt.Sprintf("seed:%d", c.seed),
		Shape: fmt.Sprintf("%s layers=%d hidden=%d heads=%d/%d head_dim=%d mlp=%d vocab=%d rope=%g eps=%g tied=%v block_tokens=%d",
			m.Name, m.Layers, m.Hidden, m.QHeads, m.KVHeads, m.HeadDim, m.Intermediate, m.Vocab, m.RopeTheta, m.NormEps, m.TieEmbeddings, m.BlockTokens),
		DType: "bf16", Tokenizer: "bytes"}
}

// costModel is the cost model of the flags' presets priced by cal (nil:
// the presets, taken as exact), or nil (said in the log) for a model
// kvtier/cost has no preset of (tiny): the server then loads every cached
// block.
func costModel(c *config, s shape, cal *calibration) (*cost.Planner, error) {
	if _, err := cost.LookupModel(s.model.Name); err != nil {
		c.log.Info("server: the cost model has no preset of this model: loading every cached block", "model", s.model.Name)
		return nil, nil
	}
	pc, err := plannerConfig(c, s)
	if err != nil {
		return nil, err
	}
	if cal != nil {
		pc.Calibration = cal.cal
	}
	cp, err := cost.NewPlanner(pc)
	if err != nil {
		return nil, fmt.Errorf("cost model: %w", err)
	}
	return cp, nil
}

// plannerConfig is the cost model of the flags' presets.
func plannerConfig(c *config, s shape) (cost.PlannerConfig, error) {
	pc, err := cost.NewPlannerConfig(cost.Presets{Model: s.model.Name, GPU: c.costGPU, HostLink: c.costLink, NVMe: c.costNVMe, BlockTokens: s.model.BlockTokens, MaxBlocks: s.model.Blocks(s.context)})
	if err != nil {
		return pc, fmt.Errorf("cost model: %w", err)
	}
	if c.nvmeLink != "" { // the measured drive in place of the preset
		drive, err := driveLinks(c)
		if err != nil {
			return pc, err
		}
		pc.Paths[cost.TierNVMe].Source = drive.Read
	}
	// The lower tiers hold -host-codec's blocks (the NVMe tier follows it).
	cc, err := stack.CostCodec(c.codecs.host)
	if err != nil {
		return pc, fmt.Errorf("-host-codec: %w", err)
	}
	pc.Paths[cost.TierHost].Codec, pc.Paths[cost.TierNVMe].Codec = cc, cc
	return pc, nil
}

// policyOf makes each tier's eviction policy by -policy's name (checked by
// config.validate).
func policyOf(name string) func(kvtier.Tier, int) (policy.Policy[kvtier.BlockRef], error) {
	return func(_ kvtier.Tier, n int) (policy.Policy[kvtier.BlockRef], error) {
		return policy.NewDenseNamed[kvtier.BlockRef](name, n)
	}
}

// warmUp runs the GPU model's warm-up passes (gpu.Model.WarmUp, unless
// -warm-up=false) in the scratch slots, which nothing uses before the
// engine starts.
func (p *parts) warmUp(c *config, s shape) error {
	if p.gpu == nil || !c.warmUp {
		return nil
	}
	slots := make([]int32, s.scratch)
	for i := range slots {
		slots[i] = int32(s.cacheSlots + i)
	}
	start := time.Now()
	n, err := p.gpu.WarmUp(slots)
	if err == nil {
		c.log.Info("server: one pass of each row bucket run (-warm-up)", "passes", n, "took_s", time.Since(start).Seconds())
	}
	return err
}

// runtimeName says what computes the passes, for the cost calibration's
// samples: the GPU model's attention kernel, compute capability and
// cuBLAS, or the CPU reference backend.
func (p *parts) runtimeName() string {
	if p.gpu == nil {
		return "examples/server cpu (reference backend)"
	}
	major, minor := p.gpu.ComputeCapability()
	return fmt.Sprintf("examples/server gpu: attention %v, compute capability %d.%d, %s", p.gpu.Attention(), major, minor, p.gpu.Library())
}
