package nvme

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// A symbolic link planted in the directory, as a slab file or as the lock
// file, is refused, and the file it points to is left as it was.
func TestSymlinkInDirIsRefused(t *testing.T) {
	for _, name := range []string{"kvtier-slab-000.kvs", lockFileName} {
		t.Run(name, func(t *testing.T) {
			dir, elsewhere := t.TempDir(), t.TempDir()
			victim := filepath.Join(elsewhere, "victim")
			want := []byte("someone else's file\n")
			if err := os.WriteFile(victim, want, 0o600); err != nil {
				t.Fatal(err)
			}
			if err := os.Symlink(victim, filepath.Join(dir, name)); err != nil {
				t.Fatal(err)
			}
			_, err := Open(testConfig(dir))
			if !errors.Is(err, ErrUnsafeDir) || !strings.Contains(err.Error(), "symbolic link") {
				t.Fatalf("Open with %s a symlink: %v, want ErrUnsafeDir naming the link", name, err)
			}
			if got, _ := os.ReadFile(victim); !bytes.Equal(got, want) {
				t.Fatalf("the link's target changed: %q", got)
			}
		})
	}
}

// A directory that group or others may write is refused, with the mode in
// the error; a missing one is created with mode 0700.
func TestDirModeAndOwnerChecked(t *testing.T) {
	for _, mode := range []os.FileMode{0o770, 0o707, 0o1777} {
		dir := t.TempDir()
		if err := os.Chmod(dir, mode); err != nil {
			t.Fatal(err)
		}
		_, err := Open(testConfig(dir))
		if !errors.Is(err, ErrUnsafeDir) || !strings.Contains(err.Error(), "writable by group or others") ||
			!strings.Contains(err.Error(), "Config.Dirs[0]") {
			t.Fatalf("mode %04o: %v, want ErrUnsafeDir naming Config.Dirs[0]", mode, err)
		}
		if entries, _ := os.ReadDir(dir); len(entries) != 0 {
			t.Fatalf("mode %04o: a refused Open left %v", mode, entries)
		}
	}
	dir := filepath.Join(t.TempDir(), "new")
	s := mustOpen(t, testConfig(dir))
	if fi, err := os.Stat(dir); err != nil || fi.Mode().Perm() != 0o700 {
		t.Fatalf("created directory: %v %v, want mode 0700", fi.Mode(), err)
	}
	mustClose(t, s)
	if os.Geteuid() != 0 {
		t.Log("not root: the test of a directory owned by another user needs chown")
		return
	}
	if err := os.Chown(dir, 65534, 65534); err != nil {
		t.Fatal(err)
	}
	if _, err := Open(testConfig(dir)); !errors.Is(err, ErrUnsafeDir) || !strings.Contains(err.Error(), "owned by uid 65534") {
		t.Fatalf("a directory of uid 65534: %v", err)
	}
}

// Two stores on one directory: the second fails, naming the first's pid,
// and the first is untouched; after Close the directory opens again.
func TestTwoStoresOnOneDir(t *testing.T) {
	dir := t.TempDir()
	cfg := testConfig(dir)
	s := mustOpen(t, cfg)
	slot := writeKey(t, s, 1, 8192)
	_, err := Open(cfg)
	if !errors.Is(err, ErrLocked) || !strings.Contains(err.Error(), fmt.Sprintf("process %d", os.Getpid())) {
		t.Fatalf("second Open: %v, want ErrLocked naming process %d", err, os.Getpid())
	}
	// Another directory list that includes it is refused too.
	other := cfg
	other.Dirs = []string{t.TempDir(), dir}
	if _, err := Open(other); !errors.Is(err, ErrLocked) || !strings.Contains(err.Error(), "Config.Dirs[1]") {
		t.Fatalf("Open naming it second: %v", err)
	}
	checkBlock(t, s, slot, 1, 8192)
	mustClose(t, s)
	s2 := mustOpen(t, cfg)
	checkBlock(t, s2, slot, 1, 8192)
}

