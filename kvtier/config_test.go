package kvtier

import (
	"errors"
	"strings"
	"testing"
)

func TestConfigErrorsNameTheField(t *testing.T) {
	good := func() Config {
		return Config{BlockTokens: 16, Tiers: [NumTiers]TierConfig{GPU: tierCfg(t, 4)}}
	}
	lru := newLRU(t, 4)
	cases := []struct {
		field string
		edit  func(*Config)
	}{
		{"BlockTokens", func(c *Config) { c.BlockTokens = 0 }},
		{"BlockTokens", func(c *Config) { c.BlockTokens = MaxBlockTokens + 1 }},
		{"Tiers[gpu].CapacityBytes", func(c *Config) { c.Tiers[GPU].CapacityBytes = -1 }},
		{"Tiers[host].CapacityBytes", func(c *Config) { c.Tiers[Host].SlotBytes = 5 }},
		{"Tiers[gpu].SlotBytes", func(c *Config) { c.Tiers[GPU].SlotBytes = 0 }},
		{"Tiers[gpu].CapacityBytes", func(c *Config) { c.Tiers[GPU].CapacityBytes = 100 }},
		{"Tiers[gpu].CapacityBytes", func(c *Config) { c.Tiers[GPU].CapacityBytes = 1 << 50; c.Tiers[GPU].SlotBytes = 1 }},
		{"Tiers[gpu].Policy", func(c *Config) { c.Tiers[GPU].Policy = nil }},
		{"Tiers[host].Policy", func(c *Config) {
			c.Tiers[GPU].Policy = lru
			c.Tiers[Host] = tierCfg(t, 4)
			c.Tiers[Host].Policy = lru
			c.Mover = newFakeMover()
		}},
		{"Tiers", func(c *Config) { c.Tiers[GPU] = TierConfig{} }},
		{"Mover", func(c *Config) { c.Tiers[NVMe] = tierCfg(t, 4) }},
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

func TestBadInput(t *testing.T) {
	m := mustNew(t, Config{BlockTokens: 4, Tiers: [NumTiers]TierConfig{Host: tierCfg(t, 4)}})
	other := mustNew(t, Config{BlockTokens: 4, Tiers: [NumTiers]TierConfig{Host: tierCfg(t, 4)}})
	var l Lease
	for _, tier := range []Tier{GPU, NVMe, NumTiers, 200} {
		if err := m.Insert(1, toks(1, 4, 0), tier, &l); !errors.Is(err, ErrBadInput) {
			t.Errorf("Insert into %v: %v, want ErrBadInput", tier, err)
		}
		if err := m.InsertKeys(1, []Key{1}, tier, &l); !errors.Is(err, ErrBadInput) {
			t.Errorf("InsertKeys into %v: %v, want ErrBadInput", tier, err)
		}
	}
	if err := m.Onboard(&l); !errors.Is(err, ErrBadInput) {
		t.Errorf("Onboard of an empty lease: %v", err)
	}
	if err := m.Commit(&l, nil); !errors.Is(err, ErrBadInput) {
		t.Errorf("Commit of an empty lease: %v", err)
	}
	if err := m.Offload(&l, Host); !errors.Is(err, ErrBadInput) {
		t.Errorf("Offload of an empty lease: %v", err)
	}
	if err := m.Lookup(1, toks(2, 4, 0), &l); err != nil {
		t.Fatal(err)
	}
	if err := m.Lookup(1, toks(2, 4, 0), &l); !errors.Is(err, ErrBadInput) {
		t.Errorf("Lookup into a held lease: %v", err)
	}
	if err := m.Onboard(&l); !errors.Is(err, ErrBadInput) {
		t.Errorf("Onboard without a gpu tier: %v", err)
	}
	m.Release(&l)
	if err := other.Lookup(1, toks(2, 4, 0), &l); !errors.Is(err, ErrBadInput) {
		t.Errorf("lease of another manager: %v", err)
	}
	if _, err := NewHasher(0); !errors.Is(err, ErrBadInput) {
		t.Errorf("NewHasher(0): %v", err)
	}
	m.check(t)
}
