package nvme

import (
	"context"
	"encoding/binary"
	"errors"
	"os"
	"path/filepath"
	"sync"
	"testing"

	"golang.org/x/sys/unix"
)

// alignedBuf maps n bytes of page-aligned memory, as pinned host memory is.
func alignedBuf(t testing.TB, n int) []byte {
	t.Helper()
	b, err := unix.Mmap(-1, 0, n, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_ANON|unix.MAP_PRIVATE)
	if err != nil {
		t.Fatalf("mmap %d: %v", n, err)
	}
	t.Cleanup(func() { _ = unix.Munmap(b) })
	return b
}

// fillPayload makes b a deterministic function of key (xorshift64), so that
// a reader can tell whether a block holds exactly what its writer meant.
func fillPayload(b []byte, key uint64) {
	x := key*0x9e3779b97f4a7c15 | 1
	for i := 0; i+8 <= len(b); i += 8 {
		x ^= x << 13
		x ^= x >> 7
		x ^= x << 17
		binary.LittleEndian.PutUint64(b[i:], x)
	}
	for i := len(b) &^ 7; i < len(b); i++ {
		b[i] = byte(key + uint64(i))
	}
}

func tokensFor(key uint64, n int) []uint32 {
	t := make([]uint32, n)
	for i := range t {
		t[i] = uint32(key)*31 + uint32(i)
	}
	return t
}

func metaFor(key uint64, ntok int) BlockMeta {
	return BlockMeta{Key: key, Parent: key ^ 0xabcdef, Salt: 7, Position: uint32(key % 1000), Tokens: tokensFor(key, ntok)}
}

func testConfig(dir string) Config {
	return Config{Dirs: []string{dir}, SlotsPerFile: 16, BlockBytes: 8192, MaxTokens: 16, Workers: 4}
}

// dirSumsKey is the checksum key Open keeps in dir.
func dirSumsKey(t testing.TB, dir string) []byte {
	t.Helper()
	k, err := os.ReadFile(filepath.Join(dir, keyFileName))
	if err != nil || len(k) != dirKeyBytes {
		t.Fatalf("the key of %s: %d bytes, %v", dir, len(k), err)
	}
	return k
}

// dirSums is the checksum of an unkeyed store in dir.
func dirSums(t testing.TB, dir string) *checksum { return newChecksum(dirSumsKey(t, dir), nil) }

func mustOpen(t testing.TB, cfg Config) *Store {
	t.Helper()
	s, err := Open(cfg)
	if err != nil {
		t.Fatalf("Open: %v", err)
	}
	t.Cleanup(func() { _ = s.Close() })
	return s
}

// writeKey allocates a slot and writes key's block of n bytes into it.
func writeKey(t testing.TB, s *Store, key uint64, n int) Slot {
	t.Helper()
	slot, err := s.Allocate()
	if err != nil {
		t.Fatalf("Allocate: %v", err)
	}
	buf := alignedBuf(t, max(n, 4096))[:n]
	fillPayload(buf, key)
	if err := s.Write(context.Background(), slot, metaFor(key, 4), buf); err != nil {
		t.Fatalf("Write key %d slot %d: %v", key, slot, err)
	}
	return slot
}

// checkBlock reads slot and fails unless it holds exactly key's block of n
// bytes.
func checkBlock(t testing.TB, s *Store, slot Slot, key uint64, n int) {
	t.Helper()
	dst := alignedBuf(t, max(s.geom.payloadRegion, 4096))
	m, err := s.Read(context.Background(), slot, dst)
	if err != nil {
		t.Fatalf("Read slot %d (key %d): %v", slot, key, err)
	}
	want := make([]byte, n)
	fillPayload(want, key)
	if m.Key != key || m.PayloadBytes != n || string(dst[:n]) != string(want) {
		t.Fatalf("slot %d: got key %d, %d bytes, payload equal %v; want key %d, %d bytes", slot, m.Key, m.PayloadBytes, string(dst[:n]) == string(want), key, n)
	}
	if wm := metaFor(key, 4); m.Parent != wm.Parent || m.Salt != wm.Salt || m.Position != wm.Position || len(m.Tokens) != 4 || m.Tokens[3] != wm.Tokens[3] {
		t.Fatalf("slot %d: meta %+v, want %+v", slot, m, wm)
	}
}

