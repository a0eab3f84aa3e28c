package nvme

import (
	"encoding/binary"
	"errors"
	"path/filepath"
	"strings"
	"testing"

	"github.com/cespare/xxhash/v2"
	"golang.org/x/sys/unix"
)

// A tier written for one model and opened for another has its slots
// cleared before anything is read, and says so in Info.Cleared; reopened
// for the same model it keeps its blocks.
func TestOtherModelIsCleared(t *testing.T) {
	dir := t.TempDir()
	a, b := testConfig(dir), testConfig(dir)
	a.Model, b.Model = "tiny weights=seed:1", "tiny weights=seed:2"
	fillStore(t, a, 5)

	s := mustOpenNoCleanup(t, a)
	if st, info := s.Stats(), s.Info(); st.Recovered != 5 || len(info.Cleared) != 0 {
		t.Fatalf("reopened for the same model: %+v, cleared %+v", st, info.Cleared)
	}
	mustClose(t, s)

	s = mustOpenNoCleanup(t, b)
	st, info := s.Stats(), s.Info()
	if st.Recovered != 0 || st.ModelCleared != 5 || st.CorruptDrops != 0 {
		t.Fatalf("opened for another model: %+v, want 5 slots cleared and nothing recovered", st)
	}
	want := ClearedFile{Path: filepath.Join(dir, "kvtier-slab-000.kvs"), WrittenFor: a.Model, Recorded: true, Slots: 5}
	if len(info.Cleared) != 1 || info.Cleared[0] != want {
		t.Fatalf("Info.Cleared = %+v, want [%+v]", info.Cleared, want)
	}
	for k := uint64(1); k <= 5; k++ {
		if _, ok := s.Lookup(k); ok {
			t.Fatalf("key %d of the other model is indexed", k)
		}
	}
	writeKey(t, s, 7, 8192)
	mustClose(t, s)

	s = mustOpenNoCleanup(t, b)
	if st, info := s.Stats(), s.Info(); st.Recovered != 1 || len(info.Cleared) != 0 {
		t.Fatalf("reopened for the model that cleared it: %+v, cleared %+v", st, info.Cleared)
	}
	mustClose(t, s)
	// A long model text is recorded by its digest; its label is cut.
	long := b
	long.Model = strings.Repeat("x", 500)
	s = mustOpenNoCleanup(t, long)
	if c := s.Info().Cleared; len(c) != 1 || c[0].WrittenFor != b.Model || c[0].Slots != 1 {
		t.Fatalf("cleared %+v", c)
	}
	mustClose(t, s)
	s = mustOpenNoCleanup(t, b)
	if c := s.Info().Cleared; len(c) != 1 || c[0].WrittenFor != long.Model[:maxLabelBytes] {
		t.Fatalf("cleared %+v, want the long model's first %d bytes", c, maxLabelBytes)
	}
	mustClose(t, s)
}

// A header that cannot be cleared fails Open and leaves the superblock
// naming the other model, so that the next Open clears the file again:
// the other model's blocks are never adopted.
func TestModelClearFailureIsRetried(t *testing.T) {
	dir := t.TempDir()
	a, b := testConfig(dir), testConfig(dir)
	a.Model, b.Model = "model a", "model b"
	fillStore(t, a, 3)
	faulty := b
	faulty.WrapFile = func(_ string, f File) File {
		ff := newFaultFile(f)
		ff.writeErr, ff.writeN = unix.EIO, 1
		return ff
	}
	if _, err := Open(faulty); err == nil || !strings.Contains(err.Error(), "another model") {
		t.Fatalf("Open with a header that cannot be cleared: %v, want an error", err)
	}
	s := mustOpenNoCleanup(t, b)
	if st := s.Stats(); st.Recovered != 0 || st.ModelCleared != 1 {
		t.Fatalf("the next Open: %+v, want the one slot left of model a cleared", st)
	}
	mustClose(t, s)
	s = mustOpenNoCleanup(t, a)
	if st := s.Stats(); st.Recovered != 0 {
		t.Fatalf("model a's blocks came back: %+v", st)
	}
	mustClose(t, s)
}

// A file of superblock version 2 (which recorded no model) is cleared and
// upgraded, not refused.
func TestVersion2SuperblockIsCleared(t *testing.T) {
	dir := t.TempDir()
	cfg := testConfig(dir)
	fillStore(t, cfg, 2)
	patchFile(t, filepath.Join(dir, "kvtier-slab-000.kvs"), 0, func(b []byte) {
		le := binary.LittleEndian
		le.PutUint32(b[16:], superV2Version)
		clear(b[44:superBytes])
		le.PutUint64(b[8:], xxhash.Sum64(b[16:superV2Bytes]))
	})
	s := mustOpen(t, cfg)
	c := s.Info().Cleared
	if len(c) != 1 || c[0].Recorded || c[0].Slots != 2 {
		t.Fatalf("cleared %+v, want one file of no recorded model, 2 slots", c)
	}
}

// A file written with another geometry fails Open naming the field, and
// with Reformat is emptied and formatted afresh.
func TestReformatOtherGeometry(t *testing.T) {
	dir := t.TempDir()
	cfg := testConfig(dir)
	fillStore(t, cfg, 3)
	other := cfg
	other.MaxTokens = 8
	if _, err := Open(other); !errors.Is(err, ErrConfig) || !strings.Contains(err.Error(), "MaxTokens") || !strings.Contains(err.Error(), "Reformat") {
		t.Fatalf("Open with another MaxTokens: %v, want ErrConfig naming MaxTokens and Reformat", err)
	}
	other.Reformat = true
	s := mustOpenNoCleanup(t, other)
	if st := s.Stats(); st.SuperblocksRewritten != 1 || st.Recovered != 0 {
		t.Fatalf("reformatted: %+v", st)
	}
	writeKey(t, s, 4, 8192)
	mustClose(t, s)
	other.Reformat = false
	s = mustOpen(t, other)
	if st := s.Stats(); st.Recovered != 1 || st.SuperblocksRewritten != 0 {
		t.Fatalf("reopened: %+v", st)
	}
}
