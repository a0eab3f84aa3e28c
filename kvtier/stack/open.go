package stack

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"os"
	"path/filepath"
	"time"

	"kvtier.dev/kvtier"
	"kvtier.dev/kvtier/policy"
)

// Open checks o, allocates the pinned host memory and starts registering it,
// and builds the copy engines, the NVMe store, the devmover.Mover and the
// Manager with sizes that agree (for each GPU, with Shards). It returns once
// the first chunk is registered: the host tier serves from the slots
// registered so far and grows as the rest is (Manager.SetUsableSlots), so a
// server with hundreds of GiB of host tier starts in a second. On error
// everything built so far is closed again.
func Open(ctx context.Context, o Options) (*Cache, error) {
	log := o.Logger
	if log == nil {
		log = slog.Default()
	}
	s, err := o.size()
	if err != nil {
		return nil, err
	}
	c := &Cache{log: log, model: o.Model.String(), modelSalt: o.Model.salt()}
	start := time.Now()
	if err := c.build(ctx, &o, &s); err != nil {
		if cerr := c.closeParts(); cerr != nil {
			log.Warn("kvtier: Open: closing after a failure", "err", cerr)
		}
		return nil, fmt.Errorf("kvtier: Open: %w", err)
	}
	c.pinned = make(chan struct{})
	c.growing.Add(1)
	go c.growHost(start)
	log.Info("kvtier: open", "gpus", len(s.shards), "gpu_slots", s.shards[0].GPU.NumBlocks, "host_slots", s.hostSlots, "nvme_slots", s.nvmeSlots,
		"block_bytes", s.blockBytes, "stored_block_bytes", s.storedBytes, "host_codec", o.Codecs.Host, "nvme_codec", o.Codecs.NVMe,
		"remote_codec", o.Codecs.Remote, "write_through", o.WriteThrough)
	return c, nil
}

// build builds c's parts for every GPU, then the Manager over them.
func (c *Cache) build(ctx context.Context, o *Options, s *sizes) error {
	// Every GPU's pool starts registering (in the background) before the
	// first is waited for, so that they are pinned at the same time.
	for r, sh := range s.shards {
		p, err := allocHost(ctx, sh.Device, s.hostSlots, s.slotBytes)
		if p != nil {
			c.Ranks = append(c.Ranks, p)
		}
		if err != nil {
			return fmt.Errorf("host tier of rank %d: %w", r, err)
		}
	}
	c.GPUParts = c.Ranks[0]
	for r, sh := range s.shards {
		dirs, err := rankDirs(o.NVMeDirs, r, len(s.shards) > 1 && s.nvmeSlots > 0)
		if err != nil {
			return err
		}
		if err := c.Ranks[r].build(ctx, sh, o, s, dirs); err != nil {
			if len(s.shards) > 1 {
				err = fmt.Errorf("rank %d: %w", r, err)
			}
			return err
		}
	}
	c.logNVMe()
	cfg, err := c.managerConfig(o, s)
	if err != nil {
		return err
	}
	if c.Manager, err = kvtier.New(cfg); err != nil {
		return err
	}
	if rec := c.Mover.Recovered(); len(rec) > 0 {
		n, err := c.Adopt(kvtier.NVMe, rec)
		if err != nil {
			return err
		}
		c.log.Info("kvtier: adopted the blocks a previous run left on NVMe", "blocks", n, "found", len(rec))
	}
	if o.Remote != nil {
		if err := c.openRemote(ctx, o, s.storedBytes); err != nil {
			return err
		}
	}
	c.growCtx, c.stopGrow = context.WithCancel(context.Background())
	return c.SetUsableSlots(kvtier.Host, c.usableHostSlots())
}

