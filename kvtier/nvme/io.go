package nvme

import (
	"context"
	"errors"
	"fmt"
	"io"
	"slices"
	"sync"
	"sync/atomic"

	"kvtier.dev/internal/invariants"
)

// maxRunSlots caps the slots in one vectored I/O (two or three iovecs each,
// well under IOV_MAX).
const maxRunSlots = 64

// WriteOp is one block of a WriteBatch.
type WriteOp struct {
	Slot Slot
	// Meta names the block; Meta.Codec is Payload's codec, which the
	// header records.
	Meta BlockMeta
	// Payload is 1 to Config.BlockBytes bytes: an encoded block (a codec
	// other than None) is shorter than the slot.
	Payload []byte
	// WordSummed says that WordSum is internal/checksum's WordSum of
	// Payload, computed by the caller where the bytes already are (the
	// GPU: transfer.Config.Sums). The store then writes it into the header
	// instead of hashing Payload on the CPU, and the payload's check on a
	// read can be left to the caller (ReadOp.DeferWordSum). A wrong sum
	// makes the block fail every read, never serves wrong bytes. A keyed
	// store (Config.ChecksumKey) refuses it (ErrInvalid): a word sum is not
	// a MAC.
	WordSummed bool
	WordSum    uint64
	// Err is set by WriteBatch: nil when the block is readable.
	Err error
}

// ReadOp is one block of a ReadBatch.
type ReadOp struct {
	// Slot is the slot to read, or NoSlot to look Key up; ReadBatch sets it
	// to the slot read.
	Slot Slot
	Key  uint64
	// Dst receives the payload; it MUST be at least the block's length.
	// Its bytes past the payload, and all of it on error, are undefined.
	Dst []byte
	// Meta is filled on success; Meta.Tokens' storage is reused (and, like
	// Dst, its contents are undefined on error).
	Meta BlockMeta
	// WantCodec is the codec the caller decodes (BlockMeta.Codec; 0 is
	// None). A block stored in another is not read: Err wraps ErrNotFound
	// and ErrCodec and names the slot and both codecs; the block stays.
	WantCodec uint8
	// DeferWordSum leaves the payload's check to the caller where the slot
	// was written with a word sum (WriteOp.WordSummed): ReadBatch checks
	// the header (the block's identity, its sequence number, the header's
	// own checksum) but not the payload, and sets Deferred and Check. The
	// caller MUST then check Dst's payload against Check.WordSum before it
	// uses it as KV (on the GPU, after copying it there: Transfer.Sums),
	// and report a mismatch with Store.ReportCorrupt. Other slots are
	// checked in full as always.
	DeferWordSum bool
	// Deferred is set by ReadBatch when the payload's check was left to
	// the caller. Check is set for every block read that carries a word
	// sum, checked or not: its WordSum is the payload's.
	Deferred bool
	Check    PayloadCheck
	// Err is set by ReadBatch: nil when Dst holds the verified payload, or,
	// with Deferred, the payload of a verified header.
	Err error
}

// PayloadCheck is what a read's word-summed payload must hash to; a check
// ReadBatch left to its caller (ReadOp.Deferred) is reported failed with
// Store.ReportCorrupt.
type PayloadCheck struct {
	// WordSum is what internal/checksum's WordSum of the payload must be.
	WordSum uint64
	slot    Slot
	seq     uint64
}

// Valid reports whether c came from a read (of a word-summed block).
func (c PayloadCheck) Valid() bool { return c.seq != 0 }

// op is the internal form of one block's I/O.
type op struct {
	slot        Slot
	file, idx   int
	buf         []byte    // payload to write, or destination to read
	plen        int       // payload length
	meta        BlockMeta // to write, or read (copied back to the ReadOp)
	seq         uint64    // the header's sequence number (written or expected)
	key         uint64    // expected key, for reads
	sum         uint64    // writes: the caller's word sum (wordSum); reads: the payload checksum of the header that passed checkHeader
	hashPending bool      // for reads: the payload still has to be checked against sum
	wordSum     bool      // writes: sum is the caller's word sum; reads: the header's sum is a word sum
	codec       uint8     // writes: the block's codec; reads: the codec the slot recorded (and the caller wants)
	deferSum    bool      // reads: the caller checks a word-summed payload (ReadOp.DeferWordSum)
	deferred    bool      // reads: the check was left to the caller
	prepared    bool      // the slot was marked busy and must be released
	submitted   bool
	err         error
}

