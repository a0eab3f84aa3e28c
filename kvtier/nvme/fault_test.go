package nvme

import (
	"context"
	"errors"
	"io"
	"os"
	"testing"

	"golang.org/x/sys/unix"
)

// Every fault test ends by checking that the rest of the store still works:
// the untouched block reads back and a new block can be written and read.
func checkStillWorks(t *testing.T, s *Store, kept Slot, keptKey uint64) {
	t.Helper()
	checkBlock(t, s, kept, keptKey, 8192)
	slot := writeKey(t, s, 9999, 5000)
	checkBlock(t, s, slot, 9999, 5000)
}

func TestReadEIO(t *testing.T) {
	cfg, files := withFaults(testConfig(t.TempDir()))
	s := mustOpen(t, cfg)
	a := writeKey(t, s, 1, 8192)
	b := writeKey(t, s, 2, 8192)
	(*files)[0].set(func(f *faultFile) { f.readErr, f.readN = unix.EIO, 1 })
	_, err := s.Read(context.Background(), a, alignedBuf(t, 8192))
	mustMiss(t, err, ErrIO, unix.EIO)
	if st := s.Stats(); st.ReadIOErrors[IOErrEIO] != 1 || st.Reads != 0 {
		t.Fatalf("stats %+v", st)
	}
	if _, ok := s.Lookup(1); ok {
		t.Fatal("a slot that failed with EIO is still indexed")
	}
	checkStillWorks(t, s, b, 2)
}

func TestWriteErrors(t *testing.T) {
	for _, tc := range []struct {
		name  string
		errno unix.Errno
		kind  IOErrorKind
	}{{"EIO", unix.EIO, IOErrEIO}, {"ENOSPC", unix.ENOSPC, IOErrNoSpace}, {"EBADF", unix.EBADF, IOErrOther}} {
		t.Run(tc.name, func(t *testing.T) {
			cfg, files := withFaults(testConfig(t.TempDir()))
			s := mustOpen(t, cfg)
			a := writeKey(t, s, 1, 8192)
			b := writeKey(t, s, 2, 8192)
			(*files)[0].set(func(f *faultFile) { f.writeErr, f.writeN = tc.errno, 1 })
			buf := alignedBuf(t, 8192)
			fillPayload(buf, 3)
			err := s.Write(context.Background(), a, metaFor(3, 4), buf)
			if !errors.Is(err, ErrIO) || !errors.Is(err, tc.errno) {
				t.Fatalf("err = %v", err)
			}
			if st := s.Stats(); st.WriteIOErrors[tc.kind] != 1 || st.Writes != 2 {
				t.Fatalf("stats %+v", st)
			}
			_, err = s.Read(context.Background(), a, buf)
			mustMiss(t, err)
			checkStillWorks(t, s, b, 2)
			// The failed slot is still the caller's and can be written again.
			if err := s.Write(context.Background(), a, metaFor(3, 4), buf); err != nil {
				t.Fatal(err)
			}
		})
	}
}

func TestShortWrites(t *testing.T) {
	t.Run("resumed", func(t *testing.T) {
		cfg, files := withFaults(testConfig(t.TempDir()))
		s := mustOpen(t, cfg)
		(*files)[0].set(func(f *faultFile) { f.shortWrite = 2 })
		a := writeKey(t, s, 1, 8192)
		checkBlock(t, s, a, 1, 8192)
		if st := s.Stats(); st.Syscalls < 3 {
			t.Fatalf("short writes were not resumed: %+v", st)
		}
	})
	t.Run("no progress", func(t *testing.T) {
		cfg, files := withFaults(testConfig(t.TempDir()))
		s := mustOpen(t, cfg)
		b := writeKey(t, s, 2, 8192)
		a, _ := s.Allocate()
		(*files)[0].set(func(f *faultFile) { f.writeErr, f.writeN = nil, 1 })
		buf := alignedBuf(t, 8192)
		fillPayload(buf, 1)
		err := s.Write(context.Background(), a, metaFor(1, 4), buf)
		if !errors.Is(err, ErrIO) || !errors.Is(err, io.ErrShortWrite) {
			t.Fatalf("err = %v", err)
		}
		if st := s.Stats(); st.WriteIOErrors[IOErrShort] != 1 {
			t.Fatalf("stats %+v", st)
		}
		checkStillWorks(t, s, b, 2)
	})
}

