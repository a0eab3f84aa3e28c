package stack

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"kvtier.dev/kvtier"
	"kvtier.dev/kvtier/remote"
	"kvtier.dev/kvtier/remotetier"
)

// Cache is a Manager wired to its parts by Open. The parts stay reachable
// for what the Manager does not do (stats, tuning); Close closes them.
// Its GPUParts are the first GPU's (rank 0); Ranks has every GPU's.
type Cache struct {
	*kvtier.Manager
	*GPUParts
	// Ranks are the parts of each GPU in rank order: one entry without
	// tensor parallelism, Ranks[0] being the embedded GPUParts.
	Ranks []*GPUParts
	// Remote is the shared remote tier (Options.Remote), nil without one.
	// Its Fetch and Publish take Cache.Salt's salts, as the Manager's
	// calls do.
	Remote *remotetier.Tier

	model       string // Options.Model's identity
	modelSalt   uint64 // its part of every salt (Salt)
	remoteStore *remote.Redis
	remoteCache *remote.Cache

	log      *slog.Logger
	growCtx  context.Context
	stopGrow context.CancelFunc
	growing  sync.WaitGroup
	pinned   chan struct{} // closed when growHost has registered every chunk
	pinErr   error         // why it stopped short (before pinned is closed)
}

// WaitHostPinned blocks until every host slot is registered (Open returns
// after the first chunk), and returns the registration's error if it
// stopped short, or ctx's. A server that must not serve during the
// registration waits for it: GPU work submitted while cold memory is being
// pinned stalls (docs/design-notes.md).
func (c *Cache) WaitHostPinned(ctx context.Context) error {
	select {
	case <-c.pinned:
		return c.pinErr
	case <-ctx.Done():
		return fmt.Errorf("kvtier: WaitHostPinned: %w", ctx.Err())
	}
}

// usableHostSlots is how many host slots every GPU has registered: a host
// slot holds a part of its block on each GPU's pool.
func (c *Cache) usableHostSlots() int {
	n := c.Ranks[0].readyHostSlots()
	for _, p := range c.Ranks[1:] {
		n = min(n, p.readyHostSlots())
	}
	return n
}

// growHost raises the host tier's usable slots as the pools' chunks are
// registered, until all are or Close stops it.
func (c *Cache) growHost(start time.Time) {
	defer c.growing.Done()
	defer close(c.pinned)
	size, chunk := c.Ranks[0].pool.Size(), c.Ranks[0].pool.ChunkBytes()
	for next := chunk; ; next += chunk {
		next = min(next, size)
		for r, p := range c.Ranks {
			if err := p.pool.WaitReady(c.growCtx, next); err != nil {
				c.pinErr = fmt.Errorf("kvtier: the host tier stopped at %d slots: %w", c.usableHostSlots(), err)
				if c.growCtx.Err() == nil {
					c.log.Error("kvtier: pinning the host tier failed: it keeps the slots pinned so far",
						"rank", r, "slots", c.usableHostSlots(), "err", err)
				}
				return
			}
		}
		_ = c.SetUsableSlots(kvtier.Host, c.usableHostSlots())
		if next == size {
			for r, p := range c.Ranks {
				c.log.Info("kvtier: host tier pinned", "rank", r, "bytes", next, "slots", p.readyHostSlots(), "slot_bytes", p.slotBytes,
					"seconds", time.Since(start).Seconds(), "numa", p.pool.Stats().NUMANote)
			}
			return
		}
	}
}

// Close waits for every copy in flight (Drain), then closes the remote tier
// (writing out its queue), the mover, the copy engines, the NVMe store and
// the pinned host memory, in that order.
// The Manager MUST NOT be used during or after Close.
func (c *Cache) Close() error {
	var errs []error
	if c.stopGrow != nil {
		c.stopGrow()
		c.growing.Wait()
	}
	if c.Manager != nil {
		if err := c.Drain(context.Background()); err != nil {
			errs = append(errs, err)
		}
	}
	errs = append(errs, c.closeParts())
	err := errors.Join(errs...)
	if err != nil {
		c.log.Warn("kvtier: close", "err", err)
	}
	return err
}

// closeParts closes what Open built, most dependent first: the remote
// tier (its queued writes flushed) before the GPUs' parts.
func (c *Cache) closeParts() error {
	errs := []error{c.closeRemote()}
	for _, p := range c.Ranks {
		errs = append(errs, p.close())
	}
	return errors.Join(errs...)
}