// faultFile wraps a File and injects faults chosen by the test.
type faultFile struct {
	File
	mu sync.Mutex
	// readErr, writeErr and syncErr fail the next calls while their count
	// is positive.
	readErr, writeErr, syncErr error
	readN, writeN, syncN       int
	// writeCut, when >= 0, makes the next write put only its first writeCut
	// bytes on disk and then fail, like a crash in the middle of it.
	writeCut int
	// writeSkip is how many writes pass untouched before writeCut applies.
	writeSkip int
	// shortWrite makes the next writes move only half of what is asked
	// (rounded down to 512) and report it, with no error.
	shortWrite int
	// log records the calls, for ordering checks.
	log []string
	// block, when set, makes writes wait until it is closed.
	block chan struct{}
	// entered is signalled when a write starts waiting on block.
	entered chan struct{}
}

func newFaultFile(f File) *faultFile { return &faultFile{File: f, writeCut: -1} }

func (f *faultFile) ReadAtv(bufs [][]byte, off int64) (int, error) {
	f.mu.Lock()
	if f.readN > 0 {
		f.readN--
		err := f.readErr
		f.mu.Unlock()
		return 0, err
	}
	f.log = append(f.log, "read")
	f.mu.Unlock()
	return f.File.ReadAtv(bufs, off)
}

func (f *faultFile) WriteAtv(bufs [][]byte, off int64) (int, error) {
	f.mu.Lock()
	block, entered := f.block, f.entered
	f.mu.Unlock()
	if block != nil {
		entered <- struct{}{}
		<-block
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	total := 0
	for _, b := range bufs {
		total += len(b)
	}
	f.log = append(f.log, "write")
	if f.writeN > 0 {
		f.writeN--
		return 0, f.writeErr
	}
	if f.writeCut >= 0 && f.writeSkip > 0 {
		f.writeSkip--
	} else if f.writeCut >= 0 {
		cut := f.writeCut
		f.writeCut = -1
		var part [][]byte
		for _, b := range bufs {
			if cut == 0 {
				break
			}
			n := min(cut, len(b))
			part = append(part, b[:n])
			cut -= n
		}
		if len(part) > 0 {
			if _, err := f.File.WriteAtv(part, off); err != nil {
				return 0, err
			}
		}
		return 0, unix.EIO
	}
	if f.shortWrite > 0 && total > 512 {
		f.shortWrite--
		half := total / 2 &^ 511
		var part [][]byte
		cut := half
		for _, b := range bufs {
			if cut == 0 {
				break
			}
			n := min(cut, len(b))
			part = append(part, b[:n])
			cut -= n
		}
		return f.File.WriteAtv(part, off)
	}
	return f.File.WriteAtv(bufs, off)
}

func (f *faultFile) Datasync() error {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.log = append(f.log, "sync")
	if f.syncN > 0 {
		f.syncN--
		return f.syncErr
	}
	return f.File.Datasync()
}

func (f *faultFile) set(fn func(f *faultFile)) {
	f.mu.Lock()
	defer f.mu.Unlock()
	fn(f)
}

// withFaults returns cfg with every file wrapped in a faultFile, and the
// wrappers in file order.
func withFaults(cfg Config) (Config, *[]*faultFile) {
	var files []*faultFile
	cfg.WrapFile = func(path string, f File) File {
		ff := newFaultFile(f)
		files = append(files, ff)
		return ff
	}
	return cfg, &files
}

// patchFile overwrites bytes of path at off, outside the Store, as a bit
// flip on the medium would.
func patchFile(t testing.TB, path string, off int64, fn func(b []byte)) {
	t.Helper()
	f, err := os.OpenFile(path, os.O_RDWR, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	b := make([]byte, 512)
	if _, err := f.ReadAt(b, off); err != nil {
		t.Fatal(err)
	}
	fn(b)
	if _, err := f.WriteAt(b, off); err != nil {
		t.Fatal(err)
	}
}

func mustMiss(t testing.TB, err error, also ...error) {
	t.Helper()
	if err == nil {
		t.Fatal("read succeeded, want a miss")
	}
	if !errors.Is(err, ErrNotFound) {
		t.Fatalf("err = %v, want ErrNotFound in the chain", err)
	}
	for _, e := range also {
		if !errors.Is(err, e) {
			t.Fatalf("err = %v, want %v in the chain", err, e)
		}
	}
}

var einval error = unix.EINVAL