// Write stores payload as meta's block in slot, which the caller MUST have
// allocated. The block is readable once Write returns nil. The slot's
// previous block is no longer readable from the moment Write starts, whatever
// its outcome. In direct mode payload MUST start on an Info().AlignBytes
// boundary (pinned pages are); its length need not be aligned. Write
// allocates nothing. ctx only
// bounds the wait for a worker: an I/O that has started always finishes
// before Write returns, so the caller may reuse payload at once.
func (s *Store) Write(ctx context.Context, slot Slot, meta BlockMeta, payload []byte) error {
	ops := [1]WriteOp{{Slot: slot, Meta: meta, Payload: payload}}
	if err := s.WriteBatch(ctx, ops[:]); err != nil {
		return err
	}
	return ops[0].Err
}

// WriteBatch writes several blocks; runs of adjacent slots go out in one
// pwritev each, spread over the workers. Each op's Err says how it went;
// the returned error is only for a closed Store or a done ctx before start.
func (s *Store) WriteBatch(ctx context.Context, ops []WriteOp) error {
	if err := s.begin(ctx); err != nil {
		s.ops.RUnlock()
		return err
	}
	defer s.ops.RUnlock()
	sc := getScratch(len(ops))
	defer putScratch(sc)
	in := sc.ops
	s.mu.Lock()
	for i := range ops {
		in[i].err = s.prepareWriteLocked(&in[i], &ops[i])
	}
	s.mu.Unlock()
	s.execute(ctx, sc, true)
	s.mu.Lock()
	for i := range ops {
		if in[i].prepared {
			s.finishWriteLocked(&in[i])
		}
		ops[i].Err = in[i].err
	}
	s.mu.Unlock()
	return nil
}

// prepareWriteLocked checks one write and, if it is good, marks the slot
// busy and not readable. A rejected write changes nothing.
func (s *Store) prepareWriteLocked(o *op, w *WriteOp) error {
	o.slot = w.Slot
	si, err := s.slotLocked(w.Slot)
	if err != nil {
		return err
	}
	if si.busy != 0 {
		return fmt.Errorf("%w: write to slot %d with an I/O in flight", ErrBusy, w.Slot)
	}
	if len(w.Payload) == 0 || len(w.Payload) > s.cfg.BlockBytes {
		return fmt.Errorf("%w: slot %d: payload of %d bytes, want 1..%d (Config.BlockBytes)", ErrInvalid, w.Slot, len(w.Payload), s.cfg.BlockBytes)
	}
	if len(w.Meta.Tokens) > s.cfg.MaxTokens {
		return fmt.Errorf("%w: slot %d: %d tokens, at most %d (Config.MaxTokens)", ErrInvalid, w.Slot, len(w.Meta.Tokens), s.cfg.MaxTokens)
	}
	if err := s.checkAligned(w.Slot, "payload", w.Payload); err != nil {
		return err
	}
	if w.WordSummed && s.info.Keyed {
		return fmt.Errorf("%w: slot %d: a word sum on a keyed store (Config.ChecksumKey): the store computes its MAC itself", ErrInvalid, w.Slot)
	}
	if t, ok := s.index[w.Meta.Key]; ok && t != w.Slot {
		return fmt.Errorf("%w: key %#x is in slot %d, write to slot %d", ErrKeyExists, w.Meta.Key, t, w.Slot)
	}
	s.forgetLocked(w.Slot, si)
	si.busy = -1
	o.file, o.idx = s.geom.split(w.Slot)
	o.buf, o.plen, o.meta = w.Payload, len(w.Payload), w.Meta
	o.wordSum, o.sum, o.codec = w.WordSummed, w.WordSum, w.Meta.Codec
	s.seq++
	o.seq = s.seq
	o.prepared = true
	return nil
}

func (s *Store) finishWriteLocked(o *op) {
	si := &s.slots[o.slot]
	if !(si.busy == -1) {
		invariants.Failf("slot %d finished a write with busy = %d", o.slot, si.busy)
	}
	si.busy = 0
	if o.err != nil {
		si.state = stEmpty
		return
	}
	m := &o.meta
	*si = slotInfo{state: stReadable, codec: o.codec, ntok: uint32(len(m.Tokens)), payloadLen: uint32(o.plen),
		position: m.Position, key: m.Key, parent: m.Parent, salt: m.Salt, seq: o.seq}
	copy(s.tokens[int(o.slot)*s.cfg.MaxTokens:], m.Tokens)
	s.index[m.Key] = o.slot
	s.ctr.writes.Add(1)
	s.ctr.writeBytes.Add(uint64(o.plen))
}

