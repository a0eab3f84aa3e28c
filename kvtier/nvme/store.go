package nvme

import (
	"context"
	"errors"
	"fmt"
	"math"
	"sync"
	"unsafe"

	"kvtier.dev/internal/invariants"
)

// Slot names one block slot of the Store: file index × SlotsPerFile + slot
// index within the file.
type Slot uint32

// NoSlot is "no slot": in a ReadOp it asks for a look-up by key.
const NoSlot Slot = math.MaxUint32

// BlockMeta identifies the block a slot holds. Key is the block's chained
// hash; Parent and Salt and the token ids let the block manager confirm a hit
// (design invariant 1). Tokens may be empty when the block manager keeps the
// tokens elsewhere. Position is the block's index in its prefix (0 for the
// first), so that a block whose ancestors are gone can still be placed.
type BlockMeta struct {
	Key, Parent, Salt uint64
	Position          uint32
	Tokens            []uint32
	// PayloadBytes is set by reads and Range; Write uses len(payload).
	PayloadBytes int
	// Codec names the payload's encoding, as a kvtier/codec.Codec value
	// (0 None: the bf16 bytes the GPU holds; 1 FP8E4M3PerHead). The store
	// records it in the slot header without interpreting it, reports it
	// in reads and Range, and reads a block only for a caller that names
	// the same codec (ReadOp.WantCodec).
	Codec uint8
}

// Info describes what Open chose.
type Info struct {
	// Mode is ModeDirect or ModeBuffered: what the probe settled on.
	Mode IOMode
	// AlignBytes is the direct-I/O alignment used for the layout and asked
	// of caller buffers in direct mode; AlignSource says where it came from
	// ("statx", "blockdev" or "default").
	AlignBytes  int
	AlignSource string
	// HeaderBytes and SlotBytes are the on-disk sizes of a header region
	// and of a whole slot, both multiples of 4 KiB and of AlignBytes; slot i
	// of a file starts at FirstSlotOffset + i×SlotBytes and its payload
	// HeaderBytes later. Slots is the number of slots in all.
	HeaderBytes     int
	SlotBytes       int64
	FirstSlotOffset int64
	Slots           int
	// Files are the slab files' paths, in file index order.
	Files []string
	// Preallocated is false when the file system refused fallocate and the
	// files were extended with ftruncate instead.
	Preallocated bool
	// Keyed says the checksums are keyed (Config.ChecksumKey): the store
	// then refuses word sums (WriteOp.WordSummed).
	Keyed bool
	// Cleared lists the slab files that had been written for another
	// model than Config.Model (or by a version that recorded none) and
	// whose slots Open cleared: a caller logs them.
	Cleared []ClearedFile
}

// ClearedFile is a slab file whose slots Open cleared because it had been
// written for another model.
type ClearedFile struct {
	Path string
	// WrittenFor is the first 160 bytes of the Config.Model it had been
	// written for; Recorded is false when its version recorded no model.
	WrittenFor string
	Recorded   bool
	// Slots is how many slots held a block (and were cleared).
	Slots int
}

type slotState uint8

const (
	stFree     slotState = iota // not allocated
	stEmpty                     // allocated, nothing readable
	stReadable                  // allocated, holds a verified block
)

// slotInfo is the in-memory state of one slot. Its tokens live in
// Store.tokens at [slot*MaxTokens, slot*MaxTokens+ntok).
type slotInfo struct {
	state                  slotState
	codec                  uint8 // the block's BlockMeta.Codec
	busy                   int32 // readers in flight, or -1 for a writer
	ntok                   uint32
	payloadLen             uint32
	position               uint32
	key, parent, salt, seq uint64
}

type slabFile struct {
	path string
	f    File
	sums *checksum // its directory's
}

// Store is the NVMe tier. It is safe for concurrent use.
type Store struct {
	cfg  Config
	geom geometry
	info Info
	// direct is true when the files are open with O_DIRECT.
	direct bool
	files  []slabFile
	dirs   []*slabDir // held open (and locked) until Close
	// clearing says which files Open clears (written for another model):
	// set by openFiles, used by recover.
	clearing []bool
	pool     *pool
	ctr      counters

	// ops is held for reading by every operation and for writing by Close,
	// so that Close waits for the I/O in flight.
	ops    sync.RWMutex
	closed bool

	mu       sync.Mutex // guards what follows
	slots    []slotInfo
	tokens   []uint32
	index    map[uint64]Slot
	free     [][]uint32 // per file, a stack of free slot indexes
	nfree    int
	nextFile int
	seq      uint64
	checks   int // calls of checkLocked
}

// Info reports the I/O mode and layout chosen at Open.
func (s *Store) Info() Info { return s.info }

// Stats returns a snapshot of the counters.
func (s *Store) Stats() Stats { return s.ctr.snapshot() }

