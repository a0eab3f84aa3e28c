package remotetier_test

import (
	"bytes"
	"context"
	"errors"
	"log/slog"
	"math/rand/v2"
	"os"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"kvtier.dev/internal/redistest"
	"kvtier.dev/internal/stacktest"
	"kvtier.dev/kvtier"
	"kvtier.dev/kvtier/policy"
	"kvtier.dev/kvtier/remote"
	"kvtier.dev/kvtier/remotetier"
)

// TestMain stops the Redis Cluster redistest.Shared may start.
func TestMain(m *testing.M) { os.Exit(redistest.RunMain(m)) }

// The fixture's blocks (internal/stacktest's shape).
const (
	blockTokens = 4
	blockBytes  = stacktest.BlockBytes
)

// server is one server of the shared tier: a cache over a simulated GPU
// (8 blocks, a host tier of 8 slots, write-through), the KV it wrote, and
// its remote tier on the shared test cluster.
type server struct {
	*stacktest.Stack
	want   map[kvtier.Key][]byte // each block's KV
	rng    *rand.Rand
	tokens int32 // next token id
	cache  *remote.Cache
	rt     *remotetier.Tier
}

func newServer(t *testing.T, addrs []string, prefix string, adm policy.Admitter[kvtier.Key]) *server {
	return newServerWith(t, addrs, prefix, adm, nil)
}

// newServerWith is newServer with its remote and tier configurations as
// edit leaves them.
func newServerWith(t *testing.T, addrs []string, prefix string, adm policy.Admitter[kvtier.Key], edit func(*remote.Config, *remotetier.Config)) *server {
	t.Helper()
	f := &server{Stack: stacktest.Open(t, stacktest.Options{BlockTokens: blockTokens, WriteThrough: true, EventBuffer: 1 << 10}),
		want: map[kvtier.Key][]byte{}, rng: rand.New(rand.NewPCG(8, 8))}
	var st remote.Store = newMemStore() // addrs nil: a store in memory
	if addrs != nil {
		rs, err := remote.NewRedis(remote.RedisConfig{Addrs: addrs})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { rs.Close() })
		st = rs
	}
	var err error
	rc := remote.Config{Store: st, Prefix: prefix, BlockBytes: blockBytes, PartBytes: stacktest.PartBytes, OpTimeout: 10 * time.Second}
	tc := remotetier.Config{HostSlot: f.hostSlot, Admitter: adm}
	if edit != nil {
		edit(&rc, &tc)
	}
	if f.cache, err = remote.New(rc); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { f.cache.Close() })
	tc.Cache = f.cache
	if f.rt, err = remotetier.New(f.Manager, tc); err != nil {
		t.Fatal(err)
	}
	return f
}

func (f *server) hostSlot(s kvtier.Slot) []byte { return f.Host.Slot(int32(s)) }

func remotePrefix(t *testing.T) string {
	return "kvt-test:" + t.Name() + ":" + strconv.FormatUint(rand.Uint64(), 36) + ":"
}

// request returns the tokens of a new request of n blocks.
func (f *server) request(n int) []int32 {
	tok := make([]int32, n*blockTokens)
	for i := range tok {
		tok[i] = f.tokens
		f.tokens++
	}
	return tok
}

func (f *server) readGPU(t *testing.T, s kvtier.Slot) []byte { return f.ReadGPU(t, s) }

// serve runs a request's prefill: it inserts tokens into the GPU, writes
// the new blocks' KV (random, remembered), commits, and drains the
// write-through copies.
func (f *server) serve(t *testing.T, tokens []int32) {
	t.Helper()
	var w kvtier.Lease
	if err := f.Insert(1, tokens, kvtier.GPU, &w); err != nil {
		t.Fatal(err)
	}
	for _, b := range w.Blocks {
		if !b.Write {
			continue
		}
		kv := make([]byte, blockBytes)
		for i := range kv {
			kv[i] = byte(f.rng.Uint32())
		}
		f.want[b.Key] = kv
		f.WriteGPU(t, b.Slot, kv)
	}
	if err := f.Commit(&w, nil); err != nil {
		t.Fatal(err)
	}
	f.Release(&w)
	if err := f.Drain(context.Background()); err != nil {
		t.Fatal(err)
	}
}

