package stack

import (
	"bytes"
	"context"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"os"
	"strings"
	"sync"
	"testing"

	"kvtier.dev/internal/redistest"
	"kvtier.dev/kvtier"
)

// TestMain stops the Redis Cluster redistest.Shared may start.
func TestMain(m *testing.M) { os.Exit(redistest.RunMain(m)) }

// syncBuffer is a log destination the cache's goroutines may write to.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// nvmeOptions are a cache over a fresh simulated GPU of 8 blocks with an
// NVMe tier of 8 in dir, kept across opens, logging into log.
func nvmeOptions(t *testing.T, dir string, m Model, log *syncBuffer) Options {
	sh, _ := simShard(t, 8)
	return Options{Device: sh.Device, GPU: sh.GPU, BlockTokens: 4, HostBytes: 8 << 12, WriteThrough: true,
		NVMeDirs: []string{dir}, NVMeBytes: 8 << 12, KeepNVMe: true, Model: m, Logger: slog.New(slog.NewTextHandler(log, nil))}
}

// TestOpenModelBindsNVMe: blocks a cache wrote to NVMe for one model are
// adopted by the next start of that model, and cleared, with a Warn line
// naming the model they were written for, by a start of another model.
func TestOpenModelBindsNVMe(t *testing.T) {
	dir := t.TempDir()
	a := Model{Weights: "seed:1", Shape: "tiny", DType: "bf16", Tokenizer: "bytes"}
	b := a
	b.Weights = "seed:2"
	var log syncBuffer
	c, err := Open(context.Background(), nvmeOptions(t, dir, a, &log))
	if err != nil {
		t.Fatal(err)
	}
	if c.Salt(1) == 1 || c.Salt(1) == c.Salt(2) || c.Salt(1) != a.Salt(1) || b.Salt(1) == a.Salt(1) {
		t.Fatalf("Salt(1) = %#x, Salt(2) = %#x, Model.Salt(1) %#x and %#x: want the model folded in, tenants and models apart", c.Salt(1), c.Salt(2), a.Salt(1), b.Salt(1))
	}
	var w kvtier.Lease
	if err := c.Insert(c.Salt(1), make([]int32, 8), kvtier.GPU, &w); err != nil {
		t.Fatal(err)
	}
	if err := c.Commit(&w, nil); err != nil {
		t.Fatal(err)
	}
	c.Release(&w)
	if err := c.Flush(context.Background()); err != nil {
		t.Fatal(err)
	}
	if n := c.Metrics().Tiers[kvtier.NVMe].ResidentBlocks; n != 2 {
		t.Fatalf("%d blocks on NVMe, want 2", n)
	}
	if err := c.Close(); err != nil {
		t.Fatal(err)
	}

	for _, tc := range []struct {
		m       Model
		adopted int64
		cleared bool
	}{{a, 2, false}, {b, 0, true}, {a, 0, true}} {
		log = syncBuffer{}
		c, err := Open(context.Background(), nvmeOptions(t, dir, tc.m, &log))
		if err != nil {
			t.Fatal(err)
		}
		n := c.Metrics().Tiers[kvtier.NVMe].ResidentBlocks
		cleared := strings.Contains(log.String(), "level=WARN msg=\"kvtier: NVMe tier written for another model: cleared")
		if err := c.Close(); err != nil {
			t.Fatal(err)
		}
		if n != tc.adopted || cleared != tc.cleared {
			t.Fatalf("open of %s: %d blocks adopted, cleared %v; want %d, %v; log:\n%s", tc.m.Weights, n, cleared, tc.adopted, tc.cleared, log.String())
		}
		if other := map[string]string{"seed:1": "seed:2", "seed:2": "seed:1"}[tc.m.Weights]; tc.cleared && !strings.Contains(log.String(), "weights="+other) {
			t.Fatalf("the Warn line does not name the model the tier was written for (%s):\n%s", other, log.String())
		}
	}
	var zero Cache
	if zero.Salt(7) != 7 {
		t.Fatal("the zero Model changes salts")
	}
}

// TestOpenNVMeReformat: a tier written with another geometry stops Open
// with an error naming Options.NVMeReformat; with it, Open reformats.
func TestOpenNVMeReformat(t *testing.T) {
	dir := t.TempDir()
	var log syncBuffer
	c, err := Open(context.Background(), nvmeOptions(t, dir, Model{}, &log))
	if err != nil {
		t.Fatal(err)
	}
	c.Close()
	o := nvmeOptions(t, dir, Model{}, &log)
	o.NVMeBytes = 16 << 12
	if _, err := Open(context.Background(), o); err == nil || !strings.Contains(err.Error(), "Options.NVMeReformat") || !strings.Contains(err.Error(), "SlotsPerFile") {
		t.Fatalf("Open over another geometry: %v, want an error naming SlotsPerFile and Options.NVMeReformat", err)
	}
	o.NVMeReformat = true
	c, err = Open(context.Background(), o)
	if err != nil {
		t.Fatalf("Open with NVMeReformat: %v", err)
	}
	if st := c.Store.Stats(); st.SuperblocksRewritten != 1 {
		t.Fatalf("stats %+v, want one file reformatted", st)
	}
	c.Close()
}

// TestOpenRemote: a cache with a remote tier binds its prefix to its
// model, warns when the checksums are unkeyed, and a cache of another
// model is refused the prefix.
func TestOpenRemote(t *testing.T) {
	addrs := redistest.Shared(t)
	prefix := fmt.Sprintf("kvt-test:%s:%x:", t.Name(), rand.Uint64())
	a := Model{Weights: "seed:1", Shape: "tiny"}
	open := func(m Model, key []byte) (*Cache, string, error) {
		var log syncBuffer
		sh, _ := simShard(t, 8)
		c, err := Open(context.Background(), Options{Device: sh.Device, GPU: sh.GPU, BlockTokens: 4, HostBytes: 8 << 12, Model: m,
			Remote: &RemoteOptions{Addrs: addrs, Prefix: prefix, ChecksumKey: key}, Logger: slog.New(slog.NewTextHandler(&log, nil))})
		return c, log.String(), err
	}
	c, log, err := open(a, nil)
	if err != nil {
		t.Fatal(err)
	}
	if c.Remote == nil || !strings.Contains(log, "level=WARN") || !strings.Contains(log, "unkeyed") || !strings.Contains(log, "bound to this model") {
		t.Fatalf("an unkeyed remote tier: Remote %v; want a Warn line and the prefix bound; log:\n%s", c.Remote, log)
	}
	c.Close()
	b := a
	b.Weights = "seed:2"
	_, _, err = open(b, nil)
	if err == nil || !strings.Contains(err.Error(), "refused") || !strings.Contains(err.Error(), "weights=seed:1") {
		t.Fatalf("another model on the prefix: %v, want it refused naming the prefix's model", err)
	}
	prefix += "keyed:"
	c, log, err = open(a, []byte("a deployment key of 32 bytes...."))
	if err != nil {
		t.Fatal(err)
	}
	if strings.Contains(log, "unkeyed") {
		t.Fatalf("a keyed remote tier warned:\n%s", log)
	}
	c.Close()
}
