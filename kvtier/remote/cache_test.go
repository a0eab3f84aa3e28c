package remote

import (
	"bytes"
	"context"
	"errors"
	"testing"

	"kvtier.dev/internal/redistest"
)

func TestRoundTripInPartsAndMisses(t *testing.T) {
	addrs := redistest.Shared(t)
	st := newRedis(t, addrs)
	const size = 3<<20 + 17 // four parts of 1 MiB, the last short
	c := newCache(t, Config{Store: st, Prefix: uniquePrefix(t), BlockBytes: size, ChecksumKey: []byte("0123456789abcdef")})
	var metas []BlockMeta
	var payloads [][]byte
	for i := range 3 {
		m, p := block(i, size, 7)
		if ok, err := c.Put(m, p); !ok || err != nil {
			t.Fatalf("Put block %d: queued %v, %v", i, ok, err)
		}
		metas, payloads = append(metas, m), append(payloads, p)
	}
	flush(t, c)
	if s := c.Stats(); s.Written != 3 || s.Queued != 3 {
		t.Fatalf("after 3 Puts: %+v", s)
	}
	ops := make([]ReadOp, 4)
	for i := range ops {
		ops[i].Dst = make([]byte, size)
	}
	for i := range 3 {
		ops[i].Meta = metas[i]
	}
	absent, _ := block(99, size, 7)
	ops[3].Meta = absent
	c.Get(context.Background(), ops)
	for i := range 3 {
		if ops[i].Err != nil {
			t.Fatalf("block %d: %v", i, ops[i].Err)
		}
		if !bytes.Equal(ops[i].Dst, payloads[i]) {
			t.Fatalf("block %d: bytes differ", i)
		}
	}
	if !errors.Is(ops[3].Err, ErrMiss) || errors.Is(ops[3].Err, ErrCorrupt) {
		t.Fatalf("absent block: %v, want a plain miss", ops[3].Err)
	}

	// The same key asked for with other tokens, salt, parent or position is
	// a miss and deletes the value (it cannot be the block asked for).
	for name, edit := range map[string]func(*BlockMeta){
		"tokens":   func(m *BlockMeta) { m.Tokens = append([]int32{}, m.Tokens...); m.Tokens[3]++ },
		"salt":     func(m *BlockMeta) { m.Salt++ },
		"parent":   func(m *BlockMeta) { m.Parent++ },
		"position": func(m *BlockMeta) { m.Position++ },
	} {
		m := metas[0]
		edit(&m)
		if ok, _ := c.Put(metas[0], payloads[0]); !ok {
			t.Fatalf("%s: re-Put not queued", name)
		}
		flush(t, c)
		one := []ReadOp{{Meta: m, Dst: make([]byte, size)}}
		c.Get(context.Background(), one)
		if !errors.Is(one[0].Err, ErrCorrupt) || !errors.Is(one[0].Err, ErrMiss) {
			t.Fatalf("%s differs: %v, want a corrupt miss", name, one[0].Err)
		}
		one[0].Meta = metas[0]
		c.Get(context.Background(), one)
		if errors.Is(one[0].Err, ErrCorrupt) || !errors.Is(one[0].Err, ErrMiss) {
			t.Fatalf("%s: after the mismatch, the right block reads %v, want absent (deleted)", name, one[0].Err)
		}
	}
	s := c.Stats()
	if s.Hits != 3 || s.Corrupt != 4 || s.Absent != 5 || s.Misses != 9 {
		t.Fatalf("stats %+v", s)
	}
}

func TestTwoCachesShareAndDeduplicate(t *testing.T) {
	addrs := redistest.Shared(t)
	prefix := uniquePrefix(t)
	const size = 64 << 10
	a := newCache(t, Config{Store: newRedis(t, addrs), Prefix: prefix, BlockBytes: size, PartBytes: 16 << 10})
	b := newCache(t, Config{Store: newRedis(t, addrs), Prefix: prefix, BlockBytes: size, PartBytes: 16 << 10})
	m, p := block(1, size, 3)
	a.Put(m, p)
	flush(t, a)
	b.Put(m, p)
	flush(t, b)
	if sa, sb := a.Stats(), b.Stats(); sa.Written != 1 || sb.Written != 0 || sb.Deduplicated != 1 {
		t.Fatalf("a %+v\nb %+v", sa, sb)
	}
	ops := []ReadOp{{Meta: m, Dst: make([]byte, size)}}
	b.Get(context.Background(), ops)
	if ops[0].Err != nil || !bytes.Equal(ops[0].Dst, p) {
		t.Fatalf("b reads a's block: %v", ops[0].Err)
	}
}

func TestForeignOrUnkeyedValueIsCorrupt(t *testing.T) {
	addrs := redistest.Shared(t)
	prefix := uniquePrefix(t)
	const size = 4096
	plain := newCache(t, Config{Store: newRedis(t, addrs), Prefix: prefix, BlockBytes: size})
	keyed := newCache(t, Config{Store: newRedis(t, addrs), Prefix: prefix, BlockBytes: size, ChecksumKey: []byte("a key of 16 bytes")})
	m, p := block(2, size, 5)
	plain.Put(m, p)
	flush(t, plain)
	ops := []ReadOp{{Meta: m, Dst: make([]byte, size)}}
	keyed.Get(context.Background(), ops)
	if !errors.Is(ops[0].Err, ErrCorrupt) {
		t.Fatalf("an unkeyed value read with a key: %v, want corrupt", ops[0].Err)
	}
}
