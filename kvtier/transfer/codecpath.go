package transfer

import (
	"context"
	"fmt"

	"kvtier.dev/cudastream"
	"kvtier.dev/kvtier/codec/cudacodec"
)

// offloadCoded issues t's blocks through the offload ring, a chunk at a
// time (codec.go); the producer's events have been waited on by the ring's
// stream. submit records t's final event on d's stream, after the last
// chunk's DMAs. Called with d.mu held.
func (e *Engine) offloadCoded(ctx context.Context, d *direction, t *Transfer, pairs []Pair) {
	e.codeChunks(ctx, d, t, pairs, &e.host, e.hostBase, true, cudacodec.Layers{First: 0, Count: e.gpu.Layers})
	e.endCoded(d, t, true, 0)
}

// onboardCoded issues t's blocks through the onboard ring, a group of
// layers at a time and, within a group, a chunk at a time, and records
// each group's layer events after its last chunk. Called with d.mu held.
func (e *Engine) onboardCoded(ctx context.Context, d *direction, t *Transfer, pairs []Pair) {
	recorded := 0
	for _, g := range e.codec.groups {
		e.codeChunks(ctx, d, t, pairs, &e.host, e.hostBase, false, g)
		for l := g.First; l < g.First+g.Count && t.err == nil; l++ {
			if err := t.layerEv[l].Record(d.cring.kernel); err != nil {
				t.err = fmt.Errorf("transfer: onboard (codec) layer %d: record event: %w", l, err)
			} else {
				recorded = l + 1
			}
		}
		if t.err != nil {
			break
		}
	}
	e.endCoded(d, t, false, recorded)
}

// codeChunks issues pairs, whose host side is in h at base, a chunk of
// CodecChunkBlocks at a time, for the layers in r, and stops at the first
// error (in t.err).
func (e *Engine) codeChunks(ctx context.Context, d *direction, t *Transfer, pairs []Pair, h *HostLayout, base uint64, offload bool, r cudacodec.Layers) {
	t.coded = true
	for start := 0; start < len(pairs) && t.err == nil; start += e.codec.chunk {
		e.codeChunk(ctx, d, t, pairs[start:min(len(pairs), start+e.codec.chunk)], h, base, start, offload, r)
	}
}

// endCoded finishes a coded transfer's events: after an error, the ring's
// stream and d's are joined, so that the transfer's last event follows
// everything it issued on both; an onboard's layer events from recorded
// on are recorded on the ring's stream (all of them recorded already but
// after an error).
func (e *Engine) endCoded(d *direction, t *Transfer, offload bool, recorded int) {
	r := d.cring
	if t.err != nil {
		joinAfterError(t, r.joinStreams, r.kernel, d.stream, offload)
	}
	if offload {
		return
	}
	for l := recorded; l < len(t.layerEv); l++ {
		if err := t.layerEv[l].Record(r.kernel); err != nil && t.err == nil {
			t.err = fmt.Errorf("transfer: onboard (codec) layer %d: record event: %w", l, err)
		}
	}
}

// joinStreams makes later work on to wait for everything enqueued on from.
func (r *codecRing) joinStreams(from, to cudastream.Stream) error {
	if err := r.join.Record(from); err != nil {
		return err
	}
	return to.WaitEvent(r.join)
}

