package devmover

import (
	"context"
	"errors"
	"fmt"

	"kvtier.dev/internal/invariants"
	"kvtier.dev/kvtier"
	"kvtier.dev/kvtier/nvme"
	"kvtier.dev/kvtier/transfer"
)

// The NVMe paths: the store's slots, writes from host slots, reads into
// host slots, and the staged loads' source. Writes and reads run on
// goroutines of the mover's and complete their ops when the store returns.

// takeStore maps the store's slots to the manager's and allocates all of
// them, so that a slot freed later is the only free one and Allocate
// returns it. The blocks left from before take the manager's first slots
// when keep is set, and are freed otherwise.
func (d *Mover) takeStore(want int, keep bool) error {
	total := d.store.Info().Slots
	if total < want {
		return configErr("NVMeSlots", "%d, but the store has only %d slots", want, total)
	}
	d.owner = make([]int32, total)
	for i := range d.owner {
		d.owner[i] = -1
	}
	d.nvmeSlot = make([]nvme.Slot, want)
	d.writing = make([]bool, want)
	var ferr error
	d.store.Range(func(s nvme.Slot, meta nvme.BlockMeta) bool {
		// Only blocks in this mover's codec are adopted: a store written by
		// a server of another codec setting gives back the others' slots.
		if i := len(d.recovered); keep && i < want && int64(meta.PayloadBytes) == d.blockBytes && meta.Codec == uint8(d.nvmeCodec) {
			d.nvmeSlot[i] = s
			d.owner[s] = int32(i)
			r := kvtier.Resident{Slot: kvtier.Slot(i), Key: kvtier.Key(meta.Key), Parent: kvtier.Key(meta.Parent), Salt: kvtier.Salt(meta.Salt), Position: int(meta.Position)}
			if len(meta.Tokens) > 0 {
				r.Tokens = make([]int32, len(meta.Tokens))
				for j, tok := range meta.Tokens {
					r.Tokens[j] = int32(tok)
				}
			}
			d.recovered = append(d.recovered, r)
			return true
		}
		ferr = d.store.Free(s)
		return ferr == nil
	})
	if ferr != nil {
		return fmt.Errorf("devmover: free the store's leftover blocks: %w", ferr)
	}
	for i := len(d.recovered); ; i++ {
		s, err := d.store.Allocate()
		if errors.Is(err, nvme.ErrFull) {
			if i < want {
				return fmt.Errorf("devmover: the store gave %d free slots, %d wanted: %w", i, want, err)
			}
			return nil
		}
		if err != nil {
			return fmt.Errorf("devmover: allocate store slot %d: %w", i, err)
		}
		if i < want {
			d.nvmeSlot[i] = s
			d.owner[s] = int32(i)
		}
	}
}

// runWrites writes host slots to the store, each in its turn on the drive,
// and completes each op as its write returns; an op whose block is no
// longer wanted when its turn comes is dropped unwritten.
func (d *Mover) runWrites(j *job) {
	defer d.wg.Done()
	for k := range j.writes {
		w := j.writes[k : k+1]
		j.b.Complete(w[0].i, d.writeInTurn(j.b, w, fmt.Sprintf("store slot %d", w[0].op.Slot)))
	}
}

// writeInTurn writes w (one write) in its ticket's turn on the drive,
// unless b no longer wants it, and returns the op's error (what names
// where it came from).
func (d *Mover) writeInTurn(b *kvtier.Batch, w []write, what string) error {
	if !b.Wanted(w[0].i) {
		d.drive.skip(w[0].ticket)
		d.stats.dropped.Add(1)
		return fmt.Errorf("nvme write of %s: %w", what, kvtier.ErrNotWanted)
	}
	d.drive.write(w[0].ticket, int64(len(w[0].op.Payload)), func() { d.writeAll(w) })
	if err := w[0].op.Err; err != nil {
		err = fmt.Errorf("nvme write of %s: %w", what, err)
		d.stats.failed(1, err)
		return err
	}
	return nil
}

