package nvme

import (
	"bytes"
	"context"
	"errors"
	"os"
	"slices"
	"strings"
	"sync"
	"testing"
)

// fillStore writes keys 1..n into a fresh store in dir and closes it. It
// returns the slot of each key.
func fillStore(t *testing.T, cfg Config, n int) map[uint64]Slot {
	t.Helper()
	s := mustOpenNoCleanup(t, cfg)
	slots := map[uint64]Slot{}
	for k := uint64(1); k <= uint64(n); k++ {
		slots[k] = writeKey(t, s, k, 8192)
	}
	mustClose(t, s)
	return slots
}

func rangeKeys(s *Store) map[uint64]Slot {
	got := map[uint64]Slot{}
	s.Range(func(slot Slot, m BlockMeta) bool { got[m.Key] = slot; return true })
	return got
}

func TestReopenKeepsTheWarmTier(t *testing.T) {
	cfg := testConfig(t.TempDir())
	cfg.Dirs = append(cfg.Dirs, t.TempDir())
	cfg.SlotsPerFile = 300 // more than one scan chunk per file
	slots := fillStore(t, cfg, 40)
	var mu sync.Mutex
	var last RecoverProgress
	calls := 0
	cfg.Progress = func(p RecoverProgress) {
		mu.Lock()
		defer mu.Unlock()
		calls++
		if p.SlotsScanned < last.SlotsScanned {
			t.Errorf("progress went back: %+v after %+v", p, last)
		}
		last = p
	}
	s := mustOpen(t, cfg)
	if last.SlotsScanned != 600 || last.SlotsTotal != 600 || last.Recovered != 40 || calls < 3 {
		t.Fatalf("last progress %+v after %d calls", last, calls)
	}
	got := rangeKeys(s)
	if len(got) != 40 || s.Stats().Recovered != 40 || s.Len() != 40 {
		t.Fatalf("recovered %d blocks, stats %+v", len(got), s.Stats())
	}
	for k, slot := range slots {
		if got[k] != slot {
			t.Fatalf("key %d in slot %d, was written to %d", k, got[k], slot)
		}
		checkBlock(t, s, slot, k, 8192)
	}
	s.Range(func(slot Slot, m BlockMeta) bool {
		if wm := metaFor(m.Key, 4); m.Parent != wm.Parent || m.Salt != wm.Salt || m.Position != wm.Position || !slices.Equal(m.Tokens, wm.Tokens) {
			t.Errorf("Range: slot %d: meta %+v, want %+v", slot, m, wm)
		}
		return true
	})
	// The recovered slots are allocated: new allocations avoid them, and
	// sequence numbers continue so that the newest copy of a key wins.
	fresh, err := s.Allocate()
	if err != nil {
		t.Fatal(err)
	}
	for _, slot := range slots {
		if slot == fresh {
			t.Fatalf("Allocate returned recovered slot %d", fresh)
		}
	}
	if err := s.Free(slots[1]); err != nil {
		t.Fatal(err)
	}
	buf := alignedBuf(t, 8192)
	fillPayload(buf, 1)
	if err := s.Write(context.Background(), fresh, metaFor(1, 4), buf); err != nil {
		t.Fatal(err)
	}
	mustClose(t, s)
	cfg.Progress = nil
	s2 := mustOpen(t, cfg)
	if got := rangeKeys(s2); got[1] != fresh || len(got) != 40 {
		t.Fatalf("after rewrite of key 1 into slot %d: key 1 in slot %d, %d keys", fresh, got[1], len(got))
	}
	if st := s2.Stats(); st.DuplicateDrops != 1 {
		t.Fatalf("stats %+v, want one duplicate dropped", st)
	}
}

func TestReopenDropsDamagedSlots(t *testing.T) {
	dir := t.TempDir()
	cfg := testConfig(dir)
	slots := fillStore(t, cfg, 8)
	g := newGeometry(&cfg, 512)
	path := dir + "/kvtier-slab-000.kvs"
	// Key 2: a flipped header byte. Key 3: a flipped payload byte (caught
	// only with VerifyPayloadOnOpen, else at Read). Key 4: a header of an
	// older format version, with a valid checksum.
	patchFile(t, path, g.slotOffset(int(slots[2])), func(b []byte) { b[40] ^= 1 })
	patchFile(t, path, g.slotOffset(int(slots[3]))+int64(g.hdrBytes)+512, func(b []byte) { b[7] ^= 0x80 })
	patchFile(t, path, g.slotOffset(int(slots[4])), func(b []byte) {
		b[16] = 0 // version 0
		n := headerBytes(int(b[20]))
		sum := dirSums(t, dir).header(b[16:n])
		for i := range 8 {
			b[8+i] = byte(sum >> (8 * i))
		}
	})
	// Key 5: a zeroed header (a slot invalidated before a crash).
	patchFile(t, path, g.slotOffset(int(slots[5])), func(b []byte) { clear(b) })

	s := mustOpen(t, cfg)
	st := s.Stats()
	if st.Recovered != 5 || st.CorruptDrops != 1 || st.VersionDrops != 1 {
		t.Fatalf("stats %+v, want 5 recovered, 1 corrupt, 1 old version", st)
	}
	_, err := s.Read(context.Background(), slots[3], alignedBuf(t, 8192))
	mustMiss(t, err, ErrCorrupt)
	for _, k := range []uint64{1, 6, 7, 8} {
		checkBlock(t, s, slots[k], k, 8192)
	}
	if st := s.Stats(); st.SlotsInvalidated != 2 {
		t.Fatalf("stats %+v, want the corrupt header (Open) and payload (Read) cleared on disk", st)
	}
	mustClose(t, s)

	// Both were cleared: a reopen meets neither. With payload verification
	// it finds a new flip in key 6's payload at once.
	patchFile(t, path, g.slotOffset(int(slots[6]))+int64(g.hdrBytes), func(b []byte) { b[9] ^= 4 })
	cfg.VerifyPayloadOnOpen = true
	s = mustOpen(t, cfg)
	if st := s.Stats(); st.Recovered != 3 || st.CorruptDrops != 1 || st.SlotsInvalidated != 1 {
		t.Fatalf("with payload verification: %+v", st)
	}
	// The dropped slots are free again and usable.
	for range 12 {
		if _, err := s.Allocate(); err != nil {
			t.Fatal(err)
		}
	}
}

