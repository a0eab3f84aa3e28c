package remotetier_test

import (
	"context"
	"sync"
	"testing"
	"time"

	"kvtier.dev/internal/redistest"
	"kvtier.dev/kvtier"
	"kvtier.dev/kvtier/policy"
	"kvtier.dev/kvtier/remote"
	"kvtier.dev/kvtier/remotetier"
)

// memStore is a remote.Store in memory: values by key, nothing evicted
// but what Delete removes.
type memStore struct {
	mu sync.Mutex
	m  map[string][]byte
}

func newMemStore() *memStore { return &memStore{m: map[string][]byte{}} }

func (s *memStore) Get(_ context.Context, ops []remote.GetOp) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for i := range ops {
		for k, key := range ops[i].Keys {
			v, ok := s.m[key]
			if !ok {
				ops[i].Got[k] = -1
				continue
			}
			ops[i].Got[k] = copy(ops[i].Dst[k], v)
			if len(v) > len(ops[i].Dst[k]) {
				ops[i].Got[k] = len(v)
			}
		}
	}
}

func (s *memStore) Put(_ context.Context, ops []remote.PutOp) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, op := range ops {
		for k, key := range op.Keys {
			s.m[key] = append([]byte(nil), op.Values[k]...)
		}
	}
}

func (s *memStore) Exists(_ context.Context, keys []string, found []bool) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	for i, k := range keys {
		_, found[i] = s.m[k]
	}
	return nil
}

func (s *memStore) Delete(_ context.Context, keys []string) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, k := range keys {
		delete(s.m, k)
	}
	return nil
}

func (s *memStore) Close() error { return nil }

// removals reads sub's events so far and returns the keys of the remote
// tier's BlockRemoved events among them.
func removals(t *testing.T, sub *kvtier.Subscription) []kvtier.Key {
	t.Helper()
	var keys []kvtier.Key
	for {
		ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
		evs, err := sub.Next(ctx)
		cancel()
		if err != nil || len(evs) == 0 {
			return keys
		}
		for _, e := range evs {
			if e.Kind == kvtier.BlockRemoved && e.Tier == kvtier.Remote {
				keys = append(keys, e.Key)
			}
		}
	}
}

// testRemovalsAnnounced: a server publishes a prefix, loses its local
// copies, and the remote loses the prefix's second block. Its fetch then
// announces that block removed from the remote tier, once, with its
// parent and salt; the first block, fetched, is not. A second server that
// never held the block announces nothing for the same miss. addrs nil: a
// store in memory.
func testRemovalsAnnounced(t *testing.T, addrs []string) {
	prefix := remotePrefix(t)
	a := newServer(t, addrs, prefix, policy.AlwaysAdmit[kvtier.Key]{})
	b := newServer(t, addrs, prefix, policy.AlwaysAdmit[kvtier.Key]{})
	tokens := a.request(2)
	b.request(2)
	a.serve(t, tokens)
	if n := a.publish(t, tokens); n != 2 {
		t.Fatalf("published %d blocks, want 2", n)
	}
	h, err := kvtier.NewHasher(blockTokens)
	if err != nil {
		t.Fatal(err)
	}
	keys := h.AppendKeys(nil, 1, 0, tokens)
	if _, err := a.Invalidate(1, tokens); err != nil {
		t.Fatal(err)
	}
	if err := a.cache.Delete(context.Background(), uint64(keys[1])); err != nil {
		t.Fatal(err)
	}
	subA, err := a.Subscribe(0)
	if err != nil {
		t.Fatal(err)
	}
	defer subA.Close()
	removals(t, subA) // what came before
	if fetched, _, _ := a.onboard(t, tokens); fetched != 1 {
		t.Fatalf("fetched %d blocks, want the first only", fetched)
	}
	if got := removals(t, subA); len(got) != 1 || got[0] != keys[1] {
		t.Fatalf("removals announced %#x, want the second block %#x alone", got, keys[1])
	}
	if s := a.rt.Stats(); s.Removed != 1 || s.FetchMisses != 1 {
		t.Fatalf("a: %+v, want 1 removed of 1 miss", s)
	}
	// Announced once: the block left the known set.
	if _, err := a.Invalidate(1, tokens); err != nil {
		t.Fatal(err)
	}
	a.onboard(t, tokens)
	if got := removals(t, subA); len(got) != 0 {
		t.Fatalf("the second miss announced %#x again", got)
	}
	subB, err := b.Subscribe(0)
	if err != nil {
		t.Fatal(err)
	}
	defer subB.Close()
	b.onboard(t, tokens)
	if got := removals(t, subB); len(got) != 0 || b.rt.Stats().Removed != 0 {
		t.Fatalf("a server that never held the block announced %#x removed", got)
	}
}

func TestRemovalsAnnouncedMem(t *testing.T) { testRemovalsAnnounced(t, nil) }

func TestRemovalsAnnouncedRedis(t *testing.T) { testRemovalsAnnounced(t, redistest.Shared(t)) }

