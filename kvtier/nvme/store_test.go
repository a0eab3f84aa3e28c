package nvme

import (
	"context"
	"errors"
	"os"
	"strings"
	"sync"
	"testing"

	"kvtier.dev/internal/invariants"
)

func TestConfigErrorsNameTheField(t *testing.T) {
	dir := t.TempDir()
	file := dir + "/plain"
	if err := os.WriteFile(file, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	good := testConfig(dir)
	for _, tc := range []struct {
		field string
		edit  func(c *Config)
	}{
		{"Dirs", func(c *Config) { c.Dirs = nil }},
		{"Dirs", func(c *Config) { c.Dirs = []string{""} }},
		{"Dirs", func(c *Config) { c.Dirs = []string{dir, dir} }},
		{"Dirs[0]", func(c *Config) { c.Dirs = []string{dir + "/missing/sub"} }},
		{"Dirs[0]", func(c *Config) { c.Dirs = []string{file} }},
		{"FilesPerDir", func(c *Config) { c.FilesPerDir = -1 }},
		{"FilesPerDir", func(c *Config) { c.FilesPerDir = 1025 }},
		{"SlotsPerFile", func(c *Config) { c.SlotsPerFile = 0 }},
		{"SlotsPerFile", func(c *Config) { c.SlotsPerFile = 1 << 30; c.FilesPerDir = 8 }},
		{"BlockBytes", func(c *Config) { c.BlockBytes = 0 }},
		{"BlockBytes", func(c *Config) { c.BlockBytes = 2 << 30 }},
		{"MaxTokens", func(c *Config) { c.MaxTokens = -1 }},
		{"MaxTokens", func(c *Config) { c.MaxTokens = maxTokensLimit + 1 }},
		{"Mode", func(c *Config) { c.Mode = NumIOModes }},
		{"Workers", func(c *Config) { c.Workers = -3 }},
		{"Workers", func(c *Config) { c.Workers = 4097 }},
		{"MaxIOBytes", func(c *Config) { c.MaxIOBytes = -1 }},
	} {
		c := good
		tc.edit(&c)
		_, err := Open(c)
		if !errors.Is(err, ErrConfig) || !strings.Contains(err.Error(), "Config."+tc.field) {
			t.Errorf("%s: err = %v, want ErrConfig naming Config.%s", tc.field, err, tc.field)
		}
	}
	if entries, _ := os.ReadDir(dir); len(entries) != 1 {
		t.Fatalf("a rejected config created files: %v", entries)
	}
}

func TestWriteReadRoundTrip(t *testing.T) {
	s := mustOpen(t, testConfig(t.TempDir()))
	info := s.Info()
	t.Logf("mode %v, alignment %d bytes from %s, header %d, slot %d", info.Mode, info.AlignBytes, info.AlignSource, info.HeaderBytes, info.SlotBytes)
	if info.AlignBytes < 512 || info.SlotBytes%int64(info.AlignBytes) != 0 || info.SlotBytes%4096 != 0 {
		t.Fatalf("bad layout %+v", info)
	}
	fi, err := os.Stat(info.Files[0])
	if err != nil {
		t.Fatal(err)
	}
	if fi.Mode().Perm() != 0o600 || fi.Size() != info.FirstSlotOffset+16*info.SlotBytes {
		t.Fatalf("slab file mode %v size %d, want 0600 and %d", fi.Mode().Perm(), fi.Size(), info.FirstSlotOffset+16*info.SlotBytes)
	}
	sizes := []int{8192, 1, 511, 512, 4097, 8191}
	var slots []Slot
	for i, n := range sizes {
		slots = append(slots, writeKey(t, s, uint64(100+i), n))
	}
	for i, n := range sizes {
		checkBlock(t, s, slots[i], uint64(100+i), n)
		// A destination of exactly the payload's length: in direct mode an
		// unaligned tail comes through the bounce buffer.
		dst := alignedBuf(t, 8192)[:n]
		want := make([]byte, n)
		fillPayload(want, uint64(100+i))
		if m, err := s.Read(context.Background(), slots[i], dst); err != nil || m.PayloadBytes != n || string(dst) != string(want) {
			t.Fatalf("exact-size read of %d bytes: %v", n, err)
		}
	}
	dst := alignedBuf(t, 8192)
	slot, m, err := s.ReadKey(context.Background(), 103, dst)
	if err != nil || slot != slots[3] || m.Key != 103 {
		t.Fatalf("ReadKey = %d, %+v, %v", slot, m, err)
	}
	if _, _, err := s.ReadKey(context.Background(), 999, dst); !errors.Is(err, ErrNotFound) {
		t.Fatalf("ReadKey of an absent key: %v", err)
	}
	st := s.Stats()
	if st.Writes != 6 || st.Reads != 13 || st.CorruptDrops != 0 {
		t.Fatalf("stats %+v", st)
	}
	// Overwrite a slot with another key: the old key is gone.
	buf := alignedBuf(t, 8192)
	fillPayload(buf, 555)
	if err := s.Write(context.Background(), slots[0], metaFor(555, 4), buf); err != nil {
		t.Fatal(err)
	}
	if _, ok := s.Lookup(100); ok {
		t.Fatal("overwritten key 100 still indexed")
	}
	checkBlock(t, s, slots[0], 555, 8192)
}

func TestBadInputChangesNothing(t *testing.T) {
	s := mustOpen(t, testConfig(t.TempDir()))
	ctx := context.Background()
	a := writeKey(t, s, 1, 8192)
	b, _ := s.Allocate()
	buf := alignedBuf(t, 3*8192)
	fillPayload(buf, 2)
	for _, tc := range []struct {
		name string
		err  error
		call func() error
	}{
		{"slot out of range", ErrInvalid, func() error { return s.Write(ctx, 1000, metaFor(2, 1), buf[:10]) }},
		{"slot not allocated", ErrInvalid, func() error { return s.Write(ctx, 5, metaFor(2, 1), buf[:10]) }},
		{"payload too big", ErrInvalid, func() error { return s.Write(ctx, a, metaFor(2, 1), buf[:8193]) }},
		{"empty payload", ErrInvalid, func() error { return s.Write(ctx, a, metaFor(2, 1), nil) }},
		{"too many tokens", ErrInvalid, func() error { return s.Write(ctx, a, metaFor(2, 17), buf[:10]) }},
		{"key in another slot", ErrKeyExists, func() error { return s.Write(ctx, b, metaFor(1, 1), buf[:10]) }},
		{"dst too small", ErrInvalid, func() error { _, err := s.Read(ctx, a, buf[:8191]); return err }},
		{"read of unwritten slot", ErrNotFound, func() error { _, err := s.Read(ctx, b, buf); return err }},
		{"free of free slot", ErrInvalid, func() error { return s.Free(7) }},
		{"free out of range", ErrInvalid, func() error { return s.Free(NoSlot) }},
	} {
		if err := tc.call(); !errors.Is(err, tc.err) {
			t.Errorf("%s: err = %v, want %v", tc.name, err, tc.err)
		}
	}
	if s.Info().Mode == ModeDirect {
		if err := s.Write(ctx, a, metaFor(2, 1), buf[1:100]); !errors.Is(err, ErrMisaligned) {
			t.Errorf("misaligned payload: %v", err)
		}
		if _, err := s.Read(ctx, a, buf[1:]); !errors.Is(err, ErrMisaligned) {
			t.Errorf("misaligned dst: %v", err)
		}
	}
	checkBlock(t, s, a, 1, 8192)
	if st := s.Stats(); st.Writes != 1 || st.CorruptDrops != 0 {
		t.Fatalf("rejected calls changed stats: %+v", st)
	}
}

func TestAllocateFreeFull(t *testing.T) {
	cfg := testConfig(t.TempDir())
	cfg.Dirs = append(cfg.Dirs, t.TempDir())
	cfg.FilesPerDir = 2
	s := mustOpen(t, cfg)
	seen := map[Slot]bool{}
	files := map[int]int{}
	for range 64 {
		slot, err := s.Allocate()
		if err != nil {
			t.Fatal(err)
		}
		if seen[slot] {
			t.Fatalf("slot %d allocated twice", slot)
		}
		seen[slot] = true
		f, _ := s.geom.split(slot)
		files[f]++
	}
	if len(files) != 4 || files[0] != 16 {
		t.Fatalf("allocation over files %v, want 16 in each of 4", files)
	}
	if _, err := s.Allocate(); !errors.Is(err, ErrFull) {
		t.Fatalf("65th Allocate: %v", err)
	}
	if err := s.Free(3); err != nil {
		t.Fatal(err)
	}
	if slot, err := s.Allocate(); err != nil || slot != 3 {
		t.Fatalf("Allocate after Free = %d, %v", slot, err)
	}
}

func TestBatchUsesVectoredIO(t *testing.T) {
	t.Run("fast", func(t *testing.T) { testBatch(t, false) })
	t.Run("durable", func(t *testing.T) { testBatch(t, true) })
}

func testBatch(t *testing.T, durable bool) {
	cfg := testConfig(t.TempDir())
	cfg.SlotsPerFile = 64
	cfg.Durable = durable
	s := mustOpen(t, cfg)
	ctx := context.Background()
	const n = 32
	mem := alignedBuf(t, n*s.geom.payloadRegion)
	var ws []WriteOp
	for i := range n {
		slot, _ := s.Allocate()
		p := mem[i*s.geom.payloadRegion:][:8192]
		fillPayload(p, uint64(i))
		ws = append(ws, WriteOp{Slot: slot, Meta: metaFor(uint64(i), 4), Payload: p})
	}
	// Reverse the order: the batch sorts runs itself.
	for i, j := 0, len(ws)-1; i < j; i, j = i+1, j-1 {
		ws[i], ws[j] = ws[j], ws[i]
	}
	before := s.Stats().Syscalls
	if err := s.WriteBatch(ctx, ws); err != nil {
		t.Fatal(err)
	}
	for _, w := range ws {
		if w.Err != nil {
			t.Fatal(w.Err)
		}
	}
	// Durable mode adds one header write per block to the merged payloads.
	if calls := s.Stats().Syscalls - before; !durable && calls >= n/4 || durable && calls >= n+n/4 {
		t.Fatalf("%d blocks took %d pwritev calls, want runs merged", n, calls)
	}
	clear(mem)
	var rs []ReadOp
	for i := range n {
		rs = append(rs, ReadOp{Slot: NoSlot, Key: uint64(i), Dst: mem[i*s.geom.payloadRegion:][:s.geom.payloadRegion]})
	}
	before = s.Stats().Syscalls
	if err := s.ReadBatch(ctx, rs); err != nil {
		t.Fatal(err)
	}
	if calls := s.Stats().Syscalls - before; calls >= n/4 {
		t.Fatalf("%d blocks took %d preadv calls", n, calls)
	}
	for i, r := range rs {
		want := make([]byte, 8192)
		fillPayload(want, uint64(i))
		if r.Err != nil || r.Meta.Key != uint64(i) || string(r.Dst[:8192]) != string(want) {
			t.Fatalf("op %d: err %v key %d, payload equal %v", i, r.Err, r.Meta.Key, string(r.Dst[:8192]) == string(want))
		}
	}
}

func TestBufferedMode(t *testing.T) {
	cfg := testConfig(t.TempDir())
	cfg.Mode = ModeBuffered
	s := mustOpen(t, cfg)
	if s.Info().Mode != ModeBuffered {
		t.Fatalf("mode %v", s.Info().Mode)
	}
	slot, _ := s.Allocate()
	buf := make([]byte, 3001) // ordinary Go memory, unaligned length
	fillPayload(buf[1:], 9)
	if err := s.Write(context.Background(), slot, metaFor(9, 4), buf[1:]); err != nil {
		t.Fatal(err)
	}
	dst := make([]byte, 3001)
	if m, err := s.Read(context.Background(), slot, dst[1:]); err != nil || m.Key != 9 || string(dst[1:]) != string(buf[1:]) {
		t.Fatalf("read back: %+v %v", m, err)
	}
	// A batch of adjacent full-size blocks, read with readahead hints.
	var rs []ReadOp
	for k := uint64(20); k < 24; k++ {
		writeKey(t, s, k, 8192)
		rs = append(rs, ReadOp{Slot: NoSlot, Key: k, Dst: make([]byte, 8192)})
	}
	if err := s.ReadBatch(context.Background(), rs); err != nil {
		t.Fatal(err)
	}
	for _, r := range rs {
		want := make([]byte, 8192)
		fillPayload(want, r.Key)
		if r.Err != nil || string(r.Dst) != string(want) {
			t.Fatalf("key %d: %v", r.Key, r.Err)
		}
	}
}

func TestInvariantCheckCatchesDamage(t *testing.T) {
	if !invariants.Enabled {
		t.Skip("needs -tags invariants")
	}
	s := mustOpen(t, testConfig(t.TempDir()))
	s.mu.Lock()
	s.nfree++ // a slot that does not exist on any free list
	s.mu.Unlock()
	defer func() {
		if recover() == nil {
			t.Fatal("a broken free count went unnoticed")
		}
		s.mu.Lock()
		s.nfree--
		s.mu.Unlock()
	}()
	_, _ = s.Allocate()
}

func TestDirectProbeFallsBack(t *testing.T) {
	// A file system that refuses O_DIRECT fails the first aligned I/O with
	// EINVAL (tmpfs on kernels before 6.6 refuses it already at open).
	cfg, _ := withFaults(testConfig(t.TempDir()))
	first := true
	wrap := cfg.WrapFile
	cfg.WrapFile = func(path string, f File) File {
		ff := wrap(path, f).(*faultFile)
		if first {
			ff.readErr, ff.readN, first = einval, 1, false
		}
		return ff
	}
	// Make the file exist and hold a superblock, so that Open reads it.
	mustClose(t, mustOpenNoCleanup(t, testConfig(cfg.Dirs[0])))
	s := mustOpen(t, cfg)
	if s.Info().Mode != ModeBuffered {
		t.Fatalf("mode %v after EINVAL from O_DIRECT, want buffered", s.Info().Mode)
	}
	writeKey(t, s, 1, 100)
	checkBlock(t, s, 0, 1, 100)

	mustClose(t, s)
	cfg.Mode, first = ModeDirect, true
	if _, err := Open(cfg); !errors.Is(err, einval) {
		t.Fatalf("ModeDirect on a refusing file system: %v", err)
	}
}

func TestBusySlotIsNeverReused(t *testing.T) {
	cfg, files := withFaults(testConfig(t.TempDir()))
	s := mustOpen(t, cfg)
	a := writeKey(t, s, 1, 8192)
	ff := (*files)[0]
	block, entered := make(chan struct{}), make(chan struct{})
	ff.set(func(f *faultFile) { f.block, f.entered = block, entered })
	buf := alignedBuf(t, 8192)
	fillPayload(buf, 2)
	done := make(chan error)
	go func() { done <- s.Write(context.Background(), a, metaFor(2, 4), buf) }()
	<-entered
	ff.set(func(f *faultFile) { f.block = nil })
	if err := s.Free(a); !errors.Is(err, ErrBusy) {
		t.Errorf("Free during write: %v", err)
	}
	if err := s.Write(context.Background(), a, metaFor(3, 4), buf); !errors.Is(err, ErrBusy) {
		t.Errorf("Write during write: %v", err)
	}
	if _, err := s.Read(context.Background(), a, alignedBuf(t, 8192)); !errors.Is(err, ErrNotFound) {
		t.Errorf("Read during write: %v, want a miss", err)
	}
	close(block)
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	checkBlock(t, s, a, 2, 8192)
	if err := s.Free(a); err != nil {
		t.Fatal(err)
	}
}

func TestConcurrentUse(t *testing.T) {
	cfg := testConfig(t.TempDir())
	cfg.SlotsPerFile = 64
	s := mustOpen(t, cfg)
	var wg sync.WaitGroup
	for g := range 8 {
		wg.Go(func() {
			buf := alignedBuf(t, 8192)
			dst := alignedBuf(t, 8192)
			for i := range 20 {
				key := uint64(g*1000 + i)
				slot, err := s.Allocate()
				if err != nil {
					t.Error(err)
					return
				}
				fillPayload(buf, key)
				if err := s.Write(context.Background(), slot, metaFor(key, 2), buf); err != nil {
					t.Error(err)
					return
				}
				if m, err := s.Read(context.Background(), slot, dst); err != nil || m.Key != key || string(dst) != string(buf) {
					t.Errorf("key %d: %v", key, err)
					return
				}
				if err := s.Free(slot); err != nil {
					t.Error(err)
					return
				}
			}
		})
	}
	wg.Wait()
	if st := s.Stats(); st.Writes != 160 || st.Reads != 160 {
		t.Fatalf("stats %+v", st)
	}
}

func TestClosedStore(t *testing.T) {
	s, err := Open(testConfig(t.TempDir()))
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Allocate(); !errors.Is(err, ErrClosed) {
		t.Fatal(err)
	}
	if err := s.Write(context.Background(), 0, metaFor(1, 1), make([]byte, 10)); !errors.Is(err, ErrClosed) {
		t.Fatal(err)
	}
	if err := s.Close(); !errors.Is(err, ErrClosed) {
		t.Fatal(err)
	}
}

func TestCancelledContext(t *testing.T) {
	s := mustOpen(t, testConfig(t.TempDir()))
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if err := s.Write(ctx, 0, metaFor(1, 1), make([]byte, 10)); !errors.Is(err, context.Canceled) {
		t.Fatal(err)
	}
}

func mustOpenNoCleanup(t testing.TB, cfg Config) *Store {
	t.Helper()
	s, err := Open(cfg)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

func mustClose(t testing.TB, s *Store) {
	t.Helper()
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
}

func TestWriteDoesNotKeepCallerTokens(t *testing.T) {
	cfg := testConfig(t.TempDir())
	cfg.Workers = 1 // the same worker writes, then decodes another header
	s := mustOpen(t, cfg)
	other := writeKey(t, s, 7, 100)
	slot, _ := s.Allocate()
	meta := metaFor(8, 4)
	keep := append([]uint32(nil), meta.Tokens...)
	buf := alignedBuf(t, 4096)
	if err := s.Write(context.Background(), slot, meta, buf[:100]); err != nil {
		t.Fatal(err)
	}
	checkBlock(t, s, other, 7, 100)
	for i := range keep {
		if meta.Tokens[i] != keep[i] {
			t.Fatalf("the caller's Tokens changed after Write: %v, was %v", meta.Tokens, keep)
		}
	}
}

// TestWriteAndReadAllocateNothing holds Write and ReadBatch to their doc
// comments, durable or not, keyed or not: the same slot rewritten and read
// back, after warm-up, costs no Go allocation.
func TestWriteAndReadAllocateNothing(t *testing.T) {
	if raceEnabled {
		t.Skip("allocation counts are not meaningful under the race detector")
	}
	for _, tc := range []struct{ durable, keyed bool }{{false, false}, {true, false}, {false, true}} {
		durable := tc.durable
		cfg := testConfig(t.TempDir())
		cfg.Durable = durable
		if tc.keyed {
			cfg.ChecksumKey = []byte("a key of sixteen bytes or more")
		}
		s := mustOpen(t, cfg)
		slot, err := s.Allocate()
		if err != nil {
			t.Fatal(err)
		}
		buf := alignedBuf(t, 8192)
		fillPayload(buf, 42)
		meta := metaFor(42, 4)
		write := func() {
			if err := s.Write(context.Background(), slot, meta, buf); err != nil {
				t.Fatal(err)
			}
		}
		write()
		if n := testing.AllocsPerRun(20, write); n != 0 {
			t.Errorf("durable=%v keyed=%v: %v allocations per Write", durable, tc.keyed, n)
		}
		ops := []ReadOp{{Slot: slot, Dst: alignedBuf(t, 8192), Meta: BlockMeta{Tokens: make([]uint32, 0, 16)}}}
		read := func() {
			if err := s.ReadBatch(context.Background(), ops); err != nil || ops[0].Err != nil {
				t.Fatal(err, ops[0].Err)
			}
		}
		read()
		if n := testing.AllocsPerRun(20, read); n != 0 {
			t.Errorf("durable=%v keyed=%v: %v allocations per ReadBatch of one block", durable, tc.keyed, n)
		}
	}
}
