package kvtier

import (
	"errors"
	"strings"
	"testing"
	"time"
)

// pinRig is a 32-slot GPU tier on a clock the test moves.
func pinRig(t *testing.T) (*Manager, *time.Time) {
	now := time.Date(2026, 12, 1, 0, 0, 0, 0, time.UTC)
	m := mustNew(t, Config{BlockTokens: 4, Tiers: [NumTiers]TierConfig{GPU: tierCfg(t, 32)},
		Now: func() time.Time { return now }})
	return m, &now
}

// flood serves n unique 4-block prompts of salt 9 from base on.
func flood(t *testing.T, m *Manager, n int, base int32) {
	for i := range n {
		serve(t, m, 9, toks(4, 4, base+int32(i)*16))
		m.check(t)
	}
}

func cachedBlocks(t *testing.T, m *Manager, salt Salt, prompt []int32) int {
	t.Helper()
	var l Lease
	if err := m.Lookup(salt, prompt, &l); err != nil {
		t.Fatal(err)
	}
	defer m.Release(&l)
	return len(l.Blocks)
}

func TestPinnedPrefixSurvivesAFloodUntilItExpires(t *testing.T) {
	m, now := pinRig(t)
	sys := toks(4, 4, 0)
	serve(t, m, 1, sys)
	if n, err := m.Pin(1, sys, MaxPriority, now.Add(time.Minute)); n != 4 || err != nil {
		t.Fatalf("Pin = %d, %v; want 4 blocks", n, err)
	}
	flood(t, m, 40, 1<<20)
	if got := cachedBlocks(t, m, 1, sys); got != 4 || m.Pinned() != 4 {
		t.Fatalf("after a flood %d of 4 pinned blocks are cached, %d pinned", got, m.Pinned())
	}
	*now = now.Add(2 * time.Minute)
	flood(t, m, 40, 2<<20)
	if got := cachedBlocks(t, m, 1, sys); got != 0 || m.Pinned() != 0 {
		t.Errorf("after expiry and a flood %d blocks are cached, %d pinned; want the prefix gone", got, m.Pinned())
	}
}

func TestUnpinReleasesAPin(t *testing.T) {
	m, _ := pinRig(t)
	sys := toks(4, 4, 0)
	serve(t, m, 1, sys)
	if n, err := m.Pin(1, sys, MaxPriority, time.Time{}); n != 4 || err != nil {
		t.Fatalf("Pin = %d, %v", n, err)
	}
	if n, err := m.Unpin(1, sys[:8]); n != 2 || err != nil {
		t.Fatalf("Unpin of two blocks = %d, %v", n, err)
	}
	flood(t, m, 40, 1<<20)
	if got := cachedBlocks(t, m, 1, sys); got != 0 {
		t.Fatalf("the unpinned head was evicted, yet %d blocks are found", got)
	}
	if m.Pinned() != 2 {
		t.Errorf("%d pinned, want the 2 still pinned", m.Pinned())
	}
}

// TestPinsNeverRefuseABlock: a tier full of pinned blocks evicts them
// rather than fail.
func TestPinsNeverRefuseABlock(t *testing.T) {
	m, _ := pinRig(t)
	for i := range 8 {
		p := toks(4, 4, int32(i)*16)
		serve(t, m, 1, p)
		if _, err := m.Pin(1, p, MaxPriority, time.Time{}); err != nil {
			t.Fatal(err)
		}
	}
	if m.Pinned() != 32 {
		t.Fatalf("%d pinned, want all 32 slots", m.Pinned())
	}
	flood(t, m, 2, 1<<20)
	if got := cachedBlocks(t, m, 9, toks(4, 4, 1<<20+16)); got != 4 {
		t.Errorf("a new prompt in a tier full of pins: %d of 4 blocks cached", got)
	}
	// The first prompt took 4 pinned slots; the second, the first's
	// unpinned ones.
	if m.Pinned() != 28 {
		t.Errorf("%d pinned after 4 pinned blocks were evicted, want 28", m.Pinned())
	}
}

