package kvtier

import (
	"context"
	"errors"
	"math/rand/v2"
	"strings"
	"sync"
	"testing"
	"time"

	"kvtier.dev/kvtier/policy"
)

func lruFactory(n int) (policy.Policy[BlockRef], error) { return policy.NewDenseLRU[BlockRef](n) }

// tenantTier is tierCfg with the LRU factory tenants need.
func tenantTier(t testing.TB, n int) TierConfig {
	tc := tierCfg(t, n)
	tc.NewPolicy = lruFactory
	return tc
}

// serve is one request: a lookup of prompt, then an insert of what missed
// (of what finds room).
// It returns the blocks the lookup found.
func serve(t testing.TB, m *Manager, salt Salt, prompt []int32) int {
	t.Helper()
	var l, w Lease
	if err := m.Lookup(salt, prompt, &l); err != nil {
		t.Fatal(err)
	}
	hit := len(l.Blocks)
	m.Release(&l)
	if hit*m.BlockTokens() == len(prompt) {
		return hit
	}
	// Write-back: a tier full of blocks to demote refuses until they are.
	if err := m.Insert(salt, prompt, GPU, &w); err != nil && !errors.Is(err, ErrNoSpace) {
		t.Fatal(err)
	}
	if err := m.Commit(&w, nil); err != nil {
		t.Fatal(err)
	}
	m.Release(&w)
	return hit
}

const (
	quietSalt Salt = 7
	floodSalt Salt = 9
)

// quietHitRatio runs the quiet tenant's working set (4 prompts of 4 blocks,
// in turn) for 200 requests, each followed by flood unique prompts of 4
// blocks from another tenant, on a 64-slot GPU tier, and returns the quiet
// tenant's hit ratio.
func quietHitRatio(t *testing.T, flood int, tenants []TenantLimit) float64 {
	const bt, prompts, rounds = 4, 4, 200
	m := mustNew(t, Config{BlockTokens: bt, Tiers: [NumTiers]TierConfig{GPU: tenantTier(t, 64)}, Tenants: tenants})
	hits, asked := 0, 0
	next := int32(1 << 20)
	for i := range rounds {
		hits += serve(t, m, quietSalt, toks(4, bt, int32(i%prompts)*1000))
		asked += 4
		for range flood {
			serve(t, m, floodSalt, toks(4, bt, next))
			next += 4 * bt
		}
		m.check(t)
	}
	if tenants != nil {
		for _, tm := range m.TenantMetrics() {
			if tm.Salt == quietSalt && tm.HitBlocks != uint64(hits) {
				t.Errorf("TenantMetrics: %d hit blocks, the lookups found %d", tm.HitBlocks, hits)
			}
		}
	}
	return float64(hits) / float64(asked)
}

func TestTenantQuotaKeepsTheQuietTenantsHits(t *testing.T) {
	solo := quietHitRatio(t, 0, nil)
	shared := quietHitRatio(t, 8, nil)
	weighted := quietHitRatio(t, 8, []TenantLimit{{Salt: quietSalt, Weight: 1}})
	capped := quietHitRatio(t, 8, []TenantLimit{{Salt: floodSalt, Slots: [NumTiers]int{GPU: 32}, Weight: 1}})
	t.Logf("quiet tenant's hit ratio: solo %.3f, flooded %.3f, with a weight %.3f, flooder capped %.3f", solo, shared, weighted, capped)
	if solo < 0.9 {
		t.Fatalf("solo hit ratio %.3f: the working set should fit", solo)
	}
	if shared > solo/2 {
		t.Errorf("without quotas the flood left a hit ratio of %.3f (solo %.3f): want a collapse", shared, solo)
	}
	for name, r := range map[string]float64{"weight": weighted, "cap": capped} {
		if r < solo*0.95 {
			t.Errorf("with a %s the quiet tenant's hit ratio is %.3f, more than 5%% below solo %.3f", name, r, solo)
		}
	}
}