func TestFlippedBytesAtRead(t *testing.T) {
	for _, tc := range []struct {
		name string
		off  func(g *geometry) int64
	}{
		{"payload first byte", func(g *geometry) int64 { return int64(g.hdrBytes) }},
		{"payload last byte", func(g *geometry) int64 { return int64(g.hdrBytes) + 8191 }},
		{"header key", func(g *geometry) int64 { return 32 }},
		{"header checksum", func(g *geometry) int64 { return 8 }},
		{"header magic", func(g *geometry) int64 { return 0 }},
		{"header version", func(g *geometry) int64 { return 16 }},
		{"header codec", func(g *geometry) int64 { return 19 }},
		{"header token", func(g *geometry) int64 { return 81 }},
		{"header payload checksum", func(g *geometry) int64 { return 72 }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cfg := testConfig(t.TempDir())
			s := mustOpen(t, cfg)
			a := writeKey(t, s, 1, 8192)
			b := writeKey(t, s, 2, 8192)
			off := s.geom.slotOffset(int(a)) + tc.off(&s.geom)
			patchFile(t, s.info.Files[0], off&^511, func(p []byte) { p[off&511] ^= 0x10 })
			_, err := s.Read(context.Background(), a, alignedBuf(t, 8192))
			mustMiss(t, err, ErrCorrupt)
			if st := s.Stats(); st.CorruptDrops != 1 {
				t.Fatalf("stats %+v", st)
			}
			if _, ok := s.Lookup(1); ok {
				t.Fatal("corrupt slot still indexed")
			}
			checkStillWorks(t, s, b, 2)
		})
	}
}

func TestHeaderOfAnotherSlot(t *testing.T) {
	// A misdirected write: slot a's whole slot image lands in slot b. Both
	// verify by checksum alone; the header's slot number catches it.
	s := mustOpen(t, testConfig(t.TempDir()))
	a := writeKey(t, s, 1, 8192)
	b := writeKey(t, s, 2, 8192)
	f, err := os.OpenFile(s.info.Files[0], os.O_RDWR, 0)
	if err != nil {
		t.Fatal(err)
	}
	img := make([]byte, s.geom.slotBytes)
	if _, err := f.ReadAt(img, s.geom.slotOffset(int(a))); err != nil {
		t.Fatal(err)
	}
	if _, err := f.WriteAt(img, s.geom.slotOffset(int(b))); err != nil {
		t.Fatal(err)
	}
	f.Close()
	_, err = s.Read(context.Background(), b, alignedBuf(t, 8192))
	mustMiss(t, err, ErrCorrupt)
	checkBlock(t, s, a, 1, 8192)
	if st := s.Stats(); st.SlotsInvalidated != 1 {
		t.Fatalf("stats %+v, want the copy's header cleared on disk", st)
	}
	// At reopen the copy is gone (its header was cleared) and the original stays.
	mustClose(t, s)
	s2 := mustOpen(t, testConfig(s.cfg.Dirs[0]))
	if st := s2.Stats(); st.Recovered != 1 || st.CorruptDrops != 0 {
		t.Fatalf("stats after reopen %+v", st)
	}
	checkBlock(t, s2, a, 1, 8192)
}

func TestTruncatedWhileOpen(t *testing.T) {
	s := mustOpen(t, testConfig(t.TempDir()))
	a := writeKey(t, s, 1, 8192)
	b := writeKey(t, s, 2, 8192)
	// Cut the file in the middle of slot b's payload.
	if err := os.Truncate(s.info.Files[0], s.geom.slotOffset(int(b))+int64(s.geom.hdrBytes)+4096); err != nil {
		t.Fatal(err)
	}
	_, err := s.Read(context.Background(), b, alignedBuf(t, 8192))
	mustMiss(t, err, ErrIO, io.ErrUnexpectedEOF)
	if st := s.Stats(); st.ReadIOErrors[IOErrShort] != 1 {
		t.Fatalf("stats %+v", st)
	}
	checkBlock(t, s, a, 1, 8192)
}

func TestDurableWriteOrder(t *testing.T) {
	cfg, files := withFaults(testConfig(t.TempDir()))
	cfg.Durable = true
	s := mustOpen(t, cfg)
	ff := (*files)[0]
	ff.set(func(f *faultFile) { f.log = nil })
	a := writeKey(t, s, 1, 8192)
	ff.mu.Lock()
	got := ff.log
	ff.mu.Unlock()
	want := []string{"write", "sync", "write", "sync"}
	if len(got) != len(want) {
		t.Fatalf("durable write did %v, want %v", got, want)
	}
	for i := range want {
		if got[i] != want[i] {
			t.Fatalf("durable write did %v, want %v", got, want)
		}
	}
	checkBlock(t, s, a, 1, 8192)

	// A failed sync fails the write, is counted, and leaves the slot a miss.
	ff.set(func(f *faultFile) { f.syncErr, f.syncN = unix.EIO, 1 })
	buf := alignedBuf(t, 8192)
	fillPayload(buf, 5)
	err := s.Write(context.Background(), a, metaFor(5, 4), buf)
	if !errors.Is(err, ErrIO) || !errors.Is(err, unix.EIO) {
		t.Fatalf("err = %v", err)
	}
	if st := s.Stats(); st.SyncIOErrors[IOErrEIO] != 1 {
		t.Fatalf("stats %+v", st)
	}
	_, err = s.Read(context.Background(), a, buf)
	mustMiss(t, err)
}

