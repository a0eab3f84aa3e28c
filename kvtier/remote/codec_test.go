package remote

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"strings"
	"testing"

	"kvtier.dev/internal/redistest"
	"kvtier.dev/kvtier/codec"
)

// The codecs' values: the tier keeps them as plain bytes, numbered as
// kvtier/codec numbers them (the test may import it; the package does not).
const (
	none = uint8(codec.None)
	fp8  = uint8(codec.FP8E4M3PerHead)
)

// onEachStore runs fn on a memStore and on the shared Redis Cluster.
func onEachStore(t *testing.T, fn func(t *testing.T, st Store, prefix string)) {
	t.Run("mem", func(t *testing.T) { fn(t, newMemStore(), "kvt:") })
	t.Run("redis", func(t *testing.T) {
		addrs := redistest.Shared(t)
		fn(t, newRedis(t, addrs), uniquePrefix(t))
	})
}

// patchHeader reads block m's header value from st, lets edit change it,
// recomputes its checksum under c's key (as a writer who holds the key
// could) and writes it back.
func patchHeader(t *testing.T, c *Cache, st Store, m BlockMeta, edit func(h []byte)) {
	t.Helper()
	keys := keyNames(c.cfg.Prefix, m.Key, c.parts)
	get := []GetOp{{Keys: keys[:1], Dst: [][]byte{make([]byte, HeaderBytes+1)}, Got: []int{0}}}
	st.Get(context.Background(), get)
	if get[0].Err != nil || get[0].Got[0] != HeaderBytes {
		t.Fatalf("header of block %#x: %d bytes, %v", m.Key, get[0].Got[0], get[0].Err)
	}
	h := get[0].Dst[0][:HeaderBytes]
	edit(h)
	binary.LittleEndian.PutUint64(h[8:], c.sum.Of(h[16:HeaderBytes]))
	put := []PutOp{{Keys: keys[:1], Values: [][]byte{h}}}
	st.Put(context.Background(), put)
	if put[0].Err != nil {
		t.Fatal(put[0].Err)
	}
}

// readAs reads block m in codec want.
func readAs(c *Cache, m BlockMeta, want uint8) ([]byte, error) {
	m.Codec = want
	ops := []ReadOp{{Meta: m, Dst: make([]byte, c.BlockBytes())}}
	c.Get(context.Background(), ops)
	return ops[0].Dst, ops[0].Err
}

// mustBeDeleted fails unless err is a corrupt miss naming what and every
// value of block m is gone from st.
func mustBeDeleted(t *testing.T, c *Cache, st Store, m BlockMeta, err error, what string) {
	t.Helper()
	if !errors.Is(err, ErrMiss) || !errors.Is(err, ErrCorrupt) || !strings.Contains(err.Error(), what) {
		t.Fatalf("err = %v, want a corrupt miss saying %q", err, what)
	}
	keys := keyNames(c.cfg.Prefix, m.Key, c.parts)
	found := make([]bool, len(keys))
	if err := st.Exists(context.Background(), keys, found); err != nil {
		t.Fatal(err)
	}
	for i, f := range found {
		if f {
			t.Fatalf("key %s is still there after a corrupt read", keys[i])
		}
	}
}

// A header whose codec byte was changed, with its checksum made to hold,
// is never served: a read in the codec the block was written in finds
// another in the header, and deletes the value as it does one whose
// checksum fails.
func TestRewrittenCodecByteIsNeverServed(t *testing.T) {
	onEachStore(t, func(t *testing.T, st Store, prefix string) {
		const size = 3000
		c := newCache(t, Config{Store: st, Prefix: prefix, BlockBytes: size, PartBytes: 1024, ChecksumKey: []byte("a key of 16 bytes")})
		for i, tc := range []struct{ written, disk uint8 }{
			{none, fp8},
			{fp8, none},
		} {
			m, p := block(i, size, 41)
			m.Codec = tc.written
			if ok, err := c.Put(m, p); !ok || err != nil {
				t.Fatalf("Put: queued %v, %v", ok, err)
			}
			flush(t, c)
			if got, err := readAs(c, m, tc.written); err != nil || !bytes.Equal(got, p) {
				t.Fatalf("block in codec %v before the rewrite: %v", tc.written, err)
			}
			patchHeader(t, c, st, m, func(h []byte) { h[7] = tc.disk })
			before := c.Stats().Corrupt
			_, err := readAs(c, m, tc.written)
			mustBeDeleted(t, c, st, m, err, fmt.Sprintf("header says codec %d, want %d", tc.disk, tc.written))
			if c.Stats().Corrupt != before+1 {
				t.Fatalf("not counted as corrupt: %+v", c.Stats())
			}
		}
	})
}

// A block asked for in another codec than it was written in is a corrupt
// miss and deleted; written again, it reads in its own.
func TestOtherCodecIsACorruptMiss(t *testing.T) {
	onEachStore(t, func(t *testing.T, st Store, prefix string) {
		const size = 2048
		c := newCache(t, Config{Store: st, Prefix: prefix, BlockBytes: size})
		m, p := block(3, size, 43)
		m.Codec = fp8
		c.Put(m, p)
		flush(t, c)
		_, err := readAs(c, m, none)
		mustBeDeleted(t, c, st, m, err, "header says codec 1, want 0")
		if q, err := c.Put(m, p); !q || err != nil {
			t.Fatalf("Put after the delete: queued %v, %v", q, err)
		}
		flush(t, c)
		if got, err := readAs(c, m, fp8); err != nil || !bytes.Equal(got, p) {
			t.Fatalf("block in its own codec: %v", err)
		}
		if s := c.Stats(); s.Hits != 1 || s.Corrupt != 1 || s.Written != 2 {
			t.Fatalf("stats %+v", s)
		}
	})
}

// A version-1 header (before codecs) reads as codec None, and only as it;
// a version this build does not know is a corrupt value.
func TestVersion1HeaderIsCodecNone(t *testing.T) {
	st := newMemStore()
	const size = 1024
	c := newCache(t, Config{Store: st, BlockBytes: size})
	asV1 := func(h []byte) { binary.LittleEndian.PutUint16(h[4:], formatV1); h[7] = 0 }
	m, p := block(5, size, 47)
	c.Put(m, p)
	flush(t, c)
	patchHeader(t, c, st, m, asV1)
	if got, err := readAs(c, m, none); err != nil || !bytes.Equal(got, p) {
		t.Fatalf("a version-1 header read as codec None: %v", err)
	}
	_, err := readAs(c, m, fp8)
	mustBeDeleted(t, c, st, m, err, "header says codec 0, want 1")

	m2, p2 := block(6, size, 47)
	c.Put(m2, p2)
	flush(t, c)
	patchHeader(t, c, st, m2, func(h []byte) { binary.LittleEndian.PutUint16(h[4:], formatVersion+1) })
	_, err = readAs(c, m2, none)
	mustBeDeleted(t, c, st, m2, err, "header format version 3, want 2 (or 1)")
}
