package remote

import (
	"context"
	"math/rand/v2"
	"os"
	"strconv"
	"testing"
	"time"

	"kvtier.dev/internal/redistest"
)

func TestMain(m *testing.M) { os.Exit(redistest.RunMain(m)) }

// uniquePrefix keeps tests (and repeated runs on one shared cluster) apart.
func uniquePrefix(t testing.TB) string {
	return "kvt-test:" + t.Name() + ":" + strconv.FormatUint(rand.Uint64(), 36) + ":"
}

func newRedis(t testing.TB, addrs []string) *Redis {
	t.Helper()
	r, err := NewRedis(RedisConfig{Addrs: addrs, ConnWriteTimeout: 2 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { r.Close() })
	return r
}

// slowOp is the read deadline of tests that check outcomes, not speed: a
// CI machine with two cores running -race can take a second for what
// takes milliseconds unloaded, and a read past its deadline is a miss.
const slowOp = 10 * time.Second

// newCache starts a Cache closed when t ends; a zero OpTimeout becomes
// slowOp.
func newCache(t testing.TB, cfg Config) *Cache {
	t.Helper()
	if cfg.OpTimeout == 0 {
		cfg.OpTimeout = slowOp
	}
	c, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

// block returns a payload and meta for block i of a made-up prefix.
func block(i, size int, salt uint64) (BlockMeta, []byte) {
	r := rand.New(rand.NewPCG(uint64(i), salt))
	p := make([]byte, size)
	for j := range p {
		p[j] = byte(r.Uint32())
	}
	toks := make([]int32, 16)
	for j := range toks {
		toks[j] = int32(i*16 + j)
	}
	return BlockMeta{Key: r.Uint64(), Parent: uint64(i), Salt: salt, Position: i, Tokens: toks}, p
}

func flush(t testing.TB, c *Cache) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	if err := c.Flush(ctx); err != nil {
		t.Fatal(err)
	}
}