// TestCrashAtEveryCut writes a block over an older one and "crashes" after
// each possible prefix of the write reached the disk (every 512-byte sector
// boundary, and mid-sector), then reopens: the slot must hold the old block,
// the new block, or nothing, and never anything else.
func TestCrashAtEveryCut(t *testing.T) {
	for _, durable := range []bool{false, true} {
		name := "fast"
		if durable {
			name = "durable"
		}
		t.Run(name, func(t *testing.T) {
			dir := t.TempDir()
			cfg := testConfig(dir)
			cfg.Mode = ModeBuffered // cuts at any byte
			cfg.Durable = durable
			probe := mustOpenNoCleanup(t, cfg)
			slotBytes := probe.geom.hdrBytes + 8000
			mustClose(t, probe)
			type cutAt struct{ skip, cut int }
			var cuts []cutAt
			for cut := 0; cut < slotBytes; cut += 509 {
				cuts = append(cuts, cutAt{0, cut})
			}
			if durable {
				// The second write is the header's, after the payload's sync.
				for cut := 0; cut <= probe.geom.hdrBytes; cut += 128 {
					cuts = append(cuts, cutAt{1, cut})
				}
			} else {
				cuts = append(cuts, cutAt{0, slotBytes}) // all of it, then the crash
			}
			outcomes := map[string]int{}
			for _, c := range cuts {
				cut := c.cut
				os.RemoveAll(dir + "/kvtier-slab-000.kvs")
				fc, files := withFaults(cfg)
				s := mustOpenNoCleanup(t, fc)
				a := writeKey(t, s, 1, 8000)
				(*files)[0].set(func(f *faultFile) { f.writeCut, f.writeSkip = cut, c.skip })
				buf := make([]byte, 8000)
				fillPayload(buf, 2)
				if err := s.Write(context.Background(), a, metaFor(2, 4), buf); err == nil {
					t.Fatalf("cut %d: write succeeded", cut)
				}
				mustClose(t, s)
				// Without VerifyPayloadOnOpen a listed block may still fail
				// its payload check at Read, which must then be a miss.
				s = mustOpenNoCleanup(t, cfg)
				s.Range(func(slot Slot, m BlockMeta) bool {
					dst := make([]byte, 8192)
					got, err := s.Read(context.Background(), slot, dst)
					if err != nil {
						mustMiss(t, err, ErrCorrupt)
						outcomes["miss at read"]++
						return true
					}
					want := make([]byte, 8000)
					fillPayload(want, got.Key)
					if (got.Key != 1 && got.Key != 2) || string(dst[:8000]) != string(want) {
						t.Fatalf("cut %d: read key %d, payload right %v", cut, got.Key, string(dst[:8000]) == string(want))
					}
					return true
				})
				mustClose(t, s)
				// With it, only verified blocks are listed.
				vc := cfg
				vc.VerifyPayloadOnOpen = true
				s = mustOpenNoCleanup(t, vc)
				var keys []uint64
				s.Range(func(slot Slot, m BlockMeta) bool {
					if slot != a {
						t.Fatalf("cut %d: slot %d appeared", cut, slot)
					}
					keys = append(keys, m.Key)
					return true
				})
				switch {
				case len(keys) == 0:
					outcomes["miss"]++
				case keys[0] == 1:
					checkBlock(t, s, a, 1, 8000)
					outcomes["old"]++
				case keys[0] == 2:
					checkBlock(t, s, a, 2, 8000)
					outcomes["new"]++
				default:
					t.Fatalf("cut %d: key %d after a crash mid-write, want the old block, the new one or a miss", cut, keys[0])
				}
				mustClose(t, s)
			}
			t.Logf("outcomes over cuts of a %d-byte slot: %v", slotBytes, outcomes)
			if outcomes["miss"] == 0 || outcomes["old"] == 0 || outcomes["new"] == 0 {
				t.Fatal("the cuts did not reach every outcome: the test is not testing")
			}
		})
	}
}
