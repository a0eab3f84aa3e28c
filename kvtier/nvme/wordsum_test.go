package nvme

import (
	"context"
	"errors"
	"path/filepath"
	"testing"

	sumpkg "kvtier.dev/internal/checksum"
)

// writeWordSummed allocates a slot and writes key's block into it with
// its word sum given, as a caller that summed it on the GPU does.
func writeWordSummed(t *testing.T, s *Store, key uint64, n int) Slot {
	t.Helper()
	slot, err := s.Allocate()
	if err != nil {
		t.Fatal(err)
	}
	writeWordSummedAt(t, s, slot, key, n)
	return slot
}

// writeWordSummedAt is writeWordSummed into a slot already allocated.
func writeWordSummedAt(t *testing.T, s *Store, slot Slot, key uint64, n int) {
	t.Helper()
	buf := alignedBuf(t, max(n, 4096))[:n]
	fillPayload(buf, key)
	ops := []WriteOp{{Slot: slot, Meta: metaFor(key, 4), Payload: buf, WordSummed: true, WordSum: sumpkg.WordSum(buf)}}
	if err := s.WriteBatch(context.Background(), ops); err != nil || ops[0].Err != nil {
		t.Fatalf("write key %d: %v %v", key, err, ops[0].Err)
	}
}

// TestWordSummedBlocks: a block written with the caller's word sum reads
// back verified by the store (CPU) without DeferWordSum, and with it the
// store leaves the check to the caller and returns the sum; blocks written
// without a word sum are checked in full either way; both survive a
// restart.
func TestWordSummedBlocks(t *testing.T) {
	dir := t.TempDir()
	cfg := testConfig(dir)
	s := mustOpenNoCleanup(t, cfg)
	ws := writeWordSummed(t, s, 1, 8192)
	plain := writeKey(t, s, 2, 8000)
	checkBlock(t, s, ws, 1, 8192)
	checkBlock(t, s, plain, 2, 8000)
	read := func(s *Store, slot Slot) ReadOp {
		ops := []ReadOp{{Slot: slot, Dst: alignedBuf(t, 8192), DeferWordSum: true}}
		if err := s.ReadBatch(context.Background(), ops); err != nil || ops[0].Err != nil {
			t.Fatalf("read slot %d: %v %v", slot, err, ops[0].Err)
		}
		return ops[0]
	}
	r := read(s, ws)
	if !r.Deferred || r.Check.WordSum != sumpkg.WordSum(r.Dst[:8192]) || r.Meta.Key != 1 {
		t.Fatalf("deferred read: deferred %v sum %#x (payload's %#x) key %d", r.Deferred, r.Check.WordSum, sumpkg.WordSum(r.Dst[:8192]), r.Meta.Key)
	}
	if r := read(s, plain); r.Deferred {
		t.Fatal("a block without a word sum had its check deferred")
	}
	if st := s.Stats(); st.DeferredChecks != 1 {
		t.Fatalf("DeferredChecks %d, want 1", st.DeferredChecks)
	}
	mustClose(t, s)
	s = mustOpenNoCleanup(t, cfg)
	defer mustClose(t, s)
	checkBlock(t, s, ws, 1, 8192)
	if r := read(s, ws); !r.Deferred {
		t.Fatal("after a restart, the word-summed block's check was not deferred")
	}
}

