package replay

import (
	"cmp"
	"fmt"
	"slices"
	"strings"
	"text/tabwriter"

	"kvtier.dev/kvtier"
)

// TenantQuota gives the requests of one trace salt limits of their own
// (kvtier.TenantLimit): a cap of each tier, in bytes (0: none), and a
// weight in a contended tier (0: 1). Example:
// {"salt": 2, "gpu_bytes": "8GiB", "weight": 1}.
type TenantQuota struct {
	Name      string  `json:"name,omitempty"` // in the report; "" is "salt N"
	Salt      uint64  `json:"salt"`
	GPUBytes  Bytes   `json:"gpu_bytes,omitempty"`
	HostBytes Bytes   `json:"host_bytes,omitempty"`
	NVMeBytes Bytes   `json:"nvme_bytes,omitempty"`
	Weight    float64 `json:"weight,omitempty"`
}

func (q *TenantQuota) name() string {
	if q.Name != "" {
		return q.Name
	}
	return fmt.Sprintf("salt %d", q.Salt)
}

// validateTenants checks what does not need the model; the manager
// checks each cap against its tier's slots.
func (c *Config) validateTenants() error {
	seen := make(map[uint64]int, len(c.Tenants))
	for i := range c.Tenants {
		q := &c.Tenants[i]
		field := func(f string) string { return fmt.Sprintf("tenants[%d].%s", i, f) }
		if j, dup := seen[q.Salt]; dup {
			return cfgErr(field("salt"), "%d is also tenants[%d]'s", q.Salt, j)
		}
		seen[q.Salt] = i
		if !(q.Weight >= 0) {
			return cfgErr(field("weight"), "%v is negative (0: 1)", q.Weight)
		}
		for f, b := range map[string]Bytes{"gpu_bytes": q.GPUBytes, "host_bytes": q.HostBytes, "nvme_bytes": q.NVMeBytes} {
			if b < 0 {
				return cfgErr(field(f), "%v is negative", b)
			}
		}
	}
	return nil
}

// managerTenants are the quotas as the manager takes them: caps in slots
// of slotBytes[t] (a block as tier t holds it), rounded down (a cap under one block is an error naming
// its field), none in a tier of capacity 0 (absent in this strategy).
func (c *Config) managerTenants(slotBytes [kvtier.NumTiers]int64, capacity [kvtier.NumTiers]Bytes) ([]kvtier.TenantLimit, error) {
	var out []kvtier.TenantLimit
	for i, q := range c.Tenants {
		tl := kvtier.TenantLimit{Name: q.name(), Salt: kvtier.Salt(q.Salt), Weight: q.Weight}
		if tl.Weight == 0 {
			tl.Weight = 1
		}
		for t, b := range [kvtier.NumTiers]Bytes{q.GPUBytes, q.HostBytes, q.NVMeBytes} {
			if b == 0 || capacity[t] == 0 {
				continue
			}
			n := int64(b) / slotBytes[t]
			if n == 0 || n > 1<<31 {
				return nil, cfgErr(fmt.Sprintf("tenants[%d].%s", i, [...]string{"gpu_bytes", "host_bytes", "nvme_bytes"}[t]),
					"%v is not 1 to 2^31 blocks of %d bytes", b, slotBytes[t])
			}
			tl.Slots[t] = int(n)
		}
		out = append(out, tl)
	}
	return out, nil
}

// TenantResult is one salt's share of a replay: the blocks its requests
// asked for, and those their lookups found cached (in any tier).
type TenantResult struct {
	Name      string  `json:"name"`
	Salt      uint64  `json:"salt"`
	Requests  int64   `json:"requests"`
	Blocks    int64   `json:"blocks"`
	HitBlocks int64   `json:"hit_blocks"`
	HitRatio  float64 `json:"hit_ratio"`
}

// maxSaltTallies bounds the salts tallied apart; the others are summed
// into one row, salt "others".
const maxSaltTallies = 64

type saltTally struct{ requests, blocks, hits int64 }

// tallySalt counts one request of salt that asked for blocks and found
// hits of them.
func (e *engine) tallySalt(salt kvtier.Salt, blocks, hits int) {
	s := e.salts[salt]
	if s == nil {
		if e.salts == nil {
			e.salts = make(map[kvtier.Salt]*saltTally)
		}
		if len(e.salts) < maxSaltTallies {
			s = &saltTally{}
			e.salts[salt] = s
		} else {
			s = &e.otherSalts
		}
	}
	s.requests++
	s.blocks += int64(blocks)
	s.hits += int64(hits)
}

// tenantResults are the salts' rows, by salt, then the others': nil when
// every request had salt 0 (Mooncake traces) and no quota was configured.
func (e *engine) tenantResults() []TenantResult {
	if _, zero := e.salts[0]; len(e.salts) < 2 && (zero || len(e.salts) == 0) && len(e.cfg.Tenants) == 0 {
		return nil
	}
	names := make(map[uint64]string, len(e.cfg.Tenants))
	for i := range e.cfg.Tenants {
		names[e.cfg.Tenants[i].Salt] = e.cfg.Tenants[i].name()
	}
	row := func(name string, salt uint64, s *saltTally) TenantResult {
		if name == "" {
			name = fmt.Sprintf("salt %d", salt)
		}
		return TenantResult{Name: name, Salt: salt, Requests: s.requests, Blocks: s.blocks, HitBlocks: s.hits, HitRatio: ratio(s.hits, s.blocks)}
	}
	var out []TenantResult
	for salt, s := range e.salts {
		out = append(out, row(names[uint64(salt)], uint64(salt), s))
	}
	slices.SortFunc(out, func(a, b TenantResult) int { return cmp.Compare(a.Salt, b.Salt) })
	if e.otherSalts.requests > 0 {
		out = append(out, row("others", 0, &e.otherSalts))
	}
	return out
}

// writeTenants writes the table of the salts' hit ratios, if any.
func writeTenants(b *strings.Builder, results []StrategyResult) {
	if len(results) == 0 || len(results[0].Tenants) == 0 {
		return
	}
	b.WriteString("\n")
	tw := tabwriter.NewWriter(b, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "strategy\ttenant\trequests\tblocks\thit blocks\thit ratio\t")
	for i := range results {
		for _, tr := range results[i].Tenants {
			fmt.Fprintf(tw, "%s\t%s\t%d\t%d\t%d\t%.4f\t\n", results[i].Strategy, tr.Name, tr.Requests, tr.Blocks, tr.HitBlocks, tr.HitRatio)
		}
	}
	tw.Flush()
}