// Allocate reserves a free slot. The caller owns it until Free; it holds no
// readable block until a Write succeeds.
func (s *Store) Allocate() (Slot, error) {
	s.ops.RLock()
	defer s.ops.RUnlock()
	if s.closed {
		return NoSlot, ErrClosed
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.nfree == 0 {
		return NoSlot, fmt.Errorf("%w: all %d slots allocated", ErrFull, len(s.slots))
	}
	for range s.free {
		fi := s.nextFile
		s.nextFile = (s.nextFile + 1) % len(s.free)
		st := s.free[fi]
		if len(st) == 0 {
			continue
		}
		idx := st[len(st)-1]
		s.free[fi] = st[:len(st)-1]
		s.nfree--
		slot := Slot(fi*s.geom.slotsPerFile + int(idx))
		si := &s.slots[slot]
		if !(si.state == stFree && si.busy == 0) {
			invariants.Failf("slot %d on the free list is in state %d busy %d", slot, si.state, si.busy)
		}
		*si = slotInfo{state: stEmpty}
		s.checkLocked()
		return slot, nil
	}
	invariants.Failf("nfree = %d but every free list is empty", s.nfree)
	return NoSlot, nil
}

// Free returns an allocated slot to the free list and forgets its block. It
// fails with ErrBusy while an I/O on the slot is in flight, and with
// ErrInvalid for a slot that is not allocated; in both cases nothing changes.
// The bytes on disk are left as they are (see the package comment).
func (s *Store) Free(slot Slot) error {
	s.ops.RLock()
	defer s.ops.RUnlock()
	if s.closed {
		return ErrClosed
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	si, err := s.slotLocked(slot)
	if err != nil {
		return err
	}
	if si.busy != 0 {
		return fmt.Errorf("%w: free of slot %d with an I/O in flight", ErrBusy, slot)
	}
	s.forgetLocked(slot, si)
	si.state = stFree
	fi, idx := s.geom.split(slot)
	s.free[fi] = append(s.free[fi], uint32(idx))
	s.nfree++
	s.checkLocked()
	return nil
}

// slotLocked checks that slot exists and is allocated.
func (s *Store) slotLocked(slot Slot) (*slotInfo, error) {
	if int64(slot) >= int64(len(s.slots)) {
		return nil, fmt.Errorf("%w: slot %d out of range [0, %d)", ErrInvalid, slot, len(s.slots))
	}
	si := &s.slots[slot]
	if si.state == stFree {
		return nil, fmt.Errorf("%w: slot %d is not allocated", ErrInvalid, slot)
	}
	return si, nil
}

// forgetLocked makes slot hold nothing readable.
func (s *Store) forgetLocked(slot Slot, si *slotInfo) {
	if si.state == stReadable {
		if t, ok := s.index[si.key]; ok && t == slot {
			delete(s.index, si.key)
		}
	}
	si.state = stEmpty
}

// Lookup returns the slot that holds key, if any.
func (s *Store) Lookup(key uint64) (Slot, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	slot, ok := s.index[key]
	return slot, ok
}

// Len returns the number of readable blocks.
func (s *Store) Len() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.index)
}

// Range calls fn for each readable block, in slot order, until fn returns
// false. It works on a snapshot taken first, so fn may call the Store; the
// Tokens slice passed to fn is fn's to keep. After Open it lists what
// survived the restart, of every codec (BlockMeta.Codec): those slots are
// allocated, and the caller MUST Free the ones it does not adopt, among
// them those of a codec it does not decode.
func (s *Store) Range(fn func(Slot, BlockMeta) bool) {
	type entry struct {
		slot Slot
		meta BlockMeta
	}
	var snap []entry
	s.mu.Lock()
	for i := range s.slots {
		si := &s.slots[i]
		if si.state != stReadable {
			continue
		}
		base := i * s.cfg.MaxTokens
		snap = append(snap, entry{Slot(i), BlockMeta{Key: si.key, Parent: si.parent, Salt: si.salt, Position: si.position,
			Tokens:       append([]uint32(nil), s.tokens[base:base+int(si.ntok)]...),
			PayloadBytes: int(si.payloadLen), Codec: si.codec}})
	}
	s.mu.Unlock()
	for _, e := range snap {
		if !fn(e.slot, e.meta) {
			return
		}
	}
}

// Close waits for the I/O in flight, stops the workers and closes the files.
// The caller's buffers are no longer used once Close returns.
func (s *Store) Close() error {
	s.ops.Lock()
	defer s.ops.Unlock()
	if s.closed {
		return ErrClosed
	}
	s.closed = true
	s.pool.stop()
	var errs []error
	for _, f := range s.files {
		if err := f.f.Close(); err != nil {
			errs = append(errs, fmt.Errorf("nvme: close %s: %w", f.path, err))
		}
	}
	// The lock goes last: the next Store finds the files closed.
	errs = append(errs, closeDirs(s.dirs))
	return errors.Join(errs...)
}

// checkAligned reports ErrMisaligned for a buffer that direct I/O cannot use.
func (s *Store) checkAligned(slot Slot, what string, b []byte) error {
	if !s.direct || len(b) == 0 {
		return nil
	}
	if p := uintptr(unsafe.Pointer(unsafe.SliceData(b))); p%uintptr(s.geom.alignBytes) != 0 {
		return fmt.Errorf("%w: slot %d %s at %#x, want a multiple of %d (use page-aligned pinned memory)", ErrMisaligned, slot, what, p, s.geom.alignBytes)
	}
	return nil
}

// begin takes the operation lock; the caller MUST call s.ops.RUnlock.
func (s *Store) begin(ctx context.Context) error {
	s.ops.RLock()
	if s.closed {
		return ErrClosed
	}
	return ctx.Err()
}