// TestTenantCapsHoldAcrossTiers floods two tiers (write-back demotions)
// with a capped tenant and an uncapped one: the invariant walk after every
// request fails if a cap is exceeded or a group miscounted.
func TestTenantCapsHoldAcrossTiers(t *testing.T) {
	fm := newFakeMover()
	fm.inline = true
	m := mustNew(t, Config{BlockTokens: 4, Mover: fm,
		Tiers: [NumTiers]TierConfig{GPU: tenantTier(t, 16), Host: tenantTier(t, 48)},
		Tenants: []TenantLimit{{Name: "a", Salt: floodSalt, Slots: [NumTiers]int{GPU: 6, Host: 10}, Weight: 1},
			{Name: "b", Salt: quietSalt, Weight: 2}}})
	var most [NumTiers]int64
	for i := range 300 {
		salt := []Salt{floodSalt, quietSalt, 3}[i%3]
		serve(t, m, salt, toks(3, 4, int32(i)*100))
		m.check(t)
		for _, tm := range m.TenantMetrics() {
			if tm.Name == "a" {
				for tier := range NumTiers {
					most[tier] = max(most[tier], tm.Tiers[tier].ResidentBlocks)
				}
			}
		}
	}
	if most[GPU] != 6 || most[Host] != 10 {
		t.Errorf("tenant a held at most %d gpu and %d host slots, want its caps 6 and 10 reached", most[GPU], most[Host])
	}
	tms := m.TenantMetrics()
	if len(tms) != 3 || tms[0].Name != "a" || tms[1].Name != "b" || tms[2].Name != DefaultTenant {
		t.Fatalf("TenantMetrics names: %+v", tms)
	}
	a := tms[0]
	if a.Tiers[GPU].Evictions == 0 || a.Tiers[Host].BytesIn == 0 || a.Tiers[GPU].BytesOut == 0 || a.Lookups != 100 {
		t.Errorf("tenant a's counters: %+v", a)
	}
}

func TestTenantCapRefusesWhenNothingOfItsOwnIsEvictable(t *testing.T) {
	m := mustNew(t, Config{BlockTokens: 4, Tiers: [NumTiers]TierConfig{GPU: tenantTier(t, 16)},
		Tenants: []TenantLimit{{Salt: floodSalt, Slots: [NumTiers]int{GPU: 2}, Weight: 1}}})
	var held, w Lease
	if err := m.Insert(floodSalt, toks(2, 4, 0), GPU, &held); err != nil {
		t.Fatal(err)
	}
	if err := m.Insert(floodSalt, toks(1, 4, 500), GPU, &w); !errors.Is(err, ErrNoSpace) {
		t.Errorf("a third block over a cap of 2 held by a lease: %v, want ErrNoSpace", err)
	}
	m.Release(&w)
	if err := m.Commit(&held, nil); err != nil {
		t.Fatal(err)
	}
	m.Release(&held)
	m.check(t)
}

func TestTenantConfigErrors(t *testing.T) {
	good := func() Config {
		return Config{BlockTokens: 4, Tiers: [NumTiers]TierConfig{GPU: tenantTier(t, 8)},
			Tenants: []TenantLimit{{Salt: 1, Weight: 1}, {Salt: 2, Slots: [NumTiers]int{GPU: 8}, Weight: 2}}}
	}
	same := newLRU(t, 8)
	cases := []struct {
		field string
		edit  func(*Config)
	}{
		{"Tenants[1].Salt", func(c *Config) { c.Tenants[1].Salt = 1 }},
		{"Tenants[1].Slots[gpu]", func(c *Config) { c.Tenants[1].Slots[GPU] = -1 }},
		{"Tenants[1].Slots[gpu]", func(c *Config) { c.Tenants[1].Slots[GPU] = 9 }},
		{"Tenants[0].Slots[host]", func(c *Config) { c.Tenants[0].Slots[Host] = 1 }},
		{"Tenants[0].Weight", func(c *Config) { c.Tenants[0].Weight = 0 }},
		{"Tenants[1].Weight", func(c *Config) { c.Tenants[1].Weight = -2 }},
		{"Tenants[0].Name", func(c *Config) { c.Tenants[0].Name = DefaultTenant }},
		{"Tenants[1].Name", func(c *Config) { c.Tenants[0].Name, c.Tenants[1].Name = "x", "x" }},
		{"Tiers[gpu].NewPolicy", func(c *Config) { c.Tiers[GPU].NewPolicy = nil }},
		{"Tiers[gpu].NewPolicy", func(c *Config) {
			c.Tiers[GPU].NewPolicy = func(int) (policy.Policy[BlockRef], error) { return nil, errors.New("no room") }
		}},
		{"Tiers[gpu].NewPolicy", func(c *Config) {
			c.Tiers[GPU].NewPolicy = func(int) (policy.Policy[BlockRef], error) { return same, nil }
		}},
		{"Tiers[host].CapacityBytes", func(c *Config) { c.Tiers[Host].NewPolicy = lruFactory }},
	}
	for _, tc := range cases {
		cfg := good()
		tc.edit(&cfg)
		_, err := New(cfg)
		if !errors.Is(err, ErrConfig) {
			t.Errorf("%s: err = %v, want ErrConfig", tc.field, err)
			continue
		}
		if !strings.Contains(err.Error(), tc.field+":") {
			t.Errorf("error %q does not name %s", err, tc.field)
		}
	}
	if _, err := New(good()); err != nil {
		t.Fatalf("good config: %v", err)
	}
}