// Read reads slot's block into dst and returns its identity. Any failure to
// produce a verified block is a miss: errors.Is(err, ErrNotFound); a slot
// that failed verification is dropped (ErrCorrupt) and one that failed with
// an I/O error too (ErrIO). It reads blocks of codec 0 (None) only
// (ReadBatch names another, ReadOp.WantCodec). In direct mode dst MUST be
// aligned like Write's payload. The returned Tokens are a new slice (one allocation when the
// block has tokens); ReadBatch reuses the caller's.
func (s *Store) Read(ctx context.Context, slot Slot, dst []byte) (BlockMeta, error) {
	ops := [1]ReadOp{{Slot: slot, Dst: dst}}
	if err := s.ReadBatch(ctx, ops[:]); err != nil {
		return BlockMeta{}, err
	}
	return ops[0].Meta, ops[0].Err
}

// ReadKey reads the block stored under key, like Read (codec None only);
// an absent key is ErrNotFound.
func (s *Store) ReadKey(ctx context.Context, key uint64, dst []byte) (Slot, BlockMeta, error) {
	ops := [1]ReadOp{{Slot: NoSlot, Key: key, Dst: dst}}
	if err := s.ReadBatch(ctx, ops[:]); err != nil {
		return NoSlot, BlockMeta{}, err
	}
	return ops[0].Slot, ops[0].Meta, ops[0].Err
}

// ReadBatch reads several blocks; runs of adjacent slots come in with one
// preadv each. Each op's Err says how it went. With Meta.Tokens of enough
// capacity, a batch of one block allocates nothing.
func (s *Store) ReadBatch(ctx context.Context, ops []ReadOp) error {
	if err := s.begin(ctx); err != nil {
		s.ops.RUnlock()
		return err
	}
	defer s.ops.RUnlock()
	sc := getScratch(len(ops))
	defer putScratch(sc)
	in := sc.ops
	s.mu.Lock()
	for i := range ops {
		in[i].err = s.prepareReadLocked(&in[i], &ops[i])
		in[i].slot = ops[i].Slot
	}
	s.mu.Unlock()
	s.execute(ctx, sc, false)
	s.mu.Lock()
	for i := range ops {
		o := &in[i]
		if o.err == nil && o.hashPending {
			invariants.Failf("slot %d: read would succeed with its payload unchecked", o.slot)
		}
		if o.prepared {
			s.finishReadLocked(o)
		}
		if o.err == nil {
			ops[i].Meta = o.meta
		}
		ops[i].Deferred, ops[i].Check = o.err == nil && o.deferred, PayloadCheck{}
		if o.err == nil && o.wordSum {
			ops[i].Check = PayloadCheck{WordSum: o.sum, slot: o.slot, seq: o.seq}
		}
		if ops[i].Deferred {
			s.ctr.deferred.Add(1)
		}
		ops[i].Err = o.err
	}
	s.mu.Unlock()
	return nil
}

func (s *Store) prepareReadLocked(o *op, r *ReadOp) error {
	if r.Slot == NoSlot {
		t, ok := s.index[r.Key]
		if !ok {
			return fmt.Errorf("%w: key %#x", ErrNotFound, r.Key)
		}
		r.Slot = t
	}
	si, err := s.slotLocked(r.Slot)
	if err != nil {
		return err
	}
	if si.state != stReadable {
		return fmt.Errorf("%w: slot %d holds no readable block", ErrNotFound, r.Slot)
	}
	if si.busy < 0 {
		return fmt.Errorf("%w: read of slot %d during its write", ErrBusy, r.Slot)
	}
	if si.codec != r.WantCodec {
		return fmt.Errorf("%w: %w: slot %d holds key %#x in codec %d, the read wants codec %d", ErrNotFound, ErrCodec, r.Slot, si.key, si.codec, r.WantCodec)
	}
	if len(r.Dst) < int(si.payloadLen) {
		return fmt.Errorf("%w: slot %d holds %d bytes, dst has %d", ErrInvalid, r.Slot, si.payloadLen, len(r.Dst))
	}
	if err := s.checkAligned(r.Slot, "dst", r.Dst); err != nil {
		return err
	}
	si.busy++
	o.file, o.idx = s.geom.split(r.Slot)
	o.buf, o.plen, o.meta = r.Dst, int(si.payloadLen), r.Meta
	o.seq, o.key, o.codec = si.seq, si.key, si.codec
	o.deferSum = r.DeferWordSum
	o.prepared = true
	return nil
}

