package replay

import (
	"errors"
	"strings"
	"testing"
	"time"

	"kvtier.dev/kvtier/trace"
)

const (
	quietSalt = 1
	floodSalt = 2
	blockMiB  = 2 << 20 // a 16-token block of Llama-3.1-8B
)

// twoTenants is 120 requests of a quiet tenant cycling over 4 prompts of 8
// blocks, each followed by 2 unique prompts of 16 blocks from a flooding
// tenant (none when flood is false), one request every 100 ms.
func twoTenants(flood bool) Source {
	var reqs []trace.Request
	at, next := time.Duration(0), uint64(1<<32)
	add := func(salt uint64, keys []uint64) {
		reqs = append(reqs, trace.Request{Arrival: at, Salt: salt, BlockTokens: 16, InputTokens: 16 * len(keys), OutputTokens: 1, Keys: keys})
		at += 100 * time.Millisecond
	}
	for i := range 120 {
		add(quietSalt, keysFrom(uint64(i%4)*1000+1, 8))
		for range 2 {
			if flood {
				add(floodSalt, keysFrom(next, 16))
			} else {
				at += 100 * time.Millisecond
			}
			next += 16
		}
	}
	return linesSource("two-tenants", reqs...)
}

// tenantsConfig is a GPU tier of 32 blocks and a host tier of 96.
func tenantsConfig(quotas ...TenantQuota) Config {
	cfg := DefaultConfig()
	cfg.Baselines, cfg.Mover = false, MoverModel
	cfg.GPUBytes, cfg.HostBytes, cfg.NVMeBytes = 32*blockMiB, 96*blockMiB, 0
	cfg.Tenants = quotas
	return cfg
}

func quietRatio(t *testing.T, src Source, cfg Config) float64 {
	t.Helper()
	rep := runOrFail(t, src, cfg)
	for _, tr := range rep.Results[0].Tenants {
		if tr.Salt == quietSalt {
			return tr.HitRatio
		}
	}
	t.Fatalf("no row of salt %d in %+v", quietSalt, rep.Results[0].Tenants)
	return 0
}

// TestReplayTenantQuotas is the replay's row of issue 36: the quiet
// tenant's hit ratio alone, flooded without quotas, with the flooder
// capped, and with the quiet tenant weighted.
func TestReplayTenantQuotas(t *testing.T) {
	solo := quietRatio(t, twoTenants(false), tenantsConfig())
	shared := quietRatio(t, twoTenants(true), tenantsConfig())
	capped := quietRatio(t, twoTenants(true), tenantsConfig(TenantQuota{Name: "flood", Salt: floodSalt, GPUBytes: 8 * blockMiB, HostBytes: 32 * blockMiB}))
	weighted := quietRatio(t, twoTenants(true), tenantsConfig(TenantQuota{Name: "quiet", Salt: quietSalt, Weight: 1}))
	t.Logf("quiet tenant's hit ratio: solo %.4f, flooded without quotas %.4f, flooder capped %.4f, quiet weighted %.4f", solo, shared, capped, weighted)
	if solo < 0.9 {
		t.Fatalf("solo hit ratio %.4f: the working set should fit", solo)
	}
	if shared > solo/2 {
		t.Errorf("without quotas the flood left a hit ratio of %.4f (solo %.4f): want a collapse", shared, solo)
	}
	if capped < 0.95*solo || weighted < 0.95*solo {
		t.Errorf("with quotas the quiet tenant's hit ratio is %.4f (capped flooder), %.4f (weighted); want within 5%% of solo %.4f", capped, weighted, solo)
	}
	rep := runOrFail(t, twoTenants(true), tenantsConfig(TenantQuota{Name: "flood", Salt: floodSalt, GPUBytes: 8 * blockMiB}))
	var b strings.Builder
	if err := rep.WriteText(&b); err != nil || !strings.Contains(b.String(), "flood") || !strings.Contains(b.String(), "salt 1") {
		t.Errorf("the text report has no tenant rows (%v):\n%s", err, b.String())
	}
}

func TestReplayTenantQuotaErrors(t *testing.T) {
	for _, tc := range []struct{ json, field string }{
		{`{"tenants": [{"salt": 1}, {"salt": 1}]}`, "tenants[1].salt"},
		{`{"tenants": [{"salt": 1, "weight": -1}]}`, "tenants[0].weight"},
		{`{"tenants": [{"salt": 1, "gpu_bytes": -5}]}`, "tenants[0].gpu_bytes"},
		{`{"tenants": [{"salt": 1, "colour": "red"}]}`, "tenants"},
	} {
		_, err := LoadConfig(strings.NewReader(tc.json))
		var ce *ConfigError
		if !errors.As(err, &ce) || !strings.HasPrefix(ce.Field, tc.field) {
			t.Errorf("%s: %v, want an error naming %s", tc.json, err, tc.field)
		}
	}
	cfg := tenantsConfig(TenantQuota{Salt: floodSalt, GPUBytes: 1 << 20}) // half a block
	if _, err := Run(twoTenants(true), cfg, Options{}); err == nil || !strings.Contains(err.Error(), "tenants[0].gpu_bytes") {
		t.Errorf("a cap under one block: %v", err)
	}
	cfg = tenantsConfig(TenantQuota{Salt: floodSalt, GPUBytes: 64 * blockMiB}) // more than the GPU tier
	if _, err := Run(twoTenants(true), cfg, Options{}); err == nil || !strings.Contains(err.Error(), "Tenants[0].Slots[gpu]") {
		t.Errorf("a cap over the GPU tier: %v", err)
	}
}