func TestPinBadInputChangesNothing(t *testing.T) {
	m, now := pinRig(t)
	sys := toks(4, 4, 0)
	serve(t, m, 1, sys)
	for _, until := range []time.Time{*now, now.Add(-time.Second)} {
		if _, err := m.Pin(1, sys, MaxPriority, until); !errors.Is(err, ErrBadInput) {
			t.Errorf("Pin until %v (now %v): %v, want ErrBadInput", until, *now, err)
		}
		if _, err := m.PinKeys(1, []Key{1}, MaxPriority, until); !errors.Is(err, ErrBadInput) {
			t.Errorf("PinKeys until %v: %v, want ErrBadInput", until, err)
		}
	}
	for _, p := range []int{-1, MaxPriority + 1, 1 << 20} {
		if _, err := m.Pin(1, sys, p, time.Time{}); !errors.Is(err, ErrBadInput) || !strings.Contains(err.Error(), "priority") {
			t.Errorf("Pin at priority %d: %v, want ErrBadInput naming the priority", p, err)
		}
		if _, err := m.PinKeys(1, []Key{1}, p, time.Time{}); !errors.Is(err, ErrBadInput) {
			t.Errorf("PinKeys at priority %d: %v, want ErrBadInput", p, err)
		}
	}
	if m.Pinned() != 0 {
		t.Errorf("%d pinned after refused pins", m.Pinned())
	}
	if n, err := m.UnpinKeys(1, nil); n != 0 || err != nil {
		t.Errorf("UnpinKeys of nothing = %d, %v", n, err)
	}
	m.check(t)
}

// TestPriorityOrdersEviction: a 32-slot tier holds 8 prompts of 4 blocks,
// two at each of priorities 10, 35 (unpinned), 50 and 80, the first 80 with
// a time limit; floods of new prompts, each pinned at MaxPriority once
// cached, take them lowest priority first and, within one, by the policy
// (oldest first). The limited 80 expires before the fifth flood: it is
// then at the default and goes before the 50s.
func TestPriorityOrdersEviction(t *testing.T) {
	m, now := pinRig(t)
	prios := []int{10, 10, DefaultPriority, DefaultPriority, 50, 50, 80, 80}
	prompts := make([][]int32, len(prios))
	for i, p := range prios {
		prompts[i] = toks(4, 4, int32(i)*100)
		serve(t, m, 1, prompts[i])
		until := time.Time{}
		if i == 6 {
			until = now.Add(time.Minute)
		}
		if p != DefaultPriority {
			if n, err := m.Pin(1, prompts[i], p, until); n != 4 || err != nil {
				t.Fatalf("Pin of prompt %d at %d = %d, %v", i, p, n, err)
			}
		}
	}
	if at := m.PinnedAt(); at[10] != 8 || at[50] != 8 || at[80] != 8 || at[DefaultPriority] != 0 || m.Pinned() != 24 {
		t.Fatalf("pinned at 10, 50, 80: %d, %d, %d; %d in all", at[10], at[50], at[80], m.Pinned())
	}
	gone := map[int]bool{}
	for f, victim := range []int{0, 1, 2, 3, 6, 4, 5, 7} {
		if f == 4 {
			*now = now.Add(2 * time.Minute) // prompt 6's pin ends
		}
		p := toks(4, 4, 1<<20+int32(f)*16)
		serve(t, m, 9, p)
		if _, err := m.Pin(9, p, MaxPriority, time.Time{}); err != nil {
			t.Fatal(err)
		}
		m.check(t)
		gone[victim] = true
		for i, pr := range prompts {
			want := 16
			if gone[i] {
				want = 0
			}
			c := m.CachedPrefix(1, pr)
			if got := c.CachedTokens(); got != want {
				t.Fatalf("flood %d: prompt %d (priority %d) has %d tokens cached, want %d", f, i, prios[i], got, want)
			}
		}
	}
}