// logNVMe says which NVMe slab files Open cleared because they had been
// written for another model.
func (c *Cache) logNVMe() {
	for r, p := range c.Ranks {
		if p.Store == nil {
			continue
		}
		for _, f := range p.Store.Info().Cleared {
			written := fmt.Sprintf("%q", f.WrittenFor)
			if !f.Recorded {
				written = "a version that recorded no model"
			}
			c.log.Warn("kvtier: NVMe tier written for another model: cleared (its blocks are not served)", "rank", r, "file", f.Path,
				"written_for", written, "model", c.model, "blocks_cleared", f.Slots)
		}
	}
}

// rankDirs are the NVMe directories of rank r: dirs themselves, or with
// perRank a directory "rank<r>" in each (made 0700 if absent).
func rankDirs(dirs []string, r int, perRank bool) ([]string, error) {
	if !perRank {
		return dirs, nil
	}
	out := make([]string, len(dirs))
	for i, d := range dirs {
		out[i] = filepath.Join(d, fmt.Sprintf("rank%d", r))
		if err := os.Mkdir(out[i], 0o700); err != nil && !errors.Is(err, fs.ErrExist) {
			return nil, fmt.Errorf("NVMe directory of rank %d: %w", r, err)
		}
	}
	return out, nil
}

// managerConfig is the Manager's configuration over c's parts: its mover
// (a ShardedMover over the GPUs' with several), and each tier's size and
// policy.
func (c *Cache) managerConfig(o *Options, s *sizes) (kvtier.Config, error) {
	cfg := kvtier.Config{BlockTokens: o.BlockTokens, WriteThrough: o.WriteThrough, MaxHoleBlocks: o.MaxHoleBlocks, Mover: c.Mover, Planner: o.Planner,
		EventBuffer: o.EventBuffer}
	if len(c.Ranks) > 1 {
		movers := make([]kvtier.Mover, len(c.Ranks))
		for r, p := range c.Ranks {
			movers[r] = p.Mover
		}
		sm, err := kvtier.NewShardedMover(movers...)
		if err != nil {
			return cfg, err
		}
		cfg.Mover = sm
	}
	newPolicy := o.Policy
	if newPolicy == nil {
		newPolicy = func(_ kvtier.Tier, n int) (policy.Policy[kvtier.BlockRef], error) {
			return policy.NewDenseLRU[kvtier.BlockRef](n)
		}
	}
	tiers := [kvtier.NumTiers]struct{ slots, slotBytes int64 }{
		kvtier.GPU:  {int64(s.shards[0].GPU.NumBlocks), s.blockBytes},
		kvtier.Host: {s.hostSlots, s.slotBytes},
		kvtier.NVMe: {s.nvmeSlots, s.storedBytes},
	}
	for t, ts := range tiers {
		if ts.slots == 0 {
			continue
		}
		p, err := newPolicy(kvtier.Tier(t), int(ts.slots))
		if err != nil {
			return cfg, fmt.Errorf("policy of the %v tier: %w", kvtier.Tier(t), err)
		}
		cfg.Tiers[t] = kvtier.TierConfig{CapacityBytes: ts.slots * ts.slotBytes, SlotBytes: ts.slotBytes, Policy: p}
		if len(o.Tenants) > 0 {
			cfg.Tiers[t].NewPolicy = func(n int) (policy.Policy[kvtier.BlockRef], error) { return newPolicy(kvtier.Tier(t), n) }
		}
	}
	cfg.Tenants = make([]kvtier.TenantLimit, len(o.Tenants))
	for i, tl := range o.Tenants {
		tl.Salt = c.Salt(tl.Salt)
		cfg.Tenants[i] = tl
	}
	if s.nvmeSlots > 0 {
		nt := &cfg.Tiers[kvtier.NVMe]
		nt.Admitter = o.NVMeAdmitter
		if o.NVMeGate != nil {
			g, err := o.NVMeGate(c.Mover)
			if err != nil {
				return cfg, fmt.Errorf("Options.NVMeGate: %w", err)
			}
			nt.Gate = g
		}
	}
	return cfg, nil
}
