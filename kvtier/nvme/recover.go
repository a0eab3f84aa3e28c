package nvme

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"

	"kvtier.dev/kvtier/nvme/internal/sysio"
)

// recoverChunkSlots is how many slots one scan task covers.
const recoverChunkSlots = 256

// scanResult is what the scan found in one slot.
type scanResult struct {
	outcome scanOutcome
	h       header
}

type scanOutcome uint8

const (
	scanEmpty scanOutcome = iota
	scanGood
	scanCorrupt
	scanVersion
	scanIOError
)

// recover scans every slot header in parallel on the pool, verifies it (and
// its payload with Config.VerifyPayloadOnOpen), and rebuilds the slot table,
// the key index and the free lists. Where two slots hold the same key the
// newer (higher sequence number) wins and the other is freed. Corrupt,
// foreign and old-format slots are counted and freed; an I/O error on one
// slot frees it too; none of them fails Open. A corrupt slot's header is
// also cleared on disk (synced before Open returns), so that it is counted
// once, not at every restart.
func (s *Store) recover() error {
	g := &s.geom
	n := len(s.slots)
	res := make([]scanResult, n)
	var (
		progMu  sync.Mutex
		prog    = RecoverProgress{SlotsTotal: n}
		wg      sync.WaitGroup
		ctx     = context.Background()
		cleared = make([]atomic.Int64, len(s.files)) // headers cleared, per file
		wiped   = make([]wipe, len(s.files))         // of files written for another model
	)
	for start := 0; start < n; start += recoverChunkSlots {
		end := min(start+recoverChunkSlots, n)
		w, err := s.pool.acquire(ctx)
		if err != nil {
			return err
		}
		wg.Go(func() {
			defer s.pool.release(w)
			good, bad := 0, 0
			for slot := start; slot < end; slot++ {
				r := &res[slot]
				if fi, _ := g.split(Slot(slot)); s.clearing[fi] {
					r.outcome = scanEmpty
					s.clearSlot(w, Slot(slot), &wiped[fi])
					continue
				}
				r.outcome = s.scanSlot(w, Slot(slot), &r.h)
				switch r.outcome {
				case scanGood:
					good++
				case scanCorrupt:
					bad++
					s.clearHeader(w, Slot(slot), cleared)
				case scanVersion, scanIOError:
					bad++
				}
			}
			progMu.Lock()
			defer progMu.Unlock()
			prog.SlotsScanned += end - start
			prog.Recovered += good
			prog.Dropped += bad
			if s.cfg.Progress != nil {
				s.cfg.Progress(prog)
			}
		})
	}
	wg.Wait()
	// The cleared headers of corrupt slots go to disk before Open returns,
	// so that the next restart does not meet them again.
	for fi := range s.files {
		if n := cleared[fi].Load(); n > 0 {
			if err := s.sync(s.files[fi].f); err == nil {
				s.ctr.invalidated.Add(uint64(n))
			}
		}
	}
	if err := s.recordModel(wiped); err != nil {
		return err
	}

	s.buildIndex(res)
	return nil
}

// buildIndex makes the slot table, the key index and the free lists from
// what the scan found.
func (s *Store) buildIndex(res []scanResult) {
	g := &s.geom
	s.mu.Lock()
	defer s.mu.Unlock()
	for i := range res {
		r := &res[i]
		switch r.outcome {
		case scanCorrupt:
			s.ctr.corrupt.Add(1)
		case scanVersion:
			s.ctr.version.Add(1)
		}
		if r.outcome != scanGood {
			continue
		}
		s.seq = max(s.seq, r.h.seq)
		if t, ok := s.index[r.h.key]; ok {
			if res[t].h.seq > r.h.seq {
				s.ctr.duplicate.Add(1)
				continue
			}
			s.slots[t] = slotInfo{state: stFree}
			s.ctr.duplicate.Add(1)
		}
		s.slots[i] = slotInfo{state: stReadable, codec: r.h.codec, ntok: uint32(len(r.h.tokens)), payloadLen: r.h.payloadLen,
			position: r.h.position, key: r.h.key, parent: r.h.parent, salt: r.h.salt, seq: r.h.seq}
		copy(s.tokens[i*s.cfg.MaxTokens:], r.h.tokens)
		s.index[r.h.key] = Slot(i)
	}
	s.ctr.recovered.Store(uint64(len(s.index)))
	for fi := range s.free {
		s.free[fi] = make([]uint32, 0, g.slotsPerFile)
		for idx := g.slotsPerFile - 1; idx >= 0; idx-- {
			if s.slots[fi*g.slotsPerFile+idx].state == stFree {
				s.free[fi] = append(s.free[fi], uint32(idx))
			}
		}
		s.nfree += len(s.free[fi])
	}
	s.checkLocked()
}