// TestAgedOutAnnounced: a block that leaves the set of blocks this server
// knows the remote holds is announced removed from the remote tier, once:
// pushed out by the set's capacity (KnownBlocks), or once the store's TTL
// has passed since it was written (announced by the first Publish or
// Fetch after that, at most a second late).
func TestAgedOutAnnounced(t *testing.T) {
	now := time.Date(2026, 12, 4, 0, 0, 0, 0, time.UTC)
	a := newServerWith(t, nil, remotePrefix(t), policy.AlwaysAdmit[kvtier.Key]{}, func(rc *remote.Config, tc *remotetier.Config) {
		rc.TTL = time.Minute
		tc.KnownBlocks = 3
		tc.Now = func() time.Time { return now }
	})
	sub, err := a.Subscribe(0)
	if err != nil {
		t.Fatal(err)
	}
	defer sub.Close()
	h, err := kvtier.NewHasher(blockTokens)
	if err != nil {
		t.Fatal(err)
	}
	first, second := a.request(2), a.request(2)
	k1, k2 := h.AppendKeys(nil, 1, 0, first), h.AppendKeys(nil, 1, 0, second)
	a.serve(t, first)
	if n := a.publish(t, first); n != 2 {
		t.Fatalf("published %d blocks, want 2", n)
	}
	removals(t, sub)
	now = now.Add(30 * time.Second)
	a.serve(t, second)
	if n := a.publish(t, second); n != 2 {
		t.Fatalf("published %d blocks, want 2", n)
	}
	if got := removals(t, sub); len(got) != 1 || got[0] != k1[0] {
		t.Fatalf("a fourth block in a set of 3 announced %#x removed, want the oldest, %#x", got, k1[0])
	}
	now = now.Add(31 * time.Second) // the first prompt's TTL has passed, not the second's
	a.publish(t, second)
	if got := removals(t, sub); len(got) != 1 || got[0] != k1[1] {
		t.Fatalf("past the first prompt's TTL %#x announced removed, want its second block %#x alone", got, k1[1])
	}
	now = now.Add(500 * time.Millisecond) // a sweep a second at most
	a.publish(t, second)
	if got := removals(t, sub); len(got) != 0 {
		t.Fatalf("a sweep within a second of the last announced %#x", got)
	}
	now = now.Add(30 * time.Second)
	// Gone from the set, the blocks are published again by the Publish
	// whose sweep announced them gone.
	if n := a.publish(t, second); n != 2 {
		t.Errorf("published %d blocks after their TTL, want 2 again", n)
	}
	if got := removals(t, sub); len(got) != 2 || got[0] != k2[0] || got[1] != k2[1] {
		t.Fatalf("past the second prompt's TTL %#x announced removed, want %#x", got, k2)
	}
	if s := a.rt.Stats(); s.Removed != 4 {
		t.Errorf("Stats.Removed %d, want 4", s.Removed)
	}
}

// TestInvalidateDeletesRemoteCopies: a prefix published to the remote tier
// and invalidated there is fetched by no server afterwards, and its known
// blocks are announced removed once.
func TestInvalidateDeletesRemoteCopies(t *testing.T) {
	prefix := remotePrefix(t)
	a := newServer(t, nil, prefix, policy.AlwaysAdmit[kvtier.Key]{})
	tokens := a.request(3)
	a.serve(t, tokens)
	if n := a.publish(t, tokens); n != 3 {
		t.Fatalf("published %d blocks, want 3", n)
	}
	h, err := kvtier.NewHasher(blockTokens)
	if err != nil {
		t.Fatal(err)
	}
	keys := h.AppendKeys(nil, 1, 0, tokens)
	if _, err := a.Invalidate(1, tokens); err != nil { // the local copies
		t.Fatal(err)
	}
	sub, err := a.Subscribe(0)
	if err != nil {
		t.Fatal(err)
	}
	defer sub.Close()
	removals(t, sub)
	if n, err := a.rt.Invalidate(context.Background(), keys); n != 3 || err != nil {
		t.Fatalf("Invalidate = %d, %v; want 3 blocks", n, err)
	}
	if got := removals(t, sub); len(got) != 3 {
		t.Errorf("announced %#x removed, want the 3 blocks", got)
	}
	if fetched, _, _ := a.onboard(t, tokens); fetched != 0 {
		t.Errorf("fetched %d blocks after they were invalidated, want 0", fetched)
	}
}

// TestInvalidateSaltDeletesKnownBlocks: a tenant's invalidation deletes
// from the remote tier the blocks of its salt this server published, and
// no other salt's.
func TestInvalidateSaltDeletesKnownBlocks(t *testing.T) {
	a := newServer(t, nil, remotePrefix(t), policy.AlwaysAdmit[kvtier.Key]{})
	tokens := a.request(3)
	a.serve(t, tokens)
	if n := a.publish(t, tokens); n != 3 {
		t.Fatalf("published %d blocks, want 3", n)
	}
	if n, err := a.rt.InvalidateSalt(context.Background(), 2); n != 0 || err != nil {
		t.Fatalf("InvalidateSalt of another salt = %d, %v; want 0", n, err)
	}
	if n, err := a.rt.InvalidateSalt(context.Background(), 1); n != 3 || err != nil {
		t.Fatalf("InvalidateSalt = %d, %v; want the 3 blocks", n, err)
	}
	if _, err := a.Invalidate(1, tokens); err != nil {
		t.Fatal(err)
	}
	if fetched, _, _ := a.onboard(t, tokens); fetched != 0 {
		t.Errorf("fetched %d blocks after the tenant's invalidation, want 0", fetched)
	}
}