func TestReopenTruncatedFile(t *testing.T) {
	dir := t.TempDir()
	cfg := testConfig(dir)
	slots := fillStore(t, cfg, 8)
	g := newGeometry(&cfg, 512)
	// Cut the file in the middle of key 5's payload: keys 6..8 are gone,
	// key 5 keeps its header but not its payload.
	if err := os.Truncate(dir+"/kvtier-slab-000.kvs", g.slotOffset(int(slots[5]))+int64(g.hdrBytes)+4096); err != nil {
		t.Fatal(err)
	}
	s := mustOpen(t, cfg)
	st := s.Stats()
	if st.FilesExtended != 1 || st.Recovered != 5 {
		t.Fatalf("stats %+v", st)
	}
	_, err := s.Read(context.Background(), slots[5], alignedBuf(t, 8192))
	mustMiss(t, err, ErrCorrupt)
	for k := uint64(1); k <= 4; k++ {
		checkBlock(t, s, slots[k], k, 8192)
	}
	if fi, _ := os.Stat(dir + "/kvtier-slab-000.kvs"); fi.Size() != g.fileBytes {
		t.Fatalf("file is %d bytes after reopen, want %d", fi.Size(), g.fileBytes)
	}
	// All 11 slots that hold nothing can be written again.
	for i := range 11 {
		writeKey(t, s, uint64(100+i), 8192)
	}
}

func TestReopenCorruptSuperblock(t *testing.T) {
	dir := t.TempDir()
	cfg := testConfig(dir)
	fillStore(t, cfg, 3)
	path := dir + "/kvtier-slab-000.kvs"
	patchFile(t, path, 0, func(b []byte) { b[30] ^= 1 })
	before, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	// Without Reformat the damaged superblock is an error, and nothing changes.
	if _, err := Open(cfg); !errors.Is(err, ErrConfig) || !strings.Contains(err.Error(), "Reformat") {
		t.Fatalf("Open over a damaged superblock: %v, want ErrConfig naming Reformat", err)
	}
	if after, _ := os.ReadFile(path); !bytes.Equal(before, after) {
		t.Fatal("a refused Open changed the slab file")
	}
	// With it the file is emptied and formatted afresh: its blocks are
	// gone (the superblock named its model, and it no longer does).
	cfg.Reformat = true
	s := mustOpen(t, cfg)
	if st := s.Stats(); st.SuperblocksRewritten != 1 || st.Recovered != 0 {
		t.Fatalf("stats %+v", st)
	}
	if _, ok := s.Lookup(2); ok {
		t.Fatal("a block of the reformatted file survived")
	}
	writeKey(t, s, 9, 8192)
	mustClose(t, s)
	s = mustOpen(t, testConfig(dir))
	if st := s.Stats(); st.SuperblocksRewritten != 0 || st.Recovered != 1 {
		t.Fatalf("reopened after the reformat: %+v", st)
	}
}

func TestReopenWithOtherGeometryChangesNothing(t *testing.T) {
	dir := t.TempDir()
	cfg := testConfig(dir)
	fillStore(t, cfg, 3)
	path := dir + "/kvtier-slab-000.kvs"
	before, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		field string
		edit  func(c *Config)
	}{
		{"BlockBytes", func(c *Config) { c.BlockBytes = 4096 }},
		{"SlotsPerFile", func(c *Config) { c.SlotsPerFile = 32 }},
		{"MaxTokens", func(c *Config) { c.MaxTokens = 8 }},
		{"file count", func(c *Config) { c.FilesPerDir = 2 }},
	} {
		c := cfg
		tc.edit(&c)
		_, err := Open(c)
		if !errors.Is(err, ErrConfig) || !strings.Contains(err.Error(), tc.field) {
			t.Errorf("%s: err = %v, want ErrConfig naming it", tc.field, err)
		}
	}
	after, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(before, after) {
		t.Fatal("a rejected Open changed the slab file")
	}
	if _, err := os.Stat(dir + "/kvtier-slab-001.kvs"); err == nil {
		t.Fatal("the rejected Open with FilesPerDir = 2 left a second slab file")
	}
}
