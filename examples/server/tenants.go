package main

import (
	"fmt"
	"strconv"
	"strings"

	"kvtier.dev/internal/openai"
	"kvtier.dev/kvtier"
)

// tenantFlag is -tenant-quota, repeatable: one tenant's limits each,
//
//	USER[/SALT]=gpu:N,host:N,nvme:N,weight:W
//
// with USER and SALT as a completion's "user" and "salt" fields give them,
// N a count of blocks (slots; 0 or absent: no cap) and W the tenant's
// weight (absent: 1). The tenant is named USER[/SALT] in the metrics.
type tenantFlag struct{ list *tenantLimits }

// tenantLimits are the tenants' limits, their salts as requests give them
// (stack.Options.Tenants folds them with the model).
type tenantLimits = []kvtier.TenantLimit

func (f tenantFlag) String() string {
	if f.list == nil {
		return ""
	}
	parts := make([]string, len(*f.list))
	for i, tl := range *f.list {
		parts[i] = tl.Name
	}
	return strings.Join(parts, " ")
}

func (f tenantFlag) Set(s string) error {
	tl, err := parseTenant(s)
	if err != nil {
		return err
	}
	for _, o := range *f.list {
		if o.Name == tl.Name {
			return fmt.Errorf("tenant %q is given twice", tl.Name)
		}
	}
	*f.list = append(*f.list, tl)
	return nil
}

// parseTenant reads one -tenant-quota value; its errors name the bad part.
func parseTenant(s string) (kvtier.TenantLimit, error) {
	tl := kvtier.TenantLimit{Weight: 1}
	name, limits, ok := strings.Cut(s, "=")
	if !ok || name == "" {
		return tl, fmt.Errorf("%q: want USER[/SALT]=gpu:N,host:N,nvme:N,weight:W", s)
	}
	if name == kvtier.DefaultTenant {
		return tl, fmt.Errorf("tenant %q: the name of the tenants not listed", name)
	}
	user, salt, _ := strings.Cut(name, "/")
	tl.Name, tl.Salt = name, kvtier.Salt(openai.SaltOf(user, salt))
	seen := map[string]bool{}
	for part := range strings.SplitSeq(limits, ",") {
		key, val, ok := strings.Cut(part, ":")
		if !ok || seen[key] {
			return tl, fmt.Errorf("tenant %q: %q: want one each of gpu:N, host:N, nvme:N, weight:W", name, part)
		}
		seen[key] = true
		if key == "weight" {
			w, err := strconv.ParseFloat(val, 64)
			if err != nil || !(w > 0) || w > 1e9 {
				return tl, fmt.Errorf("tenant %q: weight %q: want a positive number", name, val)
			}
			tl.Weight = w
			continue
		}
		t, ok := map[string]kvtier.Tier{"gpu": kvtier.GPU, "host": kvtier.Host, "nvme": kvtier.NVMe}[key]
		if !ok {
			return tl, fmt.Errorf("tenant %q: %q: no such tier or field (gpu, host, nvme, weight)", name, key)
		}
		n, err := strconv.Atoi(val)
		if err != nil || n < 0 {
			return tl, fmt.Errorf("tenant %q: %s %q: want a count of blocks, 0 or more", name, key, val)
		}
		tl.Slots[t] = n
	}
	return tl, nil
}
