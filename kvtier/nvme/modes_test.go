package nvme

import (
	"bytes"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// A slab file that group or others may read or write is refused, changed
// in nothing; with Reformat it is made 0600 and emptied: whoever could
// write it may have re-signed its slots.
func TestLooseSlabIsRefused(t *testing.T) {
	for _, mode := range []os.FileMode{0o666, 0o640, 0o604} {
		dir := t.TempDir()
		cfg := testConfig(dir)
		fillStore(t, cfg, 3)
		path := filepath.Join(dir, "kvtier-slab-000.kvs")
		if err := os.Chmod(path, mode); err != nil {
			t.Fatal(err)
		}
		before, err := os.ReadFile(path)
		if err != nil {
			t.Fatal(err)
		}
		_, err = Open(cfg)
		if !errors.Is(err, ErrUnsafeDir) || !strings.Contains(err.Error(), path) || !strings.Contains(err.Error(), "group or others") {
			t.Fatalf("mode %04o: %v, want ErrUnsafeDir naming %s", mode, err, path)
		}
		if after, _ := os.ReadFile(path); !bytes.Equal(before, after) {
			t.Fatalf("mode %04o: the refused Open changed the file", mode)
		}
		if fi, _ := os.Stat(path); fi.Mode().Perm() != mode {
			t.Fatalf("mode %04o: the refused Open made it %04o", mode, fi.Mode().Perm())
		}
		cfg.Reformat = true
		s := mustOpen(t, cfg)
		if st := s.Stats(); st.Recovered != 0 || st.SuperblocksRewritten != 1 {
			t.Fatalf("mode %04o with Reformat: %+v, want nothing kept", mode, st)
		}
		if fi, _ := os.Stat(path); fi.Mode().Perm() != 0o600 {
			t.Fatalf("mode %04o with Reformat: the file is %04o, want 0600", mode, fi.Mode().Perm())
		}
		mustClose(t, s)
	}
}

// A lock file that others may open is made 0600 (it holds a pid, nothing
// trusted; but whoever opens it can hold the lock).
func TestLooseLockFileIsFixed(t *testing.T) {
	dir := t.TempDir()
	cfg := testConfig(dir)
	fillStore(t, cfg, 1)
	lock := filepath.Join(dir, lockFileName)
	if err := os.Chmod(lock, 0o644); err != nil {
		t.Fatal(err)
	}
	s := mustOpen(t, cfg)
	if fi, _ := os.Stat(lock); fi.Mode().Perm() != 0o600 {
		t.Fatalf("lock file is %04o, want 0600", fi.Mode().Perm())
	}
	if st := s.Stats(); st.Recovered != 1 {
		t.Fatalf("stats %+v", st)
	}
}

// The directory's parent must not be writable by others unless sticky:
// whoever can write it can swap the directory.
func TestParentDirChecked(t *testing.T) {
	for _, tc := range []struct {
		mode os.FileMode
		ok   bool
	}{{0o777, false}, {0o775, false}, {0o755, true}, {os.ModeSticky | 0o777, true}} {
		parent := t.TempDir()
		if err := os.Chmod(parent, tc.mode); err != nil {
			t.Fatal(err)
		}
		dir := filepath.Join(parent, "tier")
		s, err := Open(testConfig(dir))
		if tc.ok {
			if err != nil {
				t.Fatalf("parent %04o: %v", tc.mode, err)
			}
			mustClose(t, s)
			continue
		}
		if !errors.Is(err, ErrUnsafeDir) || !strings.Contains(err.Error(), "parent") || !strings.Contains(err.Error(), "sticky") {
			t.Fatalf("parent %04o: %v, want ErrUnsafeDir naming the parent", tc.mode, err)
		}
		if _, err := os.Stat(dir); err == nil {
			t.Fatalf("parent %04o: the refused Open created the directory", tc.mode)
		}
	}
}

// Each directory keeps a random key (0600) that its headers are summed
// under: a slab file brought from another directory is dropped, as a
// header forged by anyone who cannot read the key would be.
func TestDirKey(t *testing.T) {
	a, b := t.TempDir(), t.TempDir()
	fillStore(t, testConfig(a), 3)
	fillStore(t, testConfig(b), 1)
	key := filepath.Join(a, keyFileName)
	if fi, err := os.Stat(key); err != nil || fi.Mode().Perm() != 0o600 || fi.Size() != dirKeyBytes {
		t.Fatalf("key file: %v %v", fi, err)
	}
	if bytes.Equal(dirSumsKey(t, a), dirSumsKey(t, b)) {
		t.Fatal("two directories have the same key")
	}
	// b's slab file replaced by a's (same geometry): every header fails.
	slab, err := os.ReadFile(filepath.Join(a, "kvtier-slab-000.kvs"))
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(b, "kvtier-slab-000.kvs"), slab, 0o600); err != nil {
		t.Fatal(err)
	}
	s := mustOpenNoCleanup(t, testConfig(b))
	if st := s.Stats(); st.Recovered != 0 || st.CorruptDrops != 3 {
		t.Fatalf("a slab from another directory: %+v, want its 3 blocks dropped", st)
	}
	mustClose(t, s)
	s = mustOpenNoCleanup(t, testConfig(a))
	if st := s.Stats(); st.Recovered != 3 {
		t.Fatalf("the key's own directory: %+v", st)
	}
	mustClose(t, s)
}

// A key file the tier cannot trust (readable by others) or use (another
// size) fails Open, unless Reformat, which replaces it (the blocks summed
// under the old key are then dropped). An empty one (a crash before its
// key was written) gets a key.
func TestDirKeyFileChecked(t *testing.T) {
	dir := t.TempDir()
	cfg := testConfig(dir)
	fillStore(t, cfg, 2)
	key := filepath.Join(dir, keyFileName)
	old := dirSumsKey(t, dir)
	if err := os.Chmod(key, 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := Open(cfg); !errors.Is(err, ErrUnsafeDir) || !strings.Contains(err.Error(), key) {
		t.Fatalf("a key readable by others: %v, want ErrUnsafeDir naming it", err)
	}
	if got, _ := os.ReadFile(key); !bytes.Equal(got, old) {
		t.Fatal("the refused Open changed the key")
	}
	re := cfg
	re.Reformat = true
	s := mustOpenNoCleanup(t, re)
	if st := s.Stats(); st.Recovered != 0 || st.CorruptDrops != 2 {
		t.Fatalf("with Reformat: %+v, want the 2 blocks of the old key dropped", st)
	}
	mustClose(t, s)
	if fi, _ := os.Stat(key); fi.Mode().Perm() != 0o600 || bytes.Equal(dirSumsKey(t, dir), old) {
		t.Fatalf("with Reformat the key is %04o and replaced %v, want 0600 and a new key", fi.Mode().Perm(), !bytes.Equal(dirSumsKey(t, dir), old))
	}

	if err := os.WriteFile(key, []byte("short"), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := Open(cfg); !errors.Is(err, ErrConfig) || !strings.Contains(err.Error(), "5 bytes") {
		t.Fatalf("a key of 5 bytes: %v, want ErrConfig naming its size", err)
	}
	if err := os.WriteFile(key, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	s = mustOpen(t, cfg)
	if k := dirSumsKey(t, dir); bytes.Equal(k, make([]byte, dirKeyBytes)) {
		t.Fatal("the new key is all zeroes")
	}
}
