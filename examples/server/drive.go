package main

import (
	"context"
	"fmt"
	"log/slog"
	"time"

	"kvtier.dev/kvtier"
	"kvtier.dev/kvtier/cost"
	"kvtier.dev/kvtier/costplan"
	"kvtier.dev/kvtier/devmover"
	"kvtier.dev/kvtier/nvme"
	"kvtier.dev/kvtier/policy"
	"kvtier.dev/kvtier/stack"
)

// The NVMe tier's drive: the links the cost model prices loads from it by
// (-nvme-link's measured file, or the -cost-nvme preset), and what its
// tier writes: blocks two requests used (-nvme-admission), and of those
// only the ones a load would be worth, within the drive's budget
// (-nvme-writes gated: costplan.Gate over the drive the mover measures).

// driveLinks is the drive's read and write links: -nvme-link's, or the
// -cost-nvme preset's (writes at its read rate).
func driveLinks(c *config) (cost.Drive, error) {
	if c.nvmeLink != "" {
		d, err := cost.LoadDrive(c.nvmeLink)
		if err != nil {
			return d, fmt.Errorf("-nvme-link: %w", err)
		}
		return d, nil
	}
	l, err := cost.LookupLink(c.costNVMe)
	if err != nil {
		return cost.Drive{}, fmt.Errorf("-cost-nvme: %w", err)
	}
	return cost.PresetDrive(l), nil
}

// nvmeWrites sets o's NVMe admitter and gate, and what feeds the drive's
// measured I/O to the calibration (when it learns). model is the cost
// model (nil for a model kvtier/cost has no preset of: the gate holds the
// budgets alone). It returns the gate's handle for the log and /metrics,
// filled at Open.
func nvmeWrites(c *config, o *stack.Options, model *cost.Planner, drive cost.Drive, cal *calibration, slots int64) (*gateHandle, error) {
	if c.nvmeAdmission == "seen-twice" {
		counters := max(1<<16, 4*int(min(slots, 1<<24)))
		a, err := policy.NewSeenTwice(counters, counters, func(k kvtier.Key) uint64 { return uint64(k) })
		if err != nil {
			return nil, fmt.Errorf("-nvme-admission: %w", err)
		}
		o.NVMeAdmitter = a
	}
	if cal != nil && cal.learn {
		o.OnDriveIO = func(write bool, bytes int64, d time.Duration) {
			l := drive.Read
			if write {
				l = drive.Write
			}
			cal.addDriveIO(l, bytes, d)
		}
	}
	h := &gateHandle{links: drive, cal: cal, priced: model != nil}
	if c.nvmeWrites != "gated" {
		return h, nil
	}
	o.NVMeGate = func(d *devmover.Mover) (kvtier.WriteGate, error) {
		g, err := costplan.NewGate(costplan.GateConfig{Model: model, Tier: cost.TierNVMe, Drive: d,
			WriteBytesPerS: drive.Write.BandwidthBytesPerS, WriteShare: c.nvmeWriteShare,
			DriveWritesPerDay: c.nvmeDWPD, DriveBytes: int64(slots) * d.BlockBytes(), Persist: c.nvmePersist})
		h.gate = g
		return g, err
	}
	return h, nil
}

// gateHandle is the NVMe tier's gate once Open built it (nil without
// one), with the drive's links and the calibration that learns them.
type gateHandle struct {
	gate   *costplan.Gate
	links  cost.Drive
	cal    *calibration
	blocks int  // the context's
	priced bool // the gate has a cost model: not every write is worth it
}

// flushAtExit reports whether shutdown writes the cache down to NVMe for
// the next start to adopt: only into a directory kept (-nvme-dir), and
// with gated writes only for -nvme-persist or a drive worth some load
// (else the writes are all cost: 23 s of a 1.4 GB/s drive for a host
// tier of 32 GiB).
func (h *gateHandle) flushAtExit(c *config) bool {
	switch {
	case c.nvmeDir == "":
		return false
	case h == nil || h.gate == nil || c.nvmePersist:
		return true
	}
	return h.breakEven(h.blocks) >= 0
}

// probeSamples is how many samples of each link a probe stands for.
const probeSamples = 8