func (s *Store) finishReadLocked(o *op) {
	si := &s.slots[o.slot]
	if !(si.busy > 0) {
		invariants.Failf("slot %d finished a read with busy = %d", o.slot, si.busy)
	}
	si.busy--
	if o.err == nil {
		s.ctr.reads.Add(1)
		s.ctr.readBytes.Add(uint64(o.plen))
		return
	}
	if errors.Is(o.err, ErrCorrupt) || errors.Is(o.err, ErrIO) {
		if si.state == stReadable && si.seq == o.seq {
			s.forgetLocked(o.slot, si)
		}
	}
}

// execute groups the prepared ops (err == nil) into runs of adjacent slots
// and runs them on the pool; it returns when every submitted run finished.
func (s *Store) execute(ctx context.Context, sc *scratch, write bool) {
	ops := sc.ops
	order := sc.order[:0]
	for i := range ops {
		if ops[i].err == nil {
			order = append(order, i)
		}
	}
	slices.SortFunc(order, func(a, b int) int {
		if ops[a].file != ops[b].file {
			return ops[a].file - ops[b].file
		}
		return ops[a].idx - ops[b].idx
	})
	if !write && !s.direct && len(order) > 1 {
		// Buffered reads of a batch: start readahead of every slot first,
		// so that the page cache fills in parallel with the first reads.
		for _, k := range order {
			o := &ops[k]
			_ = s.files[o.file].f.Advise(s.geom.slotOffset(o.idx), s.geom.slotBytes, AdviceWillNeed)
		}
	}
	var wg *sync.WaitGroup // only for batches of several runs
	for start := 0; start < len(order); {
		end := start + 1
		bytes := s.geom.slotBytes
		for end < len(order) && end-start < maxRunSlots {
			prev, next := &ops[order[end-1]], &ops[order[end]]
			if next.file != prev.file || next.idx != prev.idx+1 || prev.plen != s.geom.payloadRegion ||
				bytes+s.geom.slotBytes > int64(s.cfg.MaxIOBytes) {
				break
			}
			bytes += s.geom.slotBytes
			end++
		}
		run := order[start:end]
		start = end
		w, err := s.pool.acquire(ctx)
		for _, k := range run {
			if err != nil {
				ops[k].err = err
			} else {
				ops[k].submitted = true
			}
		}
		if err != nil {
			continue
		}
		if start == len(order) {
			s.doRun(w, ops, run, write) // the last (often the only) run runs here
			break
		}
		if wg == nil {
			wg = new(sync.WaitGroup)
		}
		wg.Go(func() { s.doRun(w, ops, run, write) })
	}
	if wg != nil {
		wg.Wait()
	}
}

// doRun runs one run of adjacent slots on w, then releases w. A read run
// releases w as soon as the headers are checked: hashing the payloads, the
// one CPU-heavy step (the bytes are cold after DMA: ~50-100 µs per 256 KiB
// on a loaded 2-core VM), then runs on this goroutine while another run's
// I/O uses the worker. The workers bound the I/O in flight, not the CPU.
func (s *Store) doRun(w *worker, ops []op, run []int, write bool) {
	if write {
		s.writeRun(w, ops, run)
		s.pool.release(w)
		return
	}
	s.readRun(w, ops, run)
	s.pool.release(w)
	if testHookPayloadCheck != nil {
		testHookPayloadCheck(ops[run[0]].slot)
	}
	var iw *worker // taken only to invalidate a corrupt slot
	for _, k := range run {
		if o := &ops[k]; o.err == nil && o.hashPending {
			if o.wordSum && o.deferSum {
				o.hashPending, o.deferred = false, true
				continue
			}
			if s.checkPayload(o) {
				continue
			}
			if iw == nil {
				iw = s.pool.acquireNow()
			}
			s.invalidate(iw, o)
		}
	}
	if iw != nil {
		s.pool.release(iw)
	}
}

