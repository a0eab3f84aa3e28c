package remote

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"

	"kvtier.dev/internal/checksum"
)

// Cache is the remote tier: verified blocks in a shared Store, read on
// demand and written behind. It is safe for concurrent use.
type Cache struct {
	cfg   Config
	parts int
	sum   *checksum.Sum
	br    *breaker
	stats counters

	q     chan *job
	slots chan struct{} // one token per queue buffer in use
	// free holds the queue's buffers (BlockBytes each) between writes.
	// They are allocated as the queue first fills, at most QueueBlocks,
	// and kept: a sync.Pool would drop them at every garbage collection
	// and Put would fault in fresh 2 MiB buffers.
	free    chan *[]byte
	wg      sync.WaitGroup
	closing atomic.Bool

	mu      sync.Mutex
	pending map[uint64]struct{} // keys queued or being written
	idle    chan struct{}       // closed when pending empties; nil while empty
}

type job struct {
	meta BlockMeta
	buf  *[]byte
}

// New returns a Cache over cfg.Store and starts its writers.
func New(cfg Config) (*Cache, error) {
	d, err := cfg.withDefaults()
	if err != nil {
		return nil, err
	}
	c := &Cache{
		cfg:     d,
		parts:   (d.BlockBytes + d.PartBytes - 1) / d.PartBytes,
		sum:     checksum.New(d.ChecksumKey),
		br:      newBreaker(d.BreakerFailures, d.BreakerCooldown, probeLimit(d), d.Now),
		q:       make(chan *job, d.QueueBlocks),
		slots:   make(chan struct{}, d.QueueBlocks),
		free:    make(chan *[]byte, d.QueueBlocks),
		pending: make(map[uint64]struct{}),
	}
	c.wg.Add(d.Writers)
	for range d.Writers {
		go c.writer()
	}
	return c, nil
}

// BlockBytes is the payload size of every block.
func (c *Cache) BlockBytes() int { return c.cfg.BlockBytes }

// ReadOp is one block to read: Meta names it, and Meta.Codec the codec
// the caller decodes; Dst (BlockBytes long) receives its payload. After Get, Err is nil for a hit; otherwise Dst's
// contents are undefined and Err wraps ErrMiss (and says why), or
// ErrBadInput.
type ReadOp struct {
	Meta BlockMeta
	Dst  []byte
	Err  error
}

// Get reads ops in one pipelined batch under one OpTimeout deadline (or
// ctx's, if sooner). It never fails as a whole: each op is a hit or a
// miss. A value that does not match its block, a header that names
// another codec than Meta.Codec among it, is deleted and counted
// (Stats.Corrupt); while the breaker is open every op misses at once.
func (c *Cache) Get(ctx context.Context, ops []ReadOp) {
	gets := make([]GetOp, 0, len(ops))
	idx := make([]int, 0, len(ops))
	for i := range ops {
		op := &ops[i]
		op.Err = nil
		switch {
		case len(op.Dst) != c.cfg.BlockBytes:
			op.Err = fmt.Errorf("%w: block %#x: Dst is %d bytes, want %d", ErrBadInput, op.Meta.Key, len(op.Dst), c.cfg.BlockBytes)
			continue
		case c.closing.Load():
			op.Err = fmt.Errorf("%w: %w", ErrMiss, ErrClosed)
			continue
		}
		g := GetOp{Keys: keyNames(c.cfg.Prefix, op.Meta.Key, c.parts), Got: make([]int, 1+c.parts)}
		g.Dst = make([][]byte, 1+c.parts)
		g.Dst[0] = make([]byte, HeaderBytes)
		for p := range c.parts {
			g.Dst[1+p] = op.Dst[p*c.cfg.PartBytes : min((p+1)*c.cfg.PartBytes, c.cfg.BlockBytes)]
		}
		gets, idx = append(gets, g), append(idx, i)
	}
	if len(gets) == 0 {
		return
	}
	if !c.br.allow() {
		for _, i := range idx {
			ops[i].Err = fmt.Errorf("%w: %w: breaker open", ErrMiss, ErrUnavailable)
		}
		c.stats.refused.Add(uint64(len(idx)))
		return
	}
	tctx, cancel := context.WithTimeout(ctx, c.cfg.OpTimeout)
	c.cfg.Store.Get(tctx, gets)
	cancel()
	failed := false
	var bad []string
	for j, i := range idx {
		g, op := &gets[j], &ops[i]
		if g.Err != nil {
			failed = true
			c.stats.failed.Add(1)
			op.Err = fmt.Errorf("%w: %w: block %#x: %w", ErrMiss, ErrUnavailable, op.Meta.Key, g.Err)
			continue
		}
		if err := c.check(g, &op.Meta, op.Dst); err != nil {
			op.Err = err
			if !errors.Is(err, errAbsent) {
				bad = append(bad, g.Keys...)
			}
			continue
		}
		c.stats.hits.Add(1)
		c.stats.bytesRead.Add(uint64(c.cfg.BlockBytes))
	}
	if failed {
		c.br.failure()
	} else {
		c.br.success()
	}
	if len(bad) > 0 {
		// Best effort: a value left behind is found and deleted again.
		tctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), c.cfg.OpTimeout)
		_ = c.cfg.Store.Delete(tctx, bad)
		cancel()
	}
}

