package replay

import (
	"fmt"
	"strings"

	"kvtier.dev/kvtier/cost"
)

// TierBreakEven is, for one lower tier of a replay, the shortest prompt
// whose reload from that tier alone beats recomputing it
// (cost.Scenario.BreakEven: the recompute with attention, and with its
// linear layers only, as kvtier calc prints them), without compression
// and with it: issue 37's question of where compression pays, asked of
// the replay's own model, GPU, links and calibration.
type TierBreakEven struct {
	Tier string `json:"tier"` // "host", "nvme" or "remote"
	Path string `json:"path"` // the tier's path to the GPU
	// Codec is what the "with" column prices: the tier's codec
	// (Config.HostCodec and its kin), or the fp8-e4m3 preset for a tier
	// that holds bf16 blocks.
	Codec string `json:"codec"`
	// The break-evens in tokens, without and with the codec, against the
	// recompute with attention and against its linear layers only; 0
	// means that reloading never beats recomputing.
	WithoutTokens       int `json:"without_tokens"`
	WithTokens          int `json:"with_tokens"`
	WithoutLinearTokens int `json:"without_linear_tokens"`
	WithLinearTokens    int `json:"with_linear_tokens"`
}

// breakEvens is the break-even of each lower tier e has, without and
// with compression.
func (e *engine) breakEvens() ([]TierBreakEven, error) {
	fp8, err := cost.LookupCodec("fp8-e4m3")
	if err != nil {
		return nil, err
	}
	with := e.codec
	if !with.Enabled() {
		with = fp8
	}
	type tier struct {
		name string
		path cost.Path
		on   bool
	}
	tiers := []tier{{"host", cost.DirectPath(e.hostLink), e.cfg.HostBytes > 0}, {"nvme", e.nvmePath, e.cfg.NVMeBytes > 0}}
	if e.rspec != nil {
		tiers = append(tiers, tier{"remote", cost.DirectPath(e.rspec.Link), true})
	}
	var out []TierBreakEven
	for _, t := range tiers {
		if !t.on {
			continue
		}
		be := TierBreakEven{Tier: t.name, Path: t.path.Name(), Codec: with.Name}
		for i, c := range []cost.Codec{{}, with} {
			s := e.scen
			s.Path, s.BlockTokens = t.path, e.bt
			s.Path.Codec = c
			if err := s.Validate(); err != nil {
				return nil, fmt.Errorf("replay: the %s tier's break-even: %w", t.name, err)
			}
			att, lin := breakEvenOrNever(&s, true), breakEvenOrNever(&s, false)
			if i == 0 {
				be.WithoutTokens, be.WithoutLinearTokens = att, lin
			} else {
				be.WithTokens, be.WithLinearTokens = att, lin
			}
		}
		out = append(out, be)
	}
	return out, nil
}

// breakEvenOrNever is s's break-even, 0 for never.
func breakEvenOrNever(s *cost.Scenario, withAttention bool) int {
	if n, ok := s.BreakEven(withAttention); ok {
		return n
	}
	return 0
}

// writeBreakEven writes the tiers' break-evens, a line each.
func (r *Report) writeBreakEven(b *strings.Builder) {
	if len(r.BreakEven) == 0 {
		return
	}
	tokens := func(n int) string {
		if n == 0 {
			return "never"
		}
		return fmt.Sprintf("%d tokens", n)
	}
	b.WriteString("reload beats recompute from (break-even against the recompute with attention; its linear layers only):\n")
	for _, t := range r.BreakEven {
		fmt.Fprintf(b, "  %-6s over %-28s %12s; %12s   with %s: %s; %s\n", t.Tier, t.Path, tokens(t.WithoutTokens), tokens(t.WithoutLinearTokens),
			t.Codec, tokens(t.WithTokens), tokens(t.WithLinearTokens))
	}
}