// appendPayload adds the iovecs for one payload of plen bytes in buf. In
// direct mode an unaligned tail goes through the worker's bounce buffer.
// It reports whether the tail buffer is used.
func (s *Store) appendPayload(w *worker, buf []byte, plen int, write bool) bool {
	if !s.direct {
		w.bufs = append(w.bufs, buf[:plen])
		return false
	}
	a := s.geom.alignBytes
	up := (plen + a - 1) / a * a
	if len(buf) >= up {
		w.bufs = append(w.bufs, buf[:up])
		return false
	}
	down := plen / a * a
	if down > 0 {
		w.bufs = append(w.bufs, buf[:down])
	}
	if write {
		n := copy(w.tail, buf[down:plen])
		clear(w.tail[n:])
	}
	w.bufs = append(w.bufs, w.tail)
	return true
}

func (s *Store) writeRun(w *worker, ops []op, run []int) {
	g := &s.geom
	first := &ops[run[0]]
	sf := &s.files[first.file]
	off := g.slotOffset(first.idx)
	w.bufs = w.bufs[:0]
	for i, k := range run {
		o := &ops[k]
		hb := w.hdr[i*g.hdrBytes : (i+1)*g.hdrBytes]
		// A local header: w.h's token storage is the worker's, and must not
		// alias the caller's Tokens, which a later decode would overwrite.
		sum := o.sum
		if !o.wordSum {
			sum = sf.sums.payload(o.buf[:o.plen], false)
		}
		h := header{version: formatVersion, seq: o.seq, key: o.meta.Key, parent: o.meta.Parent,
			salt: o.meta.Salt, position: o.meta.Position, payloadLen: uint32(o.plen), slot: uint32(o.idx), file: uint32(o.file),
			payloadSum: sum, wordSum: o.wordSum, codec: o.codec, tokens: o.meta.Tokens}
		encodeHeader(hb, &h, sf.sums)
		if s.cfg.Durable {
			w.bufs = append(w.bufs, w.zero)
		} else {
			w.bufs = append(w.bufs, hb)
		}
		s.appendPayload(w, o.buf, o.plen, true)
	}
	fail := func(what string, err error) {
		err = fmt.Errorf("nvme: %s slots %d..%d of %s at offset %d: %w: %w", what, first.idx, ops[run[len(run)-1]].idx, sf.path, off, ErrIO, err)
		for _, k := range run {
			ops[k].err = err
		}
	}
	total := int64(0)
	for _, b := range w.bufs {
		total += int64(len(b))
	}
	if err := s.writeFull(sf.f, w.bufs, off); err != nil {
		fail("write", err)
		return
	}
	if s.cfg.Durable {
		if err := s.sync(sf.f); err != nil {
			fail("sync payloads of", err)
			return
		}
		for i, k := range run {
			o := &ops[k]
			// w.bufs is free again: the run's payloads are written.
			w.bufs = append(w.bufs[:0], w.hdr[i*g.hdrBytes:(i+1)*g.hdrBytes])
			if err := s.writeFull(sf.f, w.bufs, g.slotOffset(o.idx)); err != nil {
				fail("write headers of", err)
				return
			}
		}
		if err := s.sync(sf.f); err != nil {
			fail("sync headers of", err)
			return
		}
	}
	if !s.direct {
		_ = sf.f.Advise(off, total, AdviceDontNeed)
	}
}

func (s *Store) readRun(w *worker, ops []op, run []int) {
	g := &s.geom
	first := &ops[run[0]]
	sf := &s.files[first.file]
	off := g.slotOffset(first.idx)
	w.bufs = w.bufs[:0]
	tail := false
	for i, k := range run {
		o := &ops[k]
		w.bufs = append(w.bufs, w.hdr[i*g.hdrBytes:(i+1)*g.hdrBytes])
		tail = s.appendPayload(w, o.buf, o.plen, false)
	}
	total := int64(0)
	for _, b := range w.bufs {
		total += int64(len(b))
	}
	if err := s.readFull(sf.f, w.bufs, off); err != nil {
		err = fmt.Errorf("nvme: read slots %d..%d of %s at offset %d: %w: %w: %w", first.idx, ops[run[len(run)-1]].idx, sf.path, off, ErrNotFound, ErrIO, err)
		for _, k := range run {
			ops[k].err = err
		}
		return
	}
	if !s.direct {
		_ = sf.f.Advise(off, total, AdviceDontNeed)
	}
	for i, k := range run {
		o := &ops[k]
		if tail && i == len(run)-1 {
			down := o.plen / g.alignBytes * g.alignBytes
			copy(o.buf[down:o.plen], w.tail)
		}
		if err := s.checkHeader(w, w.hdr[i*g.hdrBytes:(i+1)*g.hdrBytes], o); err != nil {
			s.corrupt(o, err)
			s.invalidate(w, o)
		}
	}
}