// TestWordSumFlipThenReport: a flipped payload bit in a word-summed block
// is found by the store's own check, and, where the check was deferred,
// reported by the caller: either way the slot is dropped, its header
// cleared on disk, and no restart adopts it. A report of a slot written
// again since is ignored.
func TestWordSumFlipThenReport(t *testing.T) {
	dir := t.TempDir()
	cfg := testConfig(dir)
	s := mustOpenNoCleanup(t, cfg)
	a := writeWordSummed(t, s, 1, 8192)
	b := writeWordSummed(t, s, 2, 8192)
	mustClose(t, s)
	g := newGeometry(&cfg, 512)
	for _, slot := range []Slot{a, b} {
		patchFile(t, filepath.Join(dir, "kvtier-slab-000.kvs"), g.slotOffset(int(slot))+int64(g.hdrBytes), func(p []byte) { p[100] ^= 2 })
	}
	s = mustOpenNoCleanup(t, cfg)
	_, err := s.Read(context.Background(), a, alignedBuf(t, 8192))
	mustMiss(t, err, ErrCorrupt)
	ops := []ReadOp{{Slot: b, Dst: alignedBuf(t, 8192), DeferWordSum: true}}
	if err := s.ReadBatch(context.Background(), ops); err != nil || ops[0].Err != nil || !ops[0].Deferred {
		t.Fatalf("deferred read: %v %v deferred %v", err, ops[0].Err, ops[0].Deferred)
	}
	if sumpkg.WordSum(ops[0].Dst[:8192]) == ops[0].Check.WordSum {
		t.Fatal("the flipped bit left the word sum")
	}
	if err := s.ReportCorrupt(ops[0].Check); err != nil {
		t.Fatal(err)
	}
	if err := s.ReportCorrupt(ops[0].Check); err != nil { // again: the slot is already gone
		t.Fatal(err)
	}
	if st := s.Stats(); st.SlotsInvalidated != 2 || st.ReportedCorrupt != 1 || st.CorruptDrops != 2 {
		t.Fatalf("stats %+v, want 2 invalidated, 1 reported, 2 corrupt", st)
	}
	if _, ok := s.Lookup(2); ok {
		t.Fatal("the reported block is still in the index")
	}
	// A check of a block since overwritten changes nothing.
	c := writeWordSummed(t, s, 3, 8192)
	ops = []ReadOp{{Slot: c, Dst: alignedBuf(t, 8192), DeferWordSum: true}}
	if err := s.ReadBatch(context.Background(), ops); err != nil || ops[0].Err != nil {
		t.Fatal(err, ops[0].Err)
	}
	old := ops[0].Check
	if err := s.Free(c); err != nil {
		t.Fatal(err)
	}
	c2, _ := s.Allocate()
	writeWordSummedAt(t, s, c2, 4, 8192)
	if err := s.ReportCorrupt(old); err != nil {
		t.Fatal(err)
	}
	if c2 == c {
		checkBlock(t, s, c2, 4, 8192)
	}
	if err := s.ReportCorrupt(PayloadCheck{}); !errors.Is(err, ErrInvalid) {
		t.Fatalf("a check no read returned: %v, want ErrInvalid", err)
	}
	mustClose(t, s)
	for restart := range 3 {
		s := mustOpenNoCleanup(t, cfg)
		if _, ok := s.Lookup(1); ok {
			t.Fatalf("restart %d adopted the corrupt block 1", restart+1)
		}
		if _, ok := s.Lookup(2); ok {
			t.Fatalf("restart %d adopted the reported block 2", restart+1)
		}
		if st := s.Stats(); st.CorruptDrops != 0 {
			t.Fatalf("restart %d found %d corrupt slots", restart+1, st.CorruptDrops)
		}
		mustClose(t, s)
	}
}

// TestWordSumOnAKeyedStore: a keyed store refuses a caller's word sum and
// changes nothing; a header flagged both keyed and word-summed is corrupt.
func TestWordSumOnAKeyedStore(t *testing.T) {
	cfg := testConfig(t.TempDir())
	cfg.ChecksumKey = []byte("0123456789abcdef")
	s := mustOpen(t, cfg)
	slot, _ := s.Allocate()
	buf := alignedBuf(t, 8192)
	ops := []WriteOp{{Slot: slot, Meta: metaFor(1, 4), Payload: buf, WordSummed: true, WordSum: sumpkg.WordSum(buf)}}
	if err := s.WriteBatch(context.Background(), ops); err != nil || !errors.Is(ops[0].Err, ErrInvalid) {
		t.Fatalf("word sum on a keyed store: %v %v, want ErrInvalid", err, ops[0].Err)
	}
	if _, ok := s.Lookup(1); ok {
		t.Fatal("the refused write left a block")
	}
	var h header
	hb := make([]byte, 512)
	cs := newChecksum(dirSumsKey(t, cfg.Dirs[0]), cfg.ChecksumKey)
	encodeHeader(hb, &header{version: formatVersion, wordSum: true, payloadLen: 1}, cs)
	if err := decodeHeader(hb, &h, 16, cs); !errors.Is(err, ErrCorrupt) {
		t.Fatalf("keyed and word-summed header: %v, want ErrCorrupt", err)
	}
}