// TestTenantsAndPinsConcurrent runs inserts, lookups, evictions, pins and
// invalidations of three salts (two of them capped tenants) from four
// goroutines over three write-back tiers; the invariant walk (sampled
// under the invariants tag, and at the end) checks the caps, the groups'
// counts and the pins.
func TestTenantsAndPinsConcurrent(t *testing.T) {
	fm := newFakeMover()
	fm.inline = true
	now := time.Unix(0, 0)
	var clock sync.Mutex
	cfg := Config{BlockTokens: 4, Mover: fm, Now: func() time.Time { clock.Lock(); defer clock.Unlock(); return now },
		Tenants: []TenantLimit{{Salt: 1, Slots: [NumTiers]int{GPU: 8, Host: 16, NVMe: 64}, Weight: 1}, {Salt: 2, Slots: [NumTiers]int{GPU: 12}, Weight: 3}}}
	cfg.Tiers[GPU], cfg.Tiers[Host], cfg.Tiers[NVMe] = tenantTier(t, 32), tenantTier(t, 64), tenantTier(t, 256)
	m := mustNew(t, cfg)
	ctx := context.Background()
	var wg sync.WaitGroup
	for g := range 4 {
		wg.Go(func() {
			rng := rand.New(rand.NewPCG(uint64(g), 11))
			var l Lease
			for range 300 {
				salt := Salt(1 + rng.IntN(3))
				p := toks(1+rng.IntN(4), 4, int32(16*rng.IntN(12)))
				switch rng.IntN(7) {
				case 0, 1:
					if err := m.Insert(salt, p, GPU, &l); err == nil || errors.Is(err, ErrNoSpace) {
						_ = m.Commit(&l, nil)
					}
					m.Release(&l)
				case 2:
					if _, err := m.Evict(ctx, salt, p, Tier(1+rng.IntN(2))); err != nil && !errors.Is(err, ErrNoSpace) {
						t.Error(err)
					}
				case 3:
					clock.Lock()
					now = now.Add(time.Second)
					until := now.Add(time.Duration(rng.IntN(5)) * time.Second)
					clock.Unlock()
					if _, err := m.Pin(salt, p, rng.IntN(MaxPriority+1), until); err != nil && !errors.Is(err, ErrBadInput) {
						t.Error(err)
					}
				case 4:
					if rng.IntN(4) == 0 {
						_, _ = m.Invalidate(salt, p)
					} else {
						_, _ = m.Unpin(salt, p)
					}
				default:
					if err := m.Lookup(salt, p, &l); err != nil {
						t.Error(err)
					}
					m.Release(&l)
				}
			}
		})
	}
	wg.Wait()
	if err := m.Drain(ctx); err != nil {
		t.Fatal(err)
	}
	m.check(t)
	if tm := m.TenantMetrics(); tm[0].Lookups == 0 || tm[1].Lookups == 0 || tm[2].Lookups == 0 {
		t.Errorf("some tenant counted no lookup: %+v", tm)
	}
}

// BenchmarkInsertEvictTenants is BenchmarkInsertEvict with Config.Tenants:
// 16-token blocks into a full tier of 64Ki slots, reported per block.
//
//   - capped: the inserting tenant is at its cap (half the tier) and
//     evicts its own blocks.
//   - shared: three tenants and the default group insert in turn, no cap:
//     each victim comes from the group most over its weighted share.
func BenchmarkInsertEvictTenants(b *testing.B) {
	const slots = 1 << 16
	for _, bc := range []struct {
		name    string
		tenants []TenantLimit
		salts   []Salt
	}{
		{"capped", []TenantLimit{{Salt: 3, Slots: [NumTiers]int{GPU: slots / 2}, Weight: 1}}, []Salt{3}},
		{"shared", []TenantLimit{{Salt: 3, Weight: 1}, {Salt: 4, Weight: 2}, {Salt: 5, Weight: 1}}, []Salt{3, 4, 5, 6}},
	} {
		b.Run(bc.name, func(b *testing.B) {
			tc := tenantTier(b, slots)
			tc.SlotBytes, tc.CapacityBytes = 1, slots
			m := mustNew(b, Config{BlockTokens: 16, Tiers: [NumTiers]TierConfig{GPU: tc}, Tenants: bc.tenants})
			rng := rand.New(rand.NewPCG(2, 2))
			req := make([]int32, 16*16)
			var l Lease
			fill := func(i int) {
				for j := range req {
					req[j] = rng.Int32N(128000)
				}
				if err := m.Insert(bc.salts[i%len(bc.salts)], req, GPU, &l); err != nil || l.Len() != 16 {
					b.Fatalf("%d inserted, %v", l.Len(), err)
				}
				if err := m.Commit(&l, nil); err != nil {
					b.Fatal(err)
				}
				m.Release(&l)
			}
			for i := range 2 * slots / 16 { // full, and the slabs grown
				fill(i)
			}
			b.ReportAllocs()
			b.ResetTimer()
			for i := 0; i < b.N; i += 16 {
				fill(i / 16)
			}
			if ev := m.Metrics().Tiers[GPU].Evictions; ev == 0 && b.N > 16 {
				b.Fatal("no evictions")
			}
		})
	}
}