// testHookPayloadCheck, when a test sets it, is called with a read run's
// first slot after the run's worker went back and before its payloads are
// hashed.
var testHookPayloadCheck func(first Slot)

// corrupt counts a slot that failed verification and sets its error.
func (s *Store) corrupt(o *op, err error) {
	s.ctr.corrupt.Add(1)
	o.err = fmt.Errorf("nvme: slot %d (%s offset %d): %w: %w", o.slot, s.files[o.file].path, s.geom.slotOffset(o.idx), ErrNotFound, err)
}

// checkHeader checks a header read back against what the slot should hold,
// fills o.meta from it and keeps its payload checksum in o.sum. The read is
// not verified until checkPayload also passes (o.hashPending until then).
// It uses only the worker's memory, so the worker may go once it returns.
func (s *Store) checkHeader(w *worker, hb []byte, o *op) error {
	h := &w.h
	h.tokens = h.tokens[:0:cap(h.tokens)]
	if err := decodeHeader(hb, h, s.cfg.MaxTokens, s.files[o.file].sums); err != nil {
		if errors.Is(err, errEmptySlot) {
			return fmt.Errorf("%w: header is gone (zeroed)", ErrCorrupt)
		}
		if errors.Is(err, ErrFormatVersion) {
			// This store wrote the slot: another version now is damage.
			return fmt.Errorf("%w: %w", ErrCorrupt, err)
		}
		return err
	}
	if h.seq != o.seq || h.key != o.key || h.slot != uint32(o.idx) || h.file != uint32(o.file) || h.payloadLen != uint32(o.plen) {
		return fmt.Errorf("%w: header names key %#x seq %d file %d slot %d length %d, want key %#x seq %d file %d slot %d length %d",
			ErrCorrupt, h.key, h.seq, h.file, h.slot, h.payloadLen, o.key, o.seq, o.file, o.idx, o.plen)
	}
	if h.codec != o.codec {
		return fmt.Errorf("%w: header says codec %d, the slot was written (and is read) in codec %d", ErrCorrupt, h.codec, o.codec)
	}
	m := &o.meta
	m.Key, m.Parent, m.Salt, m.Position, m.PayloadBytes, m.Codec = h.key, h.parent, h.salt, h.position, o.plen, h.codec
	m.Tokens = append(m.Tokens[:0], h.tokens...)
	o.sum, o.wordSum, o.hashPending = h.payloadSum, h.wordSum, true
	return nil
}

// checkPayload hashes the payload read into o.buf and compares it with the
// checksum of the header that checkHeader accepted. Only then is the read
// verified: ReadBatch hands o.meta to the caller only when o.err is nil,
// which every read reaches through here. It reports whether the payload
// passed.
func (s *Store) checkPayload(o *op) bool {
	o.hashPending = false
	if sum := s.files[o.file].sums.payload(o.buf[:o.plen], o.wordSum); sum != o.sum {
		s.corrupt(o, fmt.Errorf("%w: payload checksum %#x, header says %#x", ErrCorrupt, sum, o.sum))
		return false
	}
	return true
}

// ReportCorrupt reports that a payload whose check ReadBatch left to the
// caller (ReadOp.Deferred) failed it. If the slot still holds
// that block, the store drops it and clears its header on disk (synced),
// as it does for a payload it finds corrupt itself, so that no restart
// adopts it again; it counts it in CorruptDrops and ReportedCorrupt. A
// slot rewritten or freed since the read is left alone. It returns an
// error only for a closed store or a check no read returned.
func (s *Store) ReportCorrupt(c PayloadCheck) error {
	if err := s.begin(context.Background()); err != nil {
		s.ops.RUnlock()
		return err
	}
	defer s.ops.RUnlock()
	s.mu.Lock()
	si, err := s.slotLocked(c.slot)
	if err != nil || c.seq == 0 {
		s.mu.Unlock()
		return fmt.Errorf("%w: ReportCorrupt of a check no read returned (slot %d, seq %d)", ErrInvalid, c.slot, c.seq)
	}
	if si.state != stReadable || si.seq != c.seq || si.busy < 0 {
		s.mu.Unlock()
		return nil
	}
	s.forgetLocked(c.slot, si)
	si.busy++ // no write may start on the slot while its header is cleared
	s.mu.Unlock()
	s.ctr.corrupt.Add(1)
	s.ctr.reported.Add(1)
	o := op{slot: c.slot}
	o.file, o.idx = s.geom.split(c.slot)
	w := s.pool.acquireNow()
	s.invalidate(w, &o)
	s.pool.release(w)
	s.mu.Lock()
	si.busy--
	s.mu.Unlock()
	return nil
}

