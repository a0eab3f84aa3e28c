package kvtier

import (
	"bytes"
	"context"
	"errors"
	"math/rand/v2"
	"os"
	"strconv"
	"testing"
	"time"

	"kvtier.dev/internal/redistest"
	"kvtier.dev/kvtier/policy"
	"kvtier.dev/kvtier/remote"
)

// TestMain stops the Redis Cluster redistest.Shared may start.
func TestMain(m *testing.M) { os.Exit(redistest.RunMain(m)) }

// remoteFixture is a server: a device fixture (GPU, host pool, mover,
// manager) with a remote tier on the shared test cluster.
type remoteFixture struct {
	*devFixture
	cache *remote.Cache
	rt    *RemoteTier
}

func newRemoteFixture(t *testing.T, addrs []string, prefix string, adm policy.Admitter[Key]) *remoteFixture {
	t.Helper()
	f := &remoteFixture{devFixture: newDevFixture(t, devOpts{gpu: 8, host: 8, writeThrough: true})}
	st, err := remote.NewRedis(remote.RedisConfig{Addrs: addrs})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	if f.cache, err = remote.New(remote.Config{Store: st, Prefix: prefix, BlockBytes: dmBlockBytes, PartBytes: 1024, OpTimeout: 10 * time.Second}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { f.cache.Close() })
	if f.rt, err = NewRemoteTier(f.m, RemoteTierConfig{Cache: f.cache, HostSlot: func(s Slot) []byte { return f.host.Slot(int32(s)) }, Admitter: adm}); err != nil {
		t.Fatal(err)
	}
	return f
}

func remotePrefix(t *testing.T) string {
	return "kvt-test:" + t.Name() + ":" + strconv.FormatUint(rand.Uint64(), 36) + ":"
}

// serve runs a request's prefill on f and drains its write-through copies.
func (f *remoteFixture) serve(t *testing.T, tokens []int32) {
	t.Helper()
	var w Lease
	f.prefill(t, tokens, &w)
	f.m.Release(&w)
	if err := f.m.Drain(context.Background()); err != nil {
		t.Fatal(err)
	}
}

// publish looks tokens up on f and publishes what it holds; it returns
// the blocks queued once the queue has been written out.
func (f *remoteFixture) publish(t *testing.T, tokens []int32) int {
	t.Helper()
	var l Lease
	if err := f.m.Lookup(1, tokens, &l); err != nil {
		t.Fatal(err)
	}
	n, err := f.rt.Publish(1, tokens, &l)
	f.m.Release(&l)
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
func (f *remoteFixture) onboard(t *testing.T, tokens []int32) (fetched int, gpu map[Key][]byte, tiers []Tier) {
	t.Helper()
	ctx := context.Background()
	var l Lease
	if err := f.m.Lookup(1, tokens, &l); err != nil {
		t.Fatal(err)
	}
	defer f.m.Release(&l)
	fetched, err := f.rt.Fetch(ctx, 1, tokens, &l)
	if err != nil {
		t.Fatal(err)
	}
	if err := f.m.Plan(&l); err != nil {
		t.Fatal(err)
	}
	if err := f.m.Onboard(&l); err != nil {
		t.Fatal(err)
	}
	if err := f.m.Wait(ctx, &l); err != nil {
		t.Fatal(err)
	}
	gpu = map[Key][]byte{}
	for _, b := range l.Blocks {
		tiers = append(tiers, b.Tier)
		switch {
		case b.Loading:
			gpu[b.Key] = f.readGPU(t, b.GPUSlot)
		case b.Tier == GPU:
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
	a := newRemoteFixture(t, addrs, prefix, policy.AlwaysAdmit[Key]{})
	b := newRemoteFixture(t, addrs, prefix, policy.AlwaysAdmit[Key]{})
	tokens := a.request(4)
	if other := b.request(4); !slicesEqual(tokens, other) {
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
		if tr != Host {
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

func slicesEqual(a, b []int32) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}

// TestRemoteTierSeenTwiceAndPartialFetch: with the default admission a
// block goes out on its second Publish; a fetch stops at the first block
// the remote lacks, and the rest is recomputed.
func TestRemoteTierSeenTwiceAndPartialFetch(t *testing.T) {
	addrs := redistest.Shared(t)
	prefix := remotePrefix(t)
	a := newRemoteFixture(t, addrs, prefix, nil)
	b := newRemoteFixture(t, addrs, prefix, nil)
	tokens := a.request(4)
	b.request(4)
	a.serve(t, tokens)
	if n := a.publish(t, tokens[:2*dmTokens]); n != 0 {
		t.Fatalf("first publish queued %d blocks, want 0 (seen once)", n)
	}
	if n := a.publish(t, tokens[:2*dmTokens]); n != 2 {
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

func TestRemoteTierBadInput(t *testing.T) {
	addrs := redistest.Shared(t)
	f := newRemoteFixture(t, addrs, remotePrefix(t), nil)
	host := func(s Slot) []byte { return f.host.Slot(int32(s)) }
	for name, cfg := range map[string]RemoteTierConfig{
		"no cache":       {HostSlot: host},
		"no host slot":   {Cache: f.cache},
		"negative max":   {Cache: f.cache, HostSlot: host, MaxFetchBlocks: -1},
		"negative known": {Cache: f.cache, HostSlot: host, KnownBlocks: -1},
	} {
		if _, err := NewRemoteTier(f.m, cfg); !errors.Is(err, ErrConfig) {
			t.Errorf("%s: %v, want ErrConfig", name, err)
		}
	}
	big, err := remote.New(remote.Config{Store: nopStore{}, BlockBytes: 2 * dmBlockBytes})
	if err != nil {
		t.Fatal(err)
	}
	defer big.Close()
	if _, err := NewRemoteTier(f.m, RemoteTierConfig{Cache: big, HostSlot: host}); !errors.Is(err, ErrConfig) {
		t.Errorf("blocks larger than host slots: %v, want ErrConfig", err)
	}
	tokens := f.request(2)
	var l Lease
	if _, err := f.rt.Fetch(context.Background(), 1, tokens, &l); !errors.Is(err, ErrBadInput) {
		t.Errorf("Fetch without a lookup: %v", err)
	}
	if err := f.m.Lookup(1, tokens, &l); err != nil {
		t.Fatal(err)
	}
	defer f.m.Release(&l)
	if _, err := f.rt.Publish(1, tokens[:dmTokens], &l); !errors.Is(err, ErrBadInput) {
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

// TestInsertSetsPosition: Block.Position is the block's index in the
// request after Insert too (the remote tier's fetch fills host slots by it).
func TestInsertSetsPosition(t *testing.T) {
	f := newDevFixture(t, devOpts{gpu: 8, host: 8})
	tokens := f.request(3)
	var w Lease
	f.prefill(t, tokens, &w) // blocks 0-2 written
	f.m.Release(&w)
	more := append(append([]int32{}, tokens...), f.request(2)...)
	if err := f.m.Insert(1, more, GPU, &w); err != nil {
		t.Fatal(err)
	}
	defer f.m.Release(&w)
	defer f.m.Commit(&w, errors.New("not written"))
	for i, b := range w.Blocks {
		if b.Position != i || b.Write != (i >= 3) {
			t.Fatalf("block %d: Position %d, Write %v", i, b.Position, b.Write)
		}
	}
}