// checkAll compares every ready copy in the GPU and host tiers with the
// block's KV.
func (f *server) checkAll(t *testing.T) []string {
	t.Helper()
	var bad []string
	f.Range(func(b kvtier.BlockInfo) bool {
		if b.Ready[kvtier.GPU] && !bytes.Equal(f.readGPU(t, b.Slot[kvtier.GPU]), f.want[b.Key]) {
			bad = append(bad, "gpu copy of "+strconv.FormatUint(uint64(b.Key), 16))
		}
		if b.Ready[kvtier.Host] && !bytes.Equal(f.hostSlot(b.Slot[kvtier.Host])[:blockBytes], f.want[b.Key]) {
			bad = append(bad, "host copy of "+strconv.FormatUint(uint64(b.Key), 16))
		}
		return true
	})
	return bad
}

// publish looks tokens up on f and publishes what it holds; it returns
// the blocks queued once the queue has been written out.
func (f *server) publish(t *testing.T, tokens []int32) int {
	t.Helper()
	var l kvtier.Lease
	if err := f.Lookup(1, tokens, &l); err != nil {
		t.Fatal(err)
	}
	n, err := f.rt.Publish(1, tokens, &l)
	f.Release(&l)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := f.cache.Flush(ctx); err != nil {
		t.Fatal(err)
	}
	return n
}

// onboard looks tokens up on f, fetches from the remote tier, onboards
// and returns the GPU bytes of each block, by key.
func (f *server) onboard(t *testing.T, tokens []int32) (fetched int, gpu map[kvtier.Key][]byte, tiers []kvtier.Tier) {
	t.Helper()
	ctx := context.Background()
	var l kvtier.Lease
	if err := f.Lookup(1, tokens, &l); err != nil {
		t.Fatal(err)
	}
	defer f.Release(&l)
	fetched, err := f.rt.Fetch(ctx, 1, tokens, &l)
	if err != nil {
		t.Fatal(err)
	}
	if err := f.Plan(&l); err != nil {
		t.Fatal(err)
	}
	if err := f.Onboard(&l); err != nil {
		t.Fatal(err)
	}
	if err := f.Wait(ctx, &l); err != nil {
		t.Fatal(err)
	}
	gpu = map[kvtier.Key][]byte{}
	for _, b := range l.Blocks {
		tiers = append(tiers, b.Tier)
		switch {
		case b.Loading:
			gpu[b.Key] = f.readGPU(t, b.GPUSlot)
		case b.Tier == kvtier.GPU:
			gpu[b.Key] = f.readGPU(t, b.Slot)
		}
	}
	return fetched, gpu, tiers
}

// TestRemoteTierSharesAPrefix: two managers, as two servers would be, on
// one cluster. The first computes a prefix and publishes it; the second's
// lookup finds nothing, fetches the prefix from the remote tier into its
// host tier and onboards it, and its GPU holds the first one's bytes.
func TestRemoteTierSharesAPrefix(t *testing.T) {
	addrs := redistest.Shared(t)
	prefix := remotePrefix(t)
	a := newServer(t, addrs, prefix, policy.AlwaysAdmit[kvtier.Key]{})
	b := newServer(t, addrs, prefix, policy.AlwaysAdmit[kvtier.Key]{})
	tokens := a.request(4)
	if other := b.request(4); !slices.Equal(tokens, other) {
		t.Fatal("the fixtures' requests differ")
	}
	a.serve(t, tokens)
	if n := a.publish(t, tokens); n != 4 {
		t.Fatalf("published %d blocks, want 4", n)
	}
	if n := a.publish(t, tokens); n != 0 {
		t.Fatalf("published %d blocks again, want 0 (known to the remote)", n)
	}
	fetched, gpu, tiers := b.onboard(t, tokens)
	if fetched != 4 || len(gpu) != 4 {
		t.Fatalf("fetched %d blocks, %d on the GPU (tiers %v), want 4", fetched, len(gpu), tiers)
	}
	for _, tr := range tiers {
		if tr != kvtier.Host {
			t.Fatalf("after the fetch the blocks are in %v, want all in the host tier", tiers)
		}
	}
	for k, got := range gpu {
		if !bytes.Equal(got, a.want[k]) {
			t.Fatalf("block %#x: the second server's GPU holds other bytes than the first's", uint64(k))
		}
	}
	// The copies b now holds in every tier are the first server's bytes.
	b.want = a.want
	if bad := b.checkAll(t); len(bad) > 0 {
		t.Fatal(bad)
	}
	// A second fetch has nothing to do: every block is local now.
	if fetched, _, _ := b.onboard(t, tokens); fetched != 0 {
		t.Fatalf("a second fetch brought %d blocks", fetched)
	}
	if s := b.rt.Stats(); s.Fetched != 4 || s.FetchMisses != 0 {
		t.Fatalf("b: %+v", s)
	}
}