var errAbsent = errors.New("absent")

// sizeOf says how long a value the store reported at got bytes is, for a
// Dst of want bytes: past want, the store need not have read it all.
func sizeOf(got, want int) string {
	if got > want {
		return fmt.Sprintf("more than %d", want)
	}
	return fmt.Sprint(got)
}

// check verifies what g read against m; dst holds the payload parts.
func (c *Cache) check(g *GetOp, m *BlockMeta, dst []byte) error {
	if g.Got[0] < 0 {
		c.stats.absent.Add(1)
		return fmt.Errorf("%w: block %#x: %w", ErrMiss, m.Key, errAbsent)
	}
	for p := range c.parts {
		if g.Got[1+p] < 0 {
			c.stats.incomplete.Add(1)
			return fmt.Errorf("%w: block %#x: part %d of %d is gone", ErrMiss, m.Key, p, c.parts)
		}
	}
	corrupt := func(format string, args ...any) error {
		c.stats.corrupt.Add(1)
		return fmt.Errorf("%w: %w: block %#x: %s", ErrMiss, ErrCorrupt, m.Key, fmt.Sprintf(format, args...))
	}
	if g.Got[0] != HeaderBytes {
		return corrupt("header is %s bytes, want %d", sizeOf(g.Got[0], HeaderBytes), HeaderBytes)
	}
	var h header
	if err := decodeHeader(g.Dst[0], &h, c.sum); err != nil {
		return corrupt("%v", err)
	}
	for p := range c.parts {
		if want := len(g.Dst[1+p]); g.Got[1+p] != want {
			return corrupt("part %d is %s bytes, want %d", p, sizeOf(g.Got[1+p], want), want)
		}
	}
	saltSum, tokSum, _ := digests(c.sum, m, nil)
	switch {
	case h.key != m.Key || h.parent != m.Parent || h.position != uint32(m.Position):
		return corrupt("header names block %#x (parent %#x, position %d), want parent %#x, position %d",
			h.key, h.parent, h.position, m.Parent, m.Position)
	case h.saltSum != saltSum:
		return corrupt("salt differs")
	case h.tokens != uint32(len(m.Tokens)) || h.tokenSum != tokSum:
		return corrupt("token ids differ (%d stored, %d asked)", h.tokens, len(m.Tokens))
	case h.codec != m.Codec:
		return corrupt("header says codec %d, want %d", h.codec, m.Codec)
	case h.payload != uint64(len(dst)):
		return corrupt("payload is %d bytes, want %d", h.payload, len(dst))
	}
	if got := c.sum.Of(dst); got != h.paySum {
		return corrupt("payload checksum %#x, header says %#x", got, h.paySum)
	}
	return nil
}

// Delete removes the block from the store (every part).
func (c *Cache) Delete(ctx context.Context, key uint64) error {
	tctx, cancel := context.WithTimeout(ctx, c.cfg.OpTimeout)
	defer cancel()
	return c.cfg.Store.Delete(tctx, keyNames(c.cfg.Prefix, key, c.parts))
}
