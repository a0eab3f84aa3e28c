package main

import (
	"encoding/json"
	"io"
	"net/http"
	"strings"
	"testing"

	dto "github.com/prometheus/client_model/go"

	"kvtier.dev/examples/server/internal/httpapi"
	"kvtier.dev/internal/openai"
	"kvtier.dev/kvtier"
)

func TestTenantQuotaFlag(t *testing.T) {
	c, err := parseArgs([]string{"-tenant-quota", "alice=gpu:8,host:16,weight:2", "-tenant-quota", "bob/team=nvme:4"}, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	want := []kvtier.TenantLimit{
		{Name: "alice", Salt: kvtier.Salt(openai.SaltOf("alice", "")), Slots: [kvtier.NumTiers]int{kvtier.GPU: 8, kvtier.Host: 16}, Weight: 2},
		{Name: "bob/team", Salt: kvtier.Salt(openai.SaltOf("bob", "team")), Slots: [kvtier.NumTiers]int{kvtier.NVMe: 4}, Weight: 1},
	}
	if len(c.tenants) != 2 || c.tenants[0] != want[0] || c.tenants[1] != want[1] {
		t.Errorf("-tenant-quota: %+v, want %+v", c.tenants, want)
	}
	for _, tc := range []struct{ value, part string }{
		{"alice", `"alice"`},
		{"=gpu:8", `"=gpu:8"`},
		{"alice=gpu:-1", `gpu "-1"`},
		{"alice=gpu:x", `gpu "x"`},
		{"alice=tape:3", `"tape"`},
		{"alice=gpu:3,gpu:4", `"gpu:4"`},
		{"alice=gpu", `"gpu"`},
		{"alice=weight:0", `weight "0"`},
		{"alice=weight:NaN", `weight "NaN"`},
		{"other=gpu:1", `"other"`},
	} {
		_, err := parseArgs([]string{"-tenant-quota", tc.value}, io.Discard)
		if err == nil || !strings.Contains(err.Error(), "-tenant-quota") || !strings.Contains(err.Error(), tc.part) {
			t.Errorf("-tenant-quota %s: %v; want an error naming the flag and %s", tc.value, err, tc.part)
		}
	}
	_, err = parseArgs([]string{"-tenant-quota", "a=gpu:1", "-tenant-quota", "a=gpu:2"}, io.Discard)
	if err == nil || !strings.Contains(err.Error(), `tenant "a" is given twice`) {
		t.Errorf("a tenant given twice: %v", err)
	}
	if err := startErr(t, testArgs("-tenant-quota", "alice=gpu:33")); err == nil || !strings.Contains(err.Error(), "Slots[gpu]: 33 is more than the gpu tier's 32 slots") {
		t.Errorf("a cap over the GPU tier's 32 slots: %v", err)
	}
}

// tenantGauge reads a series of /metrics with the tenant and tier labels.
func tenantSeries(fams map[string]*dto.MetricFamily, name, tenant, tier string) float64 {
	f := fams[name]
	if f == nil {
		return -1
	}
	for _, m := range f.Metric {
		got := map[string]string{}
		for _, l := range m.Label {
			got[l.GetName()] = l.GetValue()
		}
		if got["tenant"] == tenant && got["tier"] == tier {
			if m.Gauge != nil {
				return m.Gauge.GetValue()
			}
			return m.Counter.GetValue()
		}
	}
	return -1
}

// TestTenantQuotaServed: a tenant capped at 8 GPU blocks sends prompts of
// 10: it never holds more than 8 GPU slots, its hits are counted under its
// own label, and the other tenants' under "other".
func TestTenantQuotaServed(t *testing.T) {
	s := start(t, testArgs("-tenant-quota", "alice=gpu:8")...)
	for i := range 4 {
		s.complete(t, openai.CompletionRequest{Prompt: tokenPrompt(10+i, 41), MaxTokens: maxTokens(1), User: "alice"})
	}
	p := tokenPrompt(20, 41)
	s.complete(t, openai.CompletionRequest{Prompt: p, MaxTokens: maxTokens(1), User: "bob"})
	s.complete(t, openai.CompletionRequest{Prompt: p, MaxTokens: maxTokens(1), User: "bob"})
	fams := scrape(t, s.url)
	if got := tenantSeries(fams, "kvtier_tenant_resident_blocks", "alice", "gpu"); got < 1 || got > 8 {
		t.Errorf("alice holds %v GPU blocks, want 1 to its cap of 8", got)
	}
	if got := tenantSeries(fams, "kvtier_tenant_cap_blocks", "alice", "gpu"); got != 8 {
		t.Errorf("alice's GPU cap in /metrics: %v", got)
	}
	if got := tenantSeries(fams, "kvtier_tenant_hits_total", "other", "gpu"); got != 10 {
		t.Errorf("bob's second request: %v GPU hits under tenant=\"other\", want 10", got)
	}
	if got := tenantSeries(fams, "kvtier_tenant_evictions_total", "alice", "gpu"); got <= 0 {
		t.Errorf("alice's GPU evictions: %v, want some (4 prompts of 10 blocks, a cap of 8)", got)
	}
}

// TestAdminPin: a pinned prompt keeps its GPU blocks through a flood of
// other prompts; unpinned, the next flood moves it out. Without the token
// pin is refused; a bad ttl is a 400 naming it.
func TestAdminPin(t *testing.T) {
	s := startAdminServer(t) // a GPU tier of 32 blocks of 4 tokens
	a := tokenPrompt(1, 41)
	s.cached(t, a, "")
	if status, _ := s.call(t, "", http.MethodPost, "pin", httpapi.AdminPinRequest{AdminPrefix: httpapi.AdminPrefix{Prompt: &a}}); status != http.StatusUnauthorized {
		t.Errorf("pin without a token: %d, want 401", status)
	}
	status, b := s.call(t, adminToken, http.MethodPost, "pin", `{"prompt": [1, 2, 3, 4], "ttl": "-5s"}`)
	var e openai.ErrorResponse
	if status != http.StatusBadRequest || json.Unmarshal(b, &e) != nil || e.Error.Param == nil || *e.Error.Param != "ttl" {
		t.Errorf("pin with a negative ttl: %d %s, want 400 naming ttl", status, b)
	}
	for _, body := range []string{`{"prompt": [1, 2, 3, 4], "priority": 101}`, `{"prompt": [1, 2, 3, 4], "priority": -1}`} {
		status, b := s.call(t, adminToken, http.MethodPost, "pin", body)
		var e openai.ErrorResponse
		if status != http.StatusBadRequest || json.Unmarshal(b, &e) != nil || e.Error.Param == nil || *e.Error.Param != "priority" {
			t.Errorf("pin %s: %d %s, want 400 naming priority", body, status, b)
		}
	}
	if n := s.tiers(t).PinnedBlocks; n != 0 {
		t.Errorf("tiers after refused pins: %d pinned blocks, want 0", n)
	}
	low := 5
	if n := s.blocks(t, "pin", httpapi.AdminPinRequest{AdminPrefix: httpapi.AdminPrefix{Prompt: &a}, Priority: &low}); n != 10 {
		t.Fatalf("pin a at priority 5: %d blocks, want its 10", n)
	}
	if ti := s.tiers(t); ti.PinnedBlocks != 10 || ti.PinnedByPriority[5] != 10 {
		t.Errorf("tiers after the pin at 5: %d pinned blocks, by priority %v; want 10 at 5", ti.PinnedBlocks, ti.PinnedByPriority)
	}
	if n := s.blocks(t, "pin", httpapi.AdminPinRequest{AdminPrefix: httpapi.AdminPrefix{Prompt: &a}, TTL: "1h"}); n != 10 {
		t.Fatalf("pin a: %d blocks, want its 10", n)
	}
	if ti := s.tiers(t); ti.PinnedBlocks != 10 || ti.PinnedByPriority[kvtier.MaxPriority] != 10 {
		t.Errorf("tiers after the pin: %d pinned blocks, by priority %v; want 10 at %d", ti.PinnedBlocks, ti.PinnedByPriority, kvtier.MaxPriority)
	}
	floodServer(t, s, 100)
	if c := s.cached(t, a, ""); c.GPU != 40 {
		t.Errorf("pinned a after a flood: %+v cached, want its 40 tokens in GPU memory", c)
	}
	if n := s.blocks(t, "unpin", httpapi.AdminPrefix{Prompt: &a}); n != 10 {
		t.Errorf("unpin a: %d blocks, want 10", n)
	}
	if n := s.tiers(t).PinnedBlocks; n != 0 {
		t.Errorf("tiers after the unpin: %d pinned blocks, want 0", n)
	}
	floodServer(t, s, 200)
	if c := s.cached(t, a, ""); c.GPU == 40 {
		t.Errorf("unpinned a after a flood: %+v cached, still all in GPU memory", c)
	}
	if !strings.Contains(s.logs.String(), "path="+httpapi.AdminPath+"pin status=200") {
		t.Errorf("the pin is not logged:\n%s", s.logs)
	}
}

// floodServer sends 8 prompts of 10 blocks, none seen before.
func floodServer(t *testing.T, s *adminServer, seed int) {
	for i := range 8 {
		s.complete(t, openai.CompletionRequest{Prompt: tokenPrompt(seed+i, 41), MaxTokens: maxTokens(1)})
	}
}

// TestAdminTiersShowsTenants: GET /admin/v1/tiers names each configured
// tenant with its blocks and caps per tier, and the other salts as
// "other".
func TestAdminTiersShowsTenants(t *testing.T) {
	s := startAdminServer(t, "-tenant-quota", "alice=gpu:8,weight:2")
	s.complete(t, openai.CompletionRequest{Prompt: tokenPrompt(3, 41), MaxTokens: maxTokens(1), User: "alice"})
	s.complete(t, openai.CompletionRequest{Prompt: tokenPrompt(4, 41), MaxTokens: maxTokens(1), User: "bob"})
	ts := s.tiers(t).Tenants
	alice, other := ts["alice"], ts["other"]
	if len(ts) != 2 || alice.Weight != 2 || alice.CapSlots["gpu"] != 8 || other.CapSlots != nil {
		t.Fatalf("tenants in tiers: %+v, want alice (weight 2, GPU cap 8) and other (no cap)", ts)
	}
	if a, o := alice.ResidentBlocks["gpu"], other.ResidentBlocks["gpu"]; a < 1 || a > 8 || o != 10 {
		t.Errorf("GPU blocks: alice %d (want 1 to its cap of 8), other %d (want bob's 10)", a, o)
	}
}
