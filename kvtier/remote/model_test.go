package remote

import (
	"context"
	"errors"
	"strings"
	"testing"

	"kvtier.dev/internal/redistest"
)

// A prefix is bound to the first model that checks it; another model, or
// another deployment's key, is refused with the other model named; the
// same model passes.
func TestCheckModel(t *testing.T) {
	st := newMemStore()
	cache := func(model string, key []byte) *Cache {
		return newCache(t, Config{Store: st, Prefix: "p:", BlockBytes: 64, Model: model, ChecksumKey: key})
	}
	ctx := context.Background()
	a := cache("tiny weights=seed:1", nil)
	if rec, err := a.CheckModel(ctx); err != nil || !rec {
		t.Fatalf("an unbound prefix: recorded %v, %v", rec, err)
	}
	if rec, err := a.CheckModel(ctx); err != nil || rec {
		t.Fatalf("the same model again: recorded %v, %v", rec, err)
	}
	if rec, err := cache("tiny weights=seed:1", nil).CheckModel(ctx); err != nil || rec {
		t.Fatalf("another server of the same model: recorded %v, %v", rec, err)
	}
	_, err := cache("tiny weights=seed:2", nil).CheckModel(ctx)
	if !errors.Is(err, ErrOtherModel) || !strings.Contains(err.Error(), `"tiny weights=seed:1"`) || !strings.Contains(err.Error(), "p:model") {
		t.Fatalf("another model: %v, want ErrOtherModel naming the prefix's model and its record", err)
	}
	_, err = cache("tiny weights=seed:1", []byte("a key of 16 bytes")).CheckModel(ctx)
	if !errors.Is(err, ErrOtherModel) || !strings.Contains(err.Error(), "ChecksumKey") {
		t.Fatalf("a keyed deployment over an unkeyed record: %v, want ErrOtherModel naming ChecksumKey", err)
	}
	// A damaged or oversized record is refused, not overwritten.
	for name, v := range map[string][]byte{"damaged": append(a.encodeModel()[:20], 'x'), "oversized": make([]byte, 4096)} {
		st.m["p:model"] = v
		if _, err := a.CheckModel(ctx); !errors.Is(err, ErrOtherModel) {
			t.Fatalf("%s record: %v, want ErrOtherModel", name, err)
		}
		if string(st.m["p:model"]) != string(v) {
			t.Fatalf("%s record: CheckModel changed it", name)
		}
	}
	st.setDown(true)
	if _, err := a.CheckModel(ctx); err == nil || errors.Is(err, ErrOtherModel) {
		t.Fatalf("a store that does not answer: %v, want an error, not ErrOtherModel", err)
	}
}

// A value far larger than its Dst is read only one byte past it: the
// store says it is too long without holding it whole, and the tier
// counts it corrupt and deletes it.
func TestOversizedValueIsNotReadWhole(t *testing.T) {
	addrs := redistest.Shared(t)
	st := newRedis(t, addrs)
	prefix := uniquePrefix(t)
	const size = 4096
	c := newCache(t, Config{Store: st, Prefix: prefix, BlockBytes: size})
	m, p := block(1, size, 3)
	c.Put(m, p)
	flush(t, c)
	keys := keyNames(prefix, m.Key, 1)
	huge := strings.Repeat("z", 8<<20)
	if err := st.Client().Do(context.Background(), st.Client().B().Set().Key(keys[1]).Value(huge).Build()).Error(); err != nil {
		t.Fatal(err)
	}
	op := []GetOp{{Keys: keys, Dst: [][]byte{make([]byte, HeaderBytes), make([]byte, size)}, Got: make([]int, 2)}}
	st.Get(context.Background(), op)
	if op[0].Err != nil || op[0].Got[0] != HeaderBytes || op[0].Got[1] != size+1 {
		t.Fatalf("Get of an 8 MiB part into %d bytes: got %v, %v; want the header and %d bytes (one past Dst)", size, op[0].Got, op[0].Err, size+1)
	}
	ops := []ReadOp{{Meta: m, Dst: make([]byte, size)}}
	c.Get(context.Background(), ops)
	if !errors.Is(ops[0].Err, ErrCorrupt) || !strings.Contains(ops[0].Err.Error(), "more than 4096") {
		t.Fatalf("the oversized part: %v, want corrupt naming its size", ops[0].Err)
	}
	found := make([]bool, 2)
	if err := st.Exists(context.Background(), keys, found); err != nil || found[0] || found[1] {
		t.Fatalf("after the corrupt read: exists %v %v, want both deleted", found, err)
	}
}