// writeAll writes ws, marking their slots busy meanwhile, then rewrites
// each op the store refused because a stale copy of its key sits in a slot
// the manager has since freed. Each write's op.Err says how it went.
func (d *Mover) writeAll(ws []write) {
	ops := make([]nvme.WriteOp, len(ws))
	d.mu.Lock()
	for k := range ws {
		d.writing[ws[k].to] = true
		ops[k] = ws[k].op
	}
	d.mu.Unlock()
	err := d.store.WriteBatch(context.Background(), ops)
	d.mu.Lock()
	for _, w := range ws {
		d.writing[w.to] = false
	}
	d.cond.Broadcast()
	d.mu.Unlock()
	for k := range ws {
		ws[k].op.Err = ops[k].Err
		switch {
		case err != nil:
			ws[k].op.Err = err
		case errors.Is(ops[k].Err, nvme.ErrKeyExists):
			ws[k].op.Err = d.rewrite(&ws[k].op, ws[k].to)
		}
	}
}

// rewrite empties the store slot that still holds op's key from before the
// manager evicted it there, then writes op again. The manager holds a block
// in one NVMe slot at a time and writes it only where it has none, so a
// copy elsewhere is stale, and its slot is free in the manager or reserved
// for another block's write. If that write is in flight, rewrite waits for
// it (it replaces the stale copy); otherwise it frees the slot and
// allocates it again, which returns the same slot since the mover holds
// all others. It holds no slot marked while it waits, so writers cannot
// wait for each other in a cycle.
func (d *Mover) rewrite(op *nvme.WriteOp, slot kvtier.Slot) error {
	d.mu.Lock()
	for {
		s, ok := d.store.Lookup(op.Meta.Key)
		if !ok || s == op.Slot {
			break
		}
		if o := d.owner[s]; o >= 0 && d.writing[o] {
			d.cond.Wait()
			continue
		}
		if err := d.store.Free(s); err != nil {
			d.mu.Unlock()
			return fmt.Errorf("%w (and freeing its stale copy failed: %w)", nvme.ErrKeyExists, err)
		}
		s2, err := d.store.Allocate()
		if err != nil {
			d.mu.Unlock()
			return fmt.Errorf("%w (and taking back store slot %d failed: %w)", nvme.ErrKeyExists, s, err)
		}
		if s2 != s {
			invariants.Failf("freed store slot %d but Allocate returned %d: someone else allocates from the store", s, s2)
		}
		d.stats.reclaims.Add(1)
		break
	}
	d.writing[slot] = true
	d.mu.Unlock()
	err := d.store.Write(context.Background(), op.Slot, op.Meta, op.Payload)
	d.mu.Lock()
	d.writing[slot] = false
	d.cond.Broadcast()
	d.mu.Unlock()
	return err
}

// runReads reads store slots into host slots, checks what they hold, then
// completes the ops.
func (d *Mover) runReads(j *job) {
	defer d.wg.Done()
	ops := make([]nvme.ReadOp, len(j.reads))
	for k := range j.reads {
		ops[k] = j.reads[k].op
	}
	var err error
	read := d.drive.read
	if j.b.Lease() == nil { // a prefetch: after the requests' reads
		read = d.drive.background
	}
	read(int64(len(ops))*d.blockBytes, func() { err = d.store.ReadBatch(context.Background(), ops) })
	for k := range j.reads {
		r, op := &j.reads[k], &ops[k]
		e := err
		if e == nil {
			e = op.Err
		}
		if e == nil {
			e = r.want.check(op.Meta)
		}
		if e == nil && d.sums && op.Check.Valid() {
			d.setHostSum(int32(r.to), r.block, op.Check.WordSum)
		}
		if e != nil {
			e = fmt.Errorf("nvme read of store slot %d: %w", op.Slot, e)
			d.stats.failed(1, e)
			if err == nil && lostBlock(e) {
				e = fmt.Errorf("%w: %w", kvtier.ErrSourceLost, e)
			}
		}
		j.b.Complete(r.i, e)
	}
}

// lostBlock reports whether a failed NVMe read means the slot's block is
// gone (the store dropped it, or it names another block).
func lostBlock(err error) bool {
	return errors.Is(err, nvme.ErrNotFound) || errors.Is(err, ErrNVMeMismatch)
}

// wantMeta is the identity an NVMe read must find.
type wantMeta struct {
	key, parent, salt uint64
	position          uint32
	tokens            []uint32
}

func wantOf(m nvme.BlockMeta) wantMeta {
	return wantMeta{m.Key, m.Parent, m.Salt, m.Position, m.Tokens}
}