// invalidate clears, durably, the header of o's slot, which a read has just
// found corrupt, so that no restart adopts the slot again (the read's
// caller recomputes the block; a crash loop over one bad block is what this
// prevents). The slot is still busy with that read, so no write races with
// this one. A failure is counted (Stats.WriteIOErrors or SyncIOErrors) and
// otherwise ignored: the slot is dropped from the index either way, and a
// restart finds it corrupt again and retries.
func (s *Store) invalidate(w *worker, o *op) {
	sf := &s.files[o.file]
	bufs := [1][]byte{w.zero}
	if err := s.writeFull(sf.f, bufs[:], s.geom.slotOffset(o.idx)); err != nil {
		return
	}
	if err := s.sync(sf.f); err != nil {
		return
	}
	s.ctr.invalidated.Add(1)
}

// readFull reads all of bufs at off, continuing after short reads; a read
// that makes no progress is io.ErrUnexpectedEOF. Failures are counted.
func (s *Store) readFull(f File, bufs [][]byte, off int64) error {
	return s.full(f.ReadAtv, bufs, off, io.ErrUnexpectedEOF, &s.ctr.readErr)
}

// writeFull writes all of bufs at off, continuing after short writes; a
// write that makes no progress is io.ErrShortWrite.
func (s *Store) writeFull(f File, bufs [][]byte, off int64) error {
	return s.full(f.WriteAtv, bufs, off, io.ErrShortWrite, &s.ctr.writeErr)
}

// scratch is the per-call state of a batch, pooled so that a call of one
// block allocates nothing.
type scratch struct {
	ops   []op
	order []int
}

var scratchPool = sync.Pool{New: func() any { return new(scratch) }}

func getScratch(n int) *scratch {
	sc := scratchPool.Get().(*scratch)
	if cap(sc.ops) < n {
		sc.ops = make([]op, n)
		sc.order = make([]int, 0, n)
	}
	sc.ops = sc.ops[:n]
	return sc
}

func putScratch(sc *scratch) {
	clear(sc.ops) // drop references to caller buffers
	scratchPool.Put(sc)
}

var bufsPool = sync.Pool{New: func() any { v := make([][]byte, 0, 2*maxRunSlots+1); return &v }}

func (s *Store) full(call func([][]byte, int64) (int, error), bufs [][]byte, off int64, short error, errs *[NumIOErrorKinds]atomic.Uint64) error {
	left := 0
	for _, b := range bufs {
		left += len(b)
	}
	var rest *[][]byte
	for left > 0 {
		n, err := call(bufs, off)
		s.ctr.syscalls.Add(1)
		if err == nil && (n <= 0 || n > left) {
			err = fmt.Errorf("%w: %d of %d bytes", short, max(n, 0), left)
		}
		if err != nil {
			errs[classify(err)].Add(1)
			if rest != nil {
				bufsPool.Put(rest)
			}
			return err
		}
		left -= n
		off += int64(n)
		if left == 0 {
			break
		}
		// Continue after the n bytes done, in a copy of the vector: the
		// caller's slice must not change.
		if rest == nil {
			rest = bufsPool.Get().(*[][]byte)
			*rest = append((*rest)[:0], bufs...)
			bufs = *rest
		}
		for n > 0 {
			if n >= len(bufs[0]) {
				n -= len(bufs[0])
				bufs = bufs[1:]
				continue
			}
			bufs[0] = bufs[0][n:]
			n = 0
		}
	}
	if rest != nil {
		bufsPool.Put(rest)
	}
	return nil
}

func (s *Store) sync(f File) error {
	s.ctr.syncs.Add(1)
	if err := f.Datasync(); err != nil {
		s.ctr.syncErr[classify(err)].Add(1)
		return err
	}
	return nil
}
