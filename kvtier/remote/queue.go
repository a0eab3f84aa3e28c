package remote

import (
	"context"
	"errors"
	"fmt"
)

// Put queues the block for writing and returns at once: it copies payload
// (BlockBytes long, in meta.Codec) and meta's tokens, so the caller may reuse both when
// Put returns. It reports whether the block was queued; a block is not
// queued, and this is counted, when it is queued already, when the queue
// is full, or while the breaker is open. Errors are for bad input and a
// closed Cache only.
func (c *Cache) Put(meta BlockMeta, payload []byte) (bool, error) {
	if len(payload) != c.cfg.BlockBytes {
		return false, fmt.Errorf("%w: block %#x: payload is %d bytes, want %d", ErrBadInput, meta.Key, len(payload), c.cfg.BlockBytes)
	}
	if meta.Position < 0 {
		return false, fmt.Errorf("%w: block %#x: position %d is negative", ErrBadInput, meta.Key, meta.Position)
	}
	if state, _, _ := c.br.snapshot(); state == open {
		c.stats.dropOpen.Add(1)
		return false, nil
	}
	c.mu.Lock()
	if c.closing.Load() {
		c.mu.Unlock()
		return false, ErrClosed
	}
	if _, ok := c.pending[meta.Key]; ok {
		c.mu.Unlock()
		c.stats.dropPending.Add(1)
		return false, nil
	}
	select {
	case c.slots <- struct{}{}:
	default:
		c.mu.Unlock()
		c.stats.dropFull.Add(1)
		return false, nil
	}
	c.pending[meta.Key] = struct{}{}
	if c.idle == nil {
		c.idle = make(chan struct{})
	}
	c.mu.Unlock()

	var buf *[]byte
	select {
	case buf = <-c.free:
	default:
		// Fewer than QueueBlocks buffers exist (or a failed write kept
		// one): the slot taken above bounds them.
		b := make([]byte, c.cfg.BlockBytes)
		buf = &b
	}
	copy(*buf, payload)
	meta.Tokens = append([]int32(nil), meta.Tokens...)
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closing.Load() { // closed while copying
		c.unqueueLocked(meta.Key)
		return false, ErrClosed
	}
	c.q <- &job{meta: meta, buf: buf} // never blocks: slots bounds the jobs
	c.stats.queued.Add(1)
	return true, nil
}

// unqueueLocked forgets a queued key and frees its slot. c.mu is held.
func (c *Cache) unqueueLocked(k uint64) {
	delete(c.pending, k)
	if len(c.pending) == 0 && c.idle != nil {
		close(c.idle)
		c.idle = nil
	}
	<-c.slots
}

// writer writes queued blocks until Close.
func (c *Cache) writer() {
	defer c.wg.Done()
	var scratch []byte
	for j := range c.q {
		reuse := c.write(j, &scratch)
		if reuse {
			select {
			case c.free <- j.buf:
			default: // never: at most QueueBlocks buffers are kept
			}
		}
		c.mu.Lock()
		c.unqueueLocked(j.meta.Key)
		c.mu.Unlock()
	}
}

// write stores one block unless the store has it already. It reports
// whether j's buffer may be reused (not after a failed write, whose
// command might still sit in a broken connection's queue).
func (c *Cache) write(j *job, scratch *[]byte) bool {
	if !c.br.allow() {
		c.stats.dropOpen.Add(1)
		return true
	}
	keys := keyNames(c.cfg.Prefix, j.meta.Key, c.parts)
	found := []bool{false}
	ctx, cancel := context.WithTimeout(context.Background(), c.cfg.OpTimeout)
	err := c.cfg.Store.Exists(ctx, keys[:1], found)
	cancel()
	if err != nil {
		c.br.failure()
		c.stats.writeErrs.Add(1)
		return true
	}
	if found[0] {
		c.br.success()
		c.stats.dedup.Add(1)
		c.stored(&j.meta)
		return true
	}
	payload := *j.buf
	var h header
	h.keyed, h.codec = c.sum.Keyed(), j.meta.Codec
	h.key, h.parent, h.position = j.meta.Key, j.meta.Parent, uint32(j.meta.Position)
	h.saltSum, h.tokenSum, *scratch = digests(c.sum, &j.meta, *scratch)
	h.tokens = uint32(len(j.meta.Tokens))
	h.payload, h.paySum = uint64(len(payload)), c.sum.Of(payload)
	hdr := make([]byte, HeaderBytes)
	encodeHeader(hdr, &h, c.sum)
	// Parts first, header last: a reader that finds the header finds the
	// parts, unless the store evicted one since (Stats.Incomplete).
	op := PutOp{Keys: make([]string, 0, 1+c.parts), Values: make([][]byte, 0, 1+c.parts), TTL: c.cfg.TTL}
	for p := range c.parts {
		op.Keys = append(op.Keys, keys[1+p])
		op.Values = append(op.Values, payload[p*c.cfg.PartBytes:min((p+1)*c.cfg.PartBytes, len(payload))])
	}
	op.Keys, op.Values = append(op.Keys, keys[0]), append(op.Values, hdr)
	ops := []PutOp{op}
	c.cfg.Store.Put(context.Background(), ops)
	switch err := ops[0].Err; {
	case err == nil:
		c.br.success()
		c.stats.written.Add(1)
		c.stats.bytesWritten.Add(uint64(len(payload)))
		c.stored(&j.meta)
		return true
	case errors.Is(err, ErrStoreFull):
		// The store answered: it is healthy, only full. Its eviction
		// policy (or TTLs) will make room; the parts written are garbage
		// without a header and go the same way.
		c.br.success()
		c.stats.rejected.Add(1)
		return true
	default:
		c.br.failure()
		c.stats.writeErrs.Add(1)
		return false
	}
}

func (c *Cache) stored(meta *BlockMeta) {
	if c.cfg.OnStored != nil {
		c.cfg.OnStored(*meta)
	}
}

// Flush waits until every block queued so far is written or dropped.
func (c *Cache) Flush(ctx context.Context) error {
	c.mu.Lock()
	idle := c.idle
	c.mu.Unlock()
	if idle == nil {
		return nil
	}
	select {
	case <-idle:
		return nil
	case <-ctx.Done():
		return fmt.Errorf("remote: flush: %w", ctx.Err())
	}
}

// Close stops accepting blocks, writes out the queue (or drops it, while
// the breaker is open) and stops the writers. It does not close the Store.
func (c *Cache) Close() error {
	c.mu.Lock()
	if c.closing.Swap(true) {
		c.mu.Unlock()
		return nil
	}
	close(c.q)
	c.mu.Unlock()
	c.wg.Wait()
	return nil
}