// wipe is what recover did to a file written for another model.
type wipe struct {
	slots  atomic.Int64 // headers cleared
	failed atomic.Bool  // a header could not be cleared
}

// clearSlot zeroes slot's header, in a file written for another model,
// unless it reads back empty.
func (s *Store) clearSlot(w *worker, slot Slot, wp *wipe) {
	fi, idx := s.geom.split(slot)
	f, off := s.files[fi].f, s.geom.slotOffset(idx)
	hb := w.hdr[:s.geom.hdrBytes]
	if err := s.readFull(f, [][]byte{hb}, off); err == nil && binary.LittleEndian.Uint64(hb) == 0 {
		return
	}
	if err := s.writeFull(f, [][]byte{w.zero}, off); err != nil {
		wp.failed.Store(true)
		return
	}
	wp.slots.Add(1)
}

// recordModel makes the files recover cleared (written for another model)
// this store's: their cleared headers are synced, then their superblocks,
// which record Config.Model, are written and synced. In that order, a
// crash leaves a file that still names the other model, and the next Open
// clears it again. A header that could not be cleared fails Open.
func (s *Store) recordModel(wiped []wipe) error {
	for fi := range s.files {
		if !s.clearing[fi] {
			continue
		}
		p, f := s.files[fi].path, s.files[fi].f
		if wiped[fi].failed.Load() {
			return fmt.Errorf("nvme: %s was written for another model and a slot header could not be cleared (see Stats.WriteIOErrors): nothing of it is used", p)
		}
		if err := s.sync(f); err != nil {
			return fmt.Errorf("nvme: clearing %s, written for another model: %w", p, err)
		}
		if err := s.writeSuper(fi); err != nil {
			return err
		}
		if err := s.sync(f); err != nil {
			return fmt.Errorf("nvme: clearing %s, written for another model: %w", p, err)
		}
		n := wiped[fi].slots.Load()
		s.ctr.modelCleared.Add(uint64(n))
		for i := range s.info.Cleared {
			if s.info.Cleared[i].Path == p {
				s.info.Cleared[i].Slots = int(n)
			}
		}
		s.clearing[fi] = false
	}
	return nil
}

// clearHeader zeroes the header of slot, found corrupt by the scan; the
// caller syncs its file afterwards. A failed write is counted and leaves
// the slot to be found again at the next Open.
func (s *Store) clearHeader(w *worker, slot Slot, cleared []atomic.Int64) {
	fi, idx := s.geom.split(slot)
	bufs := [1][]byte{w.zero}
	if err := s.writeFull(s.files[fi].f, bufs[:], s.geom.slotOffset(idx)); err != nil {
		return
	}
	cleared[fi].Add(1)
}

// scanSlot reads and checks one slot's header (and payload, if asked).
func (s *Store) scanSlot(w *worker, slot Slot, h *header) scanOutcome {
	g := &s.geom
	fi, idx := g.split(slot)
	f := s.files[fi].f
	off := g.slotOffset(idx)
	hb := w.hdr[:g.hdrBytes]
	if err := s.readFull(f, [][]byte{hb}, off); err != nil {
		return scanIOError
	}
	h.tokens = make([]uint32, 0, s.cfg.MaxTokens)
	if err := decodeHeader(hb, h, s.cfg.MaxTokens, s.files[fi].sums); err != nil {
		switch {
		case errors.Is(err, errEmptySlot):
			return scanEmpty
		case errors.Is(err, ErrFormatVersion):
			return scanVersion
		}
		return scanCorrupt
	}
	if h.slot != uint32(idx) || h.file != uint32(fi) || int(h.payloadLen) > s.cfg.BlockBytes || h.payloadLen == 0 {
		return scanCorrupt
	}
	if len(h.tokens) == 0 {
		h.tokens = nil
	}
	if !s.cfg.VerifyPayloadOnOpen {
		return scanGood
	}
	if w.payload == nil {
		b, err := sysio.AllocAligned(g.payloadRegion)
		if err != nil {
			return scanIOError
		}
		w.payload = b
	}
	p := w.payload[:roundUp(int64(h.payloadLen), int64(g.alignBytes))]
	if !s.direct {
		p = w.payload[:h.payloadLen]
	}
	if err := s.readFull(f, [][]byte{p}, off+int64(g.hdrBytes)); err != nil {
		return scanIOError
	}
	if s.files[fi].sums.payload(p[:h.payloadLen], h.wordSum) != h.payloadSum {
		return scanCorrupt
	}
	return scanGood
}