// TestRemoteTierSeenTwiceAndPartialFetch: with the default admission a
// block goes out on its second Publish; a fetch stops at the first block
// the remote lacks, and the rest is recomputed.
func TestRemoteTierSeenTwiceAndPartialFetch(t *testing.T) {
	addrs := redistest.Shared(t)
	prefix := remotePrefix(t)
	a := newServer(t, addrs, prefix, nil)
	b := newServer(t, addrs, prefix, nil)
	tokens := a.request(4)
	b.request(4)
	a.serve(t, tokens)
	if n := a.publish(t, tokens[:2*blockTokens]); n != 0 {
		t.Fatalf("first publish queued %d blocks, want 0 (seen once)", n)
	}
	if n := a.publish(t, tokens[:2*blockTokens]); n != 2 {
		t.Fatalf("second publish queued %d blocks, want 2", n)
	}
	if s := a.rt.Stats(); s.NotAdmitted != 2 || s.Published != 2 {
		t.Fatalf("a: %+v", s)
	}
	fetched, gpu, _ := b.onboard(t, tokens)
	if fetched != 2 || len(gpu) != 2 {
		t.Fatalf("fetched %d, onboarded %d, want the 2 published blocks", fetched, len(gpu))
	}
	for k, got := range gpu {
		if !bytes.Equal(got, a.want[k]) {
			t.Fatalf("block %#x differs", uint64(k))
		}
	}
	if s := b.rt.Stats(); s.FetchMisses != 2 {
		t.Fatalf("b: %+v, want 2 fetch misses", s)
	}
}

// TestForgedValueUnderKeyIsRefused: a deployment whose remote checksums
// are keyed fetches nothing a writer without its key put in its prefix
// (another deployment's key, or none), however well framed: the values
// are counted corrupt, deleted and logged at Warn, and the blocks are
// recomputed. Its own servers' blocks still come through.
func TestForgedValueUnderKeyIsRefused(t *testing.T) {
	addrs := redistest.Shared(t)
	key := []byte("the deployment's key, 32 bytes..")
	for name, forgerKey := range map[string][]byte{"unkeyed": nil, "another key": []byte("a forger's key of at least 16")} {
		t.Run(name, func(t *testing.T) {
			prefix := remotePrefix(t)
			var logs bytes.Buffer
			keyed := func(rc *remote.Config, tc *remotetier.Config) {
				rc.ChecksumKey = key
				tc.Logger = slog.New(slog.NewTextHandler(&logs, nil))
			}
			forger := newServerWith(t, addrs, prefix, policy.AlwaysAdmit[kvtier.Key]{}, func(rc *remote.Config, _ *remotetier.Config) { rc.ChecksumKey = forgerKey })
			forger.rng = rand.New(rand.NewPCG(66, 6)) // KV of its choosing
			a := newServerWith(t, addrs, prefix, policy.AlwaysAdmit[kvtier.Key]{}, keyed)
			b := newServerWith(t, addrs, prefix, policy.AlwaysAdmit[kvtier.Key]{}, keyed)
			tokens := forger.request(4)
			a.request(4)
			b.request(4)
			forger.serve(t, tokens)
			if n := forger.publish(t, tokens); n != 4 {
				t.Fatalf("the forger published %d blocks, want 4", n)
			}
			fetched, gpu, _ := b.onboard(t, tokens)
			if fetched != 0 || len(gpu) != 0 {
				t.Fatalf("the keyed server fetched %d forged blocks (%d on the GPU)", fetched, len(gpu))
			}
			if s := b.cache.Stats(); s.Corrupt != 4 || s.Hits != 0 {
				t.Fatalf("b's remote tier: %+v, want the 4 forged values counted corrupt", s)
			}
			if !strings.Contains(logs.String(), "level=WARN") || !strings.Contains(logs.String(), "did not verify") {
				t.Fatalf("no Warn line for the forged values; log:\n%s", logs.String())
			}
			// The forged values were deleted; the deployment's own blocks
			// come through.
			a.serve(t, tokens)
			if n := a.publish(t, tokens); n != 4 {
				t.Fatalf("a published %d blocks, want 4", n)
			}
			fetched, gpu, _ = b.onboard(t, tokens)
			if fetched != 4 {
				t.Fatalf("fetched %d of the deployment's blocks, want 4", fetched)
			}
			for k, got := range gpu {
				if !bytes.Equal(got, a.want[k]) || bytes.Equal(got, forger.want[k]) {
					t.Fatalf("block %#x: not the deployment's bytes", uint64(k))
				}
			}
		})
	}
}