func (w *wantMeta) check(got nvme.BlockMeta) error {
	if got.Key != w.key || got.Parent != w.parent || got.Salt != w.salt || got.Position != w.position {
		return fmt.Errorf("%w: want key %#x parent %#x salt %#x position %d, found key %#x parent %#x salt %#x position %d",
			ErrNVMeMismatch, w.key, w.parent, w.salt, w.position, got.Key, got.Parent, got.Salt, got.Position)
	}
	if w.tokens != nil {
		if len(got.Tokens) != len(w.tokens) {
			return fmt.Errorf("%w: key %#x: %d tokens stored, want %d", ErrNVMeMismatch, w.key, len(got.Tokens), len(w.tokens))
		}
		for i := range got.Tokens {
			if got.Tokens[i] != w.tokens[i] {
				return fmt.Errorf("%w: key %#x: token %d differs", ErrNVMeMismatch, w.key, i)
			}
		}
	}
	return nil
}

// storeSource feeds a staged onboard from the store, checking each block.
type storeSource struct {
	d      *Mover
	blocks []staged
	rd     [1]nvme.ReadOp
	lost   int // the block whose slot was found lost, or -1; read after Done
	// With the mover's sums: the check of each block whose payload the
	// store left to the GPU (not Valid for the others); read after Done.
	checks []nvme.PayloadCheck
}

// ReadBlock implements transfer.Source. The engine calls it from one
// goroutine at a time.
func (s *storeSource) ReadBlock(ctx context.Context, i int, dst []byte) error {
	slot := s.d.nvmeSlot[s.blocks[i].from]
	s.rd[0] = nvme.ReadOp{Slot: slot, Dst: dst, Meta: nvme.BlockMeta{Tokens: s.rd[0].Meta.Tokens[:0]}, DeferWordSum: s.d.sums, WantCodec: uint8(s.d.nvmeCodec)}
	var rerr error
	s.d.drive.read(int64(len(dst)), func() { rerr = s.d.store.ReadBatch(ctx, s.rd[:]) })
	if rerr != nil {
		return rerr
	}
	err := s.rd[0].Err
	if err == nil && s.checks != nil && s.rd[0].Deferred {
		s.checks[i] = s.rd[0].Check
	}
	if err == nil {
		err = s.blocks[i].want.check(s.rd[0].Meta)
	}
	if err != nil {
		if lostBlock(err) {
			s.lost = i
		}
		return fmt.Errorf("store slot %d: %w", slot, err)
	}
	return nil
}

// checkSum is the staged onboard's per-block check (finishEngine's each):
// a block whose check the store left to the GPU must have landed with the
// sum its header stores; one that did not is reported to the store, which
// drops its slot, and fails with ErrSourceLost.
func (s *storeSource) checkSum(k int, tr *transfer.Transfer) error {
	if s.checks == nil || !s.checks[k].Valid() {
		return nil
	}
	sums := tr.Sums()
	if k >= len(sums) {
		return fmt.Errorf("devmover: the staged onboard returned %d sums for %d blocks", len(sums), len(s.checks))
	}
	c := s.checks[k]
	if sums[k] == c.WordSum {
		return nil
	}
	err := fmt.Errorf("%w: %w: nvme block %#x landed with word sum %#x, its header says %#x", kvtier.ErrSourceLost, nvme.ErrCorrupt, s.blocks[k].key, sums[k], c.WordSum)
	if rerr := s.d.store.ReportCorrupt(c); rerr != nil {
		err = fmt.Errorf("%w (and reporting it to the store failed: %w)", err, rerr)
	}
	return err
}

// blockMeta returns the identity of op's block for an NVMe header: key,
// parent, salt, position, and its token ids when withTokens is set and the
// op carries them.
func blockMeta(op *kvtier.MoveOp, withTokens bool) nvme.BlockMeta {
	meta := nvme.BlockMeta{Key: uint64(op.Key), Parent: uint64(op.Parent), Salt: uint64(op.Salt), Position: uint32(op.Position)}
	if withTokens && op.Tokens != nil {
		meta.Tokens = make([]uint32, len(op.Tokens))
		for k, v := range op.Tokens {
			meta.Tokens[k] = uint32(v)
		}
	}
	return meta
}