// One flipped payload bit, then three restarts: the bad block is dropped at
// the first read and never comes back; before, every restart adopted it.
func TestFlippedBitThenThreeRestarts(t *testing.T) {
	dir := t.TempDir()
	cfg := testConfig(dir)
	slots := fillStore(t, cfg, 4)
	g := newGeometry(&cfg, 512)
	patchFile(t, filepath.Join(dir, "kvtier-slab-000.kvs"), g.slotOffset(int(slots[2]))+int64(g.hdrBytes), func(b []byte) { b[100] ^= 2 })
	s := mustOpenNoCleanup(t, cfg)
	if st := s.Stats(); st.Recovered != 4 {
		t.Fatalf("first open: %+v", st)
	}
	_, err := s.Read(context.Background(), slots[2], alignedBuf(t, 8192))
	mustMiss(t, err, ErrCorrupt)
	if st := s.Stats(); st.SlotsInvalidated != 1 {
		t.Fatalf("after the failed read: %+v", st)
	}
	mustClose(t, s)
	for restart := range 3 {
		s := mustOpenNoCleanup(t, cfg)
		st := s.Stats()
		if st.Recovered != 3 || st.CorruptDrops != 0 {
			t.Fatalf("restart %d: %+v, want 3 blocks and nothing corrupt", restart+1, st)
		}
		if _, ok := s.Lookup(2); ok {
			t.Fatalf("restart %d adopted the corrupt block", restart+1)
		}
		for _, k := range []uint64{1, 3, 4} {
			checkBlock(t, s, slots[k], k, 8192)
		}
		mustClose(t, s)
	}
}

// With a ChecksumKey, a block written without it (by a store without the
// key, or planted by whoever can write the files) is rejected; blocks
// written with the key survive a restart with it.
func TestChecksumKey(t *testing.T) {
	dir := t.TempDir()
	plain := testConfig(dir)
	keyed := plain
	keyed.ChecksumKey = []byte("sixteen byte key and more")
	fillStore(t, plain, 3)

	s := mustOpenNoCleanup(t, keyed)
	if st := s.Stats(); st.Recovered != 0 || st.CorruptDrops != 3 {
		t.Fatalf("keyed open over unkeyed blocks: %+v, want all 3 rejected", st)
	}
	a := writeKey(t, s, 10, 8192)
	mustClose(t, s)

	s = mustOpenNoCleanup(t, keyed)
	if st := s.Stats(); st.Recovered != 1 {
		t.Fatalf("keyed reopen: %+v", st)
	}
	checkBlock(t, s, a, 10, 8192)
	mustClose(t, s)

	other := keyed
	other.ChecksumKey = []byte("another key of sixteen bytes")
	s = mustOpenNoCleanup(t, other)
	if st := s.Stats(); st.Recovered != 0 || st.CorruptDrops != 1 {
		t.Fatalf("open with another key: %+v", st)
	}
	mustClose(t, s)

	short := plain
	short.ChecksumKey = []byte("short")
	if _, err := Open(short); !errors.Is(err, ErrConfig) || !strings.Contains(err.Error(), "Config.ChecksumKey") {
		t.Fatalf("short key: %v", err)
	}
}

// The directory path itself may not be a symbolic link (another user who
// planted it would choose where the slab files go and how large they are):
// it is refused, and nothing is created where it points.
func TestSymlinkedDirPathIsRefused(t *testing.T) {
	target := t.TempDir()
	link := filepath.Join(t.TempDir(), "tier")
	if err := os.Symlink(target, link); err != nil {
		t.Fatal(err)
	}
	_, err := Open(testConfig(link))
	if !errors.Is(err, ErrUnsafeDir) || !strings.Contains(err.Error(), "symbolic link") || !strings.Contains(err.Error(), "Config.Dirs[0]") {
		t.Fatalf("Open of a symlinked directory: %v, want ErrUnsafeDir naming Config.Dirs[0] and the link", err)
	}
	if entries, _ := os.ReadDir(target); len(entries) != 0 {
		t.Fatalf("the refused Open left %v in the link's target", entries)
	}
	// A dangling link is refused too, and not created through.
	dangling := filepath.Join(t.TempDir(), "tier")
	if err := os.Symlink(filepath.Join(target, "new"), dangling); err != nil {
		t.Fatal(err)
	}
	if _, err := Open(testConfig(dangling)); !errors.Is(err, ErrUnsafeDir) {
		t.Fatalf("Open of a dangling link: %v, want ErrUnsafeDir", err)
	}
	if _, err := os.Lstat(filepath.Join(target, "new")); err == nil {
		t.Fatal("the refused Open created the dangling link's target")
	}
}
