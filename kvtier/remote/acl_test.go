package remote

import (
	"context"
	"errors"
	"math/rand/v2"
	"strconv"
	"testing"

	"kvtier.dev/internal/redistest"
)

// aclCommands are the commands RedisConfig.Username's doc lists: all the
// tier and its client need.
var aclCommands = []string{"+getrange", "+set", "+exists", "+del", "+ping", "+cluster|slots", "+cluster|shards", "+hello"}

// TestACLUserConfinedToItsPrefix: a deployment's ACL user works through the
// tier under its prefix and cannot touch another prefix (a miss and a
// failed write, never a hit); a wrong password fails to connect.
func TestACLUserConfinedToItsPrefix(t *testing.T) {
	addrs := redistest.Shared(t)
	user := "kvt-test-" + strconv.FormatUint(rand.Uint64(), 36)
	prefix := "kvt-acl:" + user + ":"
	for _, a := range addrs {
		args := append([]string{"ACL", "SETUSER", user, "on", ">secret-" + user, "~" + prefix + "*"}, aclCommands...)
		if _, err := redistest.Do(a, "", args...); err != nil {
			t.Fatal(err)
		}
	}
	t.Cleanup(func() {
		for _, a := range addrs {
			redistest.Do(a, "", "ACL", "DELUSER", user)
		}
	})
	st, err := NewRedis(RedisConfig{Addrs: addrs, Username: user, Password: "secret-" + user})
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	const size = 4096
	mine := newCache(t, Config{Store: st, Prefix: prefix, BlockBytes: size})
	m, p := block(1, size, 23)
	mine.Put(m, p)
	flush(t, mine)
	if h := readAll(t, mine, []BlockMeta{m}, [][]byte{p}); h != 1 {
		t.Fatalf("the user's own prefix: %d hits: %+v", h, mine.Stats())
	}

	// Another prefix: the same block, written there by the default user.
	other := uniquePrefix(t)
	admin := newCache(t, Config{Store: newRedis(t, addrs), Prefix: other, BlockBytes: size})
	admin.Put(m, p)
	flush(t, admin)
	theirs := newCache(t, Config{Store: st, Prefix: other, BlockBytes: size, BreakerFailures: 100})
	if h := readAll(t, theirs, []BlockMeta{m}, [][]byte{p}); h != 0 {
		t.Fatal("the user read another prefix's block")
	}
	m2, p2 := block(2, size, 23)
	theirs.Put(m2, p2)
	flush(t, theirs)
	if s := theirs.Stats(); s.Failed != 1 || s.Written != 0 || s.WriteErrors != 1 {
		t.Fatalf("another prefix: %+v, want a failed read and a failed write", s)
	}

	if _, err := NewRedis(RedisConfig{Addrs: addrs, Username: user, Password: "wrong"}); err == nil {
		t.Fatal("a wrong password connected")
	}
}

func TestConfigErrors(t *testing.T) {
	st := nopStore{}
	for name, cfg := range map[string]Config{
		"no store":        {BlockBytes: 1},
		"brace in prefix": {Store: st, Prefix: "a{b", BlockBytes: 1},
		"no block bytes":  {Store: st},
		"negative part":   {Store: st, BlockBytes: 1, PartBytes: -1},
		"short key":       {Store: st, BlockBytes: 1, ChecksumKey: []byte("short")},
		"negative op":     {Store: st, BlockBytes: 1, OpTimeout: -1},
		"negative queue":  {Store: st, BlockBytes: 1, QueueBlocks: -1},
		"negative writer": {Store: st, BlockBytes: 1, Writers: -1},
		"negative ttl":    {Store: st, BlockBytes: 1, TTL: -1},
		"negative fails":  {Store: st, BlockBytes: 1, BreakerFailures: -1},
		"negative cool":   {Store: st, BlockBytes: 1, BreakerCooldown: -1},
	} {
		if _, err := New(cfg); !errors.Is(err, ErrConfig) {
			t.Errorf("%s: %v, want ErrConfig", name, err)
		}
	}
	for name, cfg := range map[string]RedisConfig{
		"no addrs":       {},
		"no port":        {Addrs: []string{"localhost"}},
		"negative dial":  {Addrs: []string{"a:1"}, DialTimeout: -1},
		"multiplex 9":    {Addrs: []string{"a:1"}, PipelineMultiplex: 9},
		"negative write": {Addrs: []string{"a:1"}, ConnWriteTimeout: -1},
	} {
		if _, err := NewRedis(cfg); !errors.Is(err, ErrConfig) {
			t.Errorf("%s: %v, want ErrConfig", name, err)
		}
	}
}

func TestBadInputAndClosed(t *testing.T) {
	c, err := New(Config{Store: nopStore{}, BlockBytes: 8})
	if err != nil {
		t.Fatal(err)
	}
	m := BlockMeta{Key: 1}
	if _, err := c.Put(m, make([]byte, 7)); !errors.Is(err, ErrBadInput) {
		t.Errorf("short payload: %v", err)
	}
	if _, err := c.Put(BlockMeta{Key: 1, Position: -1}, make([]byte, 8)); !errors.Is(err, ErrBadInput) {
		t.Errorf("negative position: %v", err)
	}
	ops := []ReadOp{{Meta: m, Dst: make([]byte, 9)}}
	c.Get(context.Background(), ops)
	if !errors.Is(ops[0].Err, ErrBadInput) {
		t.Errorf("long Dst: %v", ops[0].Err)
	}
	c.Close()
	if _, err := c.Put(m, make([]byte, 8)); !errors.Is(err, ErrClosed) {
		t.Errorf("Put after Close: %v", err)
	}
	ops[0].Dst = make([]byte, 8)
	c.Get(context.Background(), ops)
	if !errors.Is(ops[0].Err, ErrClosed) || !errors.Is(ops[0].Err, ErrMiss) {
		t.Errorf("Get after Close: %v", ops[0].Err)
	}
}

// nopStore holds nothing and fails nothing.
type nopStore struct{}

func (nopStore) Get(_ context.Context, ops []GetOp) {
	for i := range ops {
		for k := range ops[i].Got {
			ops[i].Got[k] = -1
		}
	}
}
func (nopStore) Put(context.Context, []PutOp)                   {}
func (nopStore) Exists(context.Context, []string, []bool) error { return nil }
func (nopStore) Delete(context.Context, []string) error         { return nil }
func (nopStore) Close() error                                   { return nil }