// codeChunk issues one chunk (at most CodecChunkBlocks pairs, the first
// being pair first of the transfer) through the next buffer of d's ring.
// An offload's: the quantize kernel reads the GPU blocks where they lie
// and writes the buffer, once the buffer's last DMA has read it; then DMAs
// to the host slots. An onboard's, for the layers in r: DMAs of the
// blocks' scales and r's codes from the host slots into the buffer, once
// the buffer's last kernel has read it; then the dequantize kernel writes
// r's layers of the GPU blocks where they lie.
func (e *Engine) codeChunk(ctx context.Context, d *direction, t *Transfer, pairs []Pair, h *HostLayout, base uint64, first int, offload bool, lr cudacodec.Layers) {
	if err := ctx.Err(); err != nil {
		t.err = err
		return
	}
	r, cs := d.cring, e.codec
	k := r.next
	b := &r.bufs[k]
	r.chunkCopies(cs, b, pairs, h, base, offload, lr)
	what := "onboard (codec)"
	if offload {
		what = "offload (codec)"
	}
	step := func(doing string, err error) bool {
		if err != nil {
			t.err = fmt.Errorf("transfer: %s, blocks %d..%d, layers %d..%d (scratch buffer %d): %s: %w",
				what, first, first+len(pairs)-1, lr.First, lr.First+lr.Count-1, k, doing, err)
		}
		return err == nil
	}
	// fill writes the buffer on its stream, read reads it on its own.
	fillOn, readOn := d.stream, r.kernel
	fill := func() error { return e.linkBatch(d, r.link) }
	read := func() error { return cs.kern.dequantize(r.kernel, b.enc, r.ids, lr) }
	if offload {
		fillOn, readOn = r.kernel, d.stream
		fill = r.timed(t, cs, true, len(r.ids), lr, func() error { return cs.kern.quantize(r.kernel, b.enc, r.ids) })
		read = func() error { return e.linkBatch(d, r.link) }
	} else {
		read = r.timed(t, cs, false, len(r.ids), lr, read)
	}
	if !passChunk(step, b.used && !e.skipCodecWait, b.filled, b.freed, fillOn, readOn, fill, read) {
		return
	}
	b.used = true
	r.next = (r.next + 1) % len(r.bufs)
	for _, op := range r.link {
		t.bytes += op.Bytes
	}
	t.copies += len(r.link)
	e.stats.descriptors.Add(int64(len(r.link)))
	e.stats.codecChunks.Add(1)
}

// chunkCopies sets a chunk's GPU block numbers (r.ids, in the order the
// kernels code them) and its link copies (r.link) between block i's
// encoded bytes at enc + i*EncodedBytes and its host slot: the whole
// block for an offload; for an onboard its scales and the codes of the
// layers in lr (one copy when lr starts at layer 0, the codes following
// the scales), each copy merged with the one before where both sides
// continue it.
func (r *codecRing) chunkCopies(cs *codecState, b *codecBuf, pairs []Pair, h *HostLayout, base uint64, offload bool, lr cudacodec.Layers) {
	r.ids, r.link = r.ids[:0], r.link[:0]
	s := &cs.shape
	scales, part := s.ScaleBytes(), int64(s.Tokens)*int64(s.Heads)*int64(s.HeadDim) // a part's codes: a byte a value
	codes := scales + int64(lr.First*s.Parts)*part
	whole := lr.First == 0 && lr.Count == s.Layers
	for i, p := range pairs {
		r.ids = append(r.ids, p.GPUBlock)
		host := base + uint64(int64(p.HostSlot)*h.SlotBytes)
		enc := b.enc + uint64(int64(i)*cs.enc)
		// Never merged across a registration: the driver refuses a copy
		// that spans two.
		split := h.startsRegistration(p.HostSlot)
		if offload {
			r.link = appendMerged(r.link, cudastream.Copy{Dst: host, Src: enc, Bytes: cs.enc}, split)
			continue
		}
		if whole {
			r.link = appendMerged(r.link, cudastream.Copy{Dst: enc, Src: host, Bytes: cs.enc}, split)
			continue
		}
		r.link = appendMerged(r.link, cudastream.Copy{Dst: enc, Src: host, Bytes: scales}, split)
		r.link = appendMerged(r.link, cudastream.Copy{Dst: enc + uint64(codes), Src: host + uint64(codes),
			Bytes: int64(lr.Count*s.Parts) * part}, false)
	}
}

// appendMerged appends c to ops, or lengthens the last op when c continues
// it on both sides (and split is false).
func appendMerged(ops []cudastream.Copy, c cudastream.Copy, split bool) []cudastream.Copy {
	if n := len(ops) - 1; n >= 0 && !split {
		o := &ops[n]
		if o.Dst+uint64(o.Bytes) == c.Dst && o.Src+uint64(o.Bytes) == c.Src {
			o.Bytes += c.Bytes
			return ops
		}
	}
	return append(ops, c)
}

// linkBatch issues ops over the link on d's stream, at most MaxBatch
// descriptors a call.
func (e *Engine) linkBatch(d *direction, ops []cudastream.Copy) error {
	return inBatches(ops, e.maxBatch, func(b []cudastream.Copy) error { return d.stream.CopyBatch(d.kind, b) })
}

// inBatches hands ops to issue at most max at a time, in order, until one
// call fails.
func inBatches(ops []cudastream.Copy, max int, issue func([]cudastream.Copy) error) error {
	for len(ops) > 0 {
		n := min(len(ops), max)
		if err := issue(ops[:n]); err != nil {
			return err
		}
		ops = ops[n:]
	}
	return nil
}