// TestFetchFailuresWarn: a store that does not answer makes fetches miss
// and says so at Warn, one line per WarnEvery with the count since the
// last; an absent block says nothing.
func TestFetchFailuresWarn(t *testing.T) {
	f := &server{Stack: stacktest.Open(t, stacktest.Options{BlockTokens: blockTokens, WriteThrough: true}), want: map[kvtier.Key][]byte{}}
	var logs bytes.Buffer
	st := &downStore{}
	c, err := remote.New(remote.Config{Store: st, BlockBytes: blockBytes, BreakerFailures: 1000})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if f.rt, err = remotetier.New(f.Manager, remotetier.Config{Cache: c, HostSlot: f.hostSlot, Logger: slog.New(slog.NewTextHandler(&logs, nil))}); err != nil {
		t.Fatal(err)
	}
	clock := time.Unix(1000, 0)
	f.rt.SetWarnClock(func() time.Time { return clock })
	fetch := func() {
		var l kvtier.Lease
		tokens := f.request(2)
		if err := f.Lookup(1, tokens, &l); err != nil {
			t.Fatal(err)
		}
		defer f.Release(&l)
		if _, err := f.rt.Fetch(context.Background(), 1, tokens, &l); err != nil {
			t.Fatal(err)
		}
	}
	st.absent = true
	fetch()
	if logs.Len() != 0 {
		t.Fatalf("an absent block logged:\n%s", logs.String())
	}
	st.absent = false
	for range 3 {
		fetch()
	}
	if n := strings.Count(logs.String(), "level=WARN"); n != 1 || !strings.Contains(logs.String(), "does not answer") || !strings.Contains(logs.String(), "blocks=1 ") {
		t.Fatalf("3 failed fetches within WarnEvery: %d Warn lines, want 1, at the first block:\n%s", n, logs.String())
	}
	clock = clock.Add(remotetier.WarnEvery)
	fetch()
	if n := strings.Count(logs.String(), "level=WARN"); n != 2 || !strings.Contains(logs.String(), "blocks=6 ") {
		t.Fatalf("after WarnEvery: %d Warn lines, want a second one counting the 6 blocks since the first:\n%s", n, logs.String())
	}
}

// downStore fails every read, or finds nothing (absent).
type downStore struct {
	nopStore
	absent bool
}

func (s *downStore) Get(ctx context.Context, ops []remote.GetOp) {
	s.nopStore.Get(ctx, ops)
	if !s.absent {
		for i := range ops {
			ops[i].Err = errors.New("connection refused")
		}
	}
}

func TestRemoteTierBadInput(t *testing.T) {
	addrs := redistest.Shared(t)
	f := newServer(t, addrs, remotePrefix(t), nil)
	host := f.hostSlot
	for name, cfg := range map[string]remotetier.Config{
		"no cache":       {HostSlot: host},
		"no host slot":   {Cache: f.cache},
		"negative max":   {Cache: f.cache, HostSlot: host, MaxFetchBlocks: -1},
		"negative known": {Cache: f.cache, HostSlot: host, KnownBlocks: -1},
		"unknown codec":  {Cache: f.cache, HostSlot: host, Codec: 9},
	} {
		if _, err := remotetier.New(f.Manager, cfg); !errors.Is(err, kvtier.ErrConfig) {
			t.Errorf("%s: %v, want ErrConfig", name, err)
		}
	}
	big, err := remote.New(remote.Config{Store: nopStore{}, BlockBytes: 2 * blockBytes})
	if err != nil {
		t.Fatal(err)
	}
	defer big.Close()
	if _, err := remotetier.New(f.Manager, remotetier.Config{Cache: big, HostSlot: host}); !errors.Is(err, kvtier.ErrConfig) {
		t.Errorf("blocks larger than host slots: %v, want ErrConfig", err)
	}
	tokens := f.request(2)
	var l kvtier.Lease
	if _, err := f.rt.Fetch(context.Background(), 1, tokens, &l); !errors.Is(err, kvtier.ErrBadInput) {
		t.Errorf("Fetch without a lookup: %v", err)
	}
	if err := f.Lookup(1, tokens, &l); err != nil {
		t.Fatal(err)
	}
	defer f.Release(&l)
	if _, err := f.rt.Publish(1, tokens[:blockTokens], &l); !errors.Is(err, kvtier.ErrBadInput) {
		t.Errorf("Publish of other tokens than the lookup's: %v", err)
	}
}

// nopStore is a Store that holds nothing.
type nopStore struct{}

func (nopStore) Get(_ context.Context, ops []remote.GetOp) {
	for i := range ops {
		for k := range ops[i].Got {
			ops[i].Got[k] = -1
		}
	}
}
func (nopStore) Put(context.Context, []remote.PutOp)            {}
func (nopStore) Exists(context.Context, []string, []bool) error { return nil }
func (nopStore) Delete(context.Context, []string) error         { return nil }
func (nopStore) Close() error                                   { return nil }
