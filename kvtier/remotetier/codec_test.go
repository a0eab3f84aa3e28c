package remotetier_test

import (
	"bytes"
	"testing"

	"kvtier.dev/kvtier"
	"kvtier.dev/kvtier/codec"
	"kvtier.dev/kvtier/policy"
	"kvtier.dev/kvtier/remote"
	"kvtier.dev/kvtier/remotetier"
)

// TestCodecPassesThrough: three servers share one store; the first
// publishes in FP8E4M3PerHead (its Config.Codec). A server of the same
// codec fetches its blocks; one of codec None fetches none of them: each
// is a corrupt miss, deleted, and announced removed.
func TestCodecPassesThrough(t *testing.T) {
	st := newMemStore()
	prefix := remotePrefix(t)
	withCodec := func(c codec.Codec) func(*remote.Config, *remotetier.Config) {
		return func(rc *remote.Config, tc *remotetier.Config) { rc.Store, tc.Codec = st, c }
	}
	a := newServerWith(t, nil, prefix, policy.AlwaysAdmit[kvtier.Key]{}, withCodec(codec.FP8E4M3PerHead))
	same := newServerWith(t, nil, prefix, policy.AlwaysAdmit[kvtier.Key]{}, withCodec(codec.FP8E4M3PerHead))
	plain := newServerWith(t, nil, prefix, policy.AlwaysAdmit[kvtier.Key]{}, withCodec(codec.None))
	tokens := a.request(4)
	same.request(4)
	plain.request(4)
	a.serve(t, tokens)
	if n := a.publish(t, tokens); n != 4 {
		t.Fatalf("published %d blocks, want 4", n)
	}
	fetched, gpu, _ := same.onboard(t, tokens)
	if fetched != 4 || len(gpu) != 4 {
		t.Fatalf("a server of the same codec fetched %d blocks (%d on the GPU), want 4", fetched, len(gpu))
	}
	for k, got := range gpu {
		if !bytes.Equal(got, a.want[k]) {
			t.Fatalf("block %#x: other bytes than the publisher's", uint64(k))
		}
	}
	fetched, gpu, _ = plain.onboard(t, tokens)
	if fetched != 0 || len(gpu) != 0 {
		t.Fatalf("a server of codec None fetched %d blocks published in FP8 (%d on the GPU)", fetched, len(gpu))
	}
	if s := plain.cache.Stats(); s.Corrupt != 4 || s.Hits != 0 {
		t.Fatalf("codec None's remote tier: %+v, want the 4 FP8 values counted corrupt", s)
	}
	if s := plain.rt.Stats(); s.FetchMisses != 4 || s.Removed != 4 {
		t.Fatalf("codec None's tier: %+v, want 4 misses announced removed", s)
	}
	// Deleted: the FP8 server now misses them too (absent, not corrupt).
	same2 := newServerWith(t, nil, prefix, policy.AlwaysAdmit[kvtier.Key]{}, withCodec(codec.FP8E4M3PerHead))
	same2.request(4)
	if fetched, _, _ := same2.onboard(t, tokens); fetched != 0 || same2.cache.Stats().Absent != 4 {
		t.Fatalf("after the deletes: fetched %d, %+v", fetched, same2.cache.Stats())
	}
}