// breakEven is the first block, within the context's blocks, from which a
// load from NVMe beats recomputing it; -1 when none does (or no gate).
func (h *gateHandle) breakEven(blocks int) int {
	if h == nil || h.gate == nil {
		return -1
	}
	p, ok := h.gate.BreakEven(blocks - 1)
	if !ok {
		return -1
	}
	return p
}

// logWorth says whether the NVMe tier is worth any write at the drive's
// rates, and what it does then.
func (h *gateHandle) logWorth(log *slog.Logger, c *config, blocks, blockTokens int, why string) {
	if h == nil || h.gate == nil {
		return
	}
	if !h.priced {
		log.Info("server: no cost figures for this model: every admitted block is written to NVMe, within the budgets")
		return
	}
	if p := h.breakEven(blocks); p < 0 {
		what := "the NVMe tier writes nothing"
		if c.nvmePersist {
			what = "the NVMe tier writes within its budget for -nvme-persist only"
		}
		log.Info("server: a load from NVMe beats recomputing no block of the context at the drive's rates: "+what, "rates", why, "block_tokens", blockTokens, "context_blocks", blocks)
		return
	} else {
		log.Info("server: NVMe loads beat recompute from block "+fmt.Sprint(p)+" of the context on: only those blocks are written", "rates", why, "token", p*blockTokens)
	}
}

// startDrive seeds the NVMe tier's drive with -nvme-link's rates and says
// what the tier is worth, or starts a probe of the drive (-nvme-probe).
func (p *parts) startDrive(ctx context.Context, c *config, s shape) {
	if p.cache == nil || p.cache.Store == nil {
		return
	}
	blocks, bt := s.model.Blocks(s.context), s.model.BlockTokens
	if c.nvmeLink != "" {
		d, err := driveLinks(c) // read before: it loads
		if err == nil {
			p.cache.Mover.SeedDriveRates(d.Read.BandwidthBytesPerS, d.Write.BandwidthBytesPerS)
		}
		p.nvme.logWorth(c.log, c, blocks, bt, "-nvme-link")
		return
	}
	p.nvme.logWorth(c.log, c, blocks, bt, "-cost-nvme "+c.costNVMe)
	if c.nvmeProbe {
		probeDrive(ctx, c, p.nvmeDir, p.cache.Mover, p.nvme, blocks, bt)
	}
}

// probeDrive measures the NVMe tier's drive in the background (unless
// -nvme-link gave its rates), seeds the mover with what it found and logs
// what the tier is worth then. It returns at once; the probe stops when
// ctx ends.
func probeDrive(ctx context.Context, c *config, dir string, mv *devmover.Mover, h *gateHandle, blocks, blockTokens int) {
	go func() {
		p, err := nvme.ProbeDrive(ctx, nvme.ProbeConfig{Dir: dir, BlockBytes: int((mv.BlockBytes() + 4095) &^ 4095), Bytes: 64 << 20})
		if err != nil {
			if ctx.Err() == nil {
				c.log.Warn("server: the drive probe failed: the NVMe tier keeps the -cost-nvme preset's rates until its own I/O measures them", "err", err)
			}
			return
		}
		mv.SeedDriveRates(p.ReadBytesPerS, p.WriteBytesPerS)
		if cal := h.cal; cal != nil && cal.learn {
			// The probe's blocks as samples of the drive's links, until
			// the tier's own I/O brings more.
			for range probeSamples {
				cal.addDriveIO(h.links.Read, mv.BlockBytes(), time.Duration(float64(mv.BlockBytes())/p.ReadBytesPerS*1e9))
				cal.addDriveIO(h.links.Write, mv.BlockBytes(), time.Duration(float64(mv.BlockBytes())/p.WriteBytesPerS*1e9))
			}
		}
		c.log.Info("server: drive probed", "dir", dir, "read_GBps", p.ReadBytesPerS/1e9, "write_GBps", p.WriteBytesPerS/1e9,
			"read_latency_us", p.ReadLatency.Microseconds(), "direct", p.Direct)
		h.logWorth(c.log, c, blocks, blockTokens, "probed")
	}()
}
