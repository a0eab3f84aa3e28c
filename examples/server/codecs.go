package main

import (
	"flag"
	"fmt"

	"kvtier.dev/examples/server/internal/model"
	"kvtier.dev/kvtier/codec"
	"kvtier.dev/kvtier/cost"
	"kvtier.dev/kvtier/stack"
)

// codecFlags are -host-codec, -nvme-codec and -remote-codec: how each
// tier below the GPU holds blocks (stack.Options.Codecs). The NVMe and
// remote tiers follow -host-codec unless their flag is given.
type codecFlags struct {
	host, nvme, remote     codec.Codec
	nvmeGiven, remoteGiven bool
	// hostAuto: -host-codec auto (the default), which resolve turns into
	// the codec the cost model chooses within budget, the largest relative
	// RMS error of the KV a codec may add (-codec-error-budget).
	hostAuto bool
	budget   float64
}

func (f *codecFlags) register(fs *flag.FlagSet) {
	set := func(p *codec.Codec, given *bool) func(string) error {
		return func(s string) error {
			c, err := stack.ParseCodec(s)
			if err != nil {
				return err
			}
			*p = c
			if given != nil {
				*given = true
			}
			return nil
		}
	}
	f.hostAuto = true
	fs.Func("host-codec", "how the host tier holds blocks: none (the GPU's bf16 bytes), fp8-e4m3 (FP8 with a scale per head, coded on the GPU: about twice the blocks in -host), or auto: the codec the cost model says pays over -cost-link within -codec-error-budget (none for a model it has no preset of) (default auto)", func(s string) error {
		f.hostAuto = s == "auto"
		if f.hostAuto {
			f.host = codec.None
			return nil
		}
		return set(&f.host, nil)(s)
	})
	fs.Float64Var(&f.budget, "codec-error-budget", cost.DefaultErrorBudget, "the largest relative RMS error of the KV that -host-codec auto may add (fp8-e4m3: 0.027); 0 keeps every tier's blocks as the GPU holds them")
	fs.Func("nvme-codec", "how the NVMe tier holds blocks, none or fp8-e4m3 (default: -host-codec's; the tiers must share one codec for now)", set(&f.nvme, &f.nvmeGiven))
	fs.Func("remote-codec", "with -remote: how the remote tier holds blocks, none or fp8-e4m3 (default: -host-codec's; the tiers must share one codec for now)", set(&f.remote, &f.remoteGiven))
}

// options are the cache's codecs for model m, with or without an NVMe and
// a remote tier: a tier that is absent gets none.
func (f *codecFlags) options(m model.Config, nvme, remote bool) (stack.Codecs, error) {
	o := stack.Codecs{Host: f.host, KVHeads: m.KVHeads}
	for _, t := range []struct {
		flag   string
		c      codec.Codec
		given  bool
		exists bool
		dst    *codec.Codec
	}{{"-nvme-codec", f.nvme, f.nvmeGiven, nvme, &o.NVMe}, {"-remote-codec", f.remote, f.remoteGiven, remote, &o.Remote}} {
		c := f.host
		if t.given {
			c = t.c
		}
		if t.exists && c != f.host {
			return o, fmt.Errorf("%s %s with -host-codec %s: the tiers must share one codec for now", t.flag, c, f.host)
		}
		if t.exists {
			*t.dst = c
		}
	}
	return o, nil
}

// check refuses a budget outside [0, 1).
func (f *codecFlags) check() error {
	if !(f.budget >= 0 && f.budget < 1) {
		return fmt.Errorf("-codec-error-budget %v: want at least 0 and below 1", f.budget)
	}
	return nil
}

// resolve turns -host-codec auto into a codec: cost.ChooseCodec's for the
// host tier's path under the presets (-cost-link), within the budget;
// none for a server that keeps no lower tier or whose model the cost model
// has no preset of; -nvme-codec's or -remote-codec's where one is given
// (the tiers share one codec for now). It says what it chose, and why, in the log.
func (f *codecFlags) resolve(c *config, s shape) error {
	if !f.hostAuto {
		return nil
	}
	f.hostAuto, f.host = false, codec.None
	reason := ""
	switch {
	case f.nvmeGiven: // the tiers share one codec for now
		f.host, reason = f.nvme, "-nvme-codec given"
	case f.remoteGiven:
		f.host, reason = f.remote, "-remote-codec given"
	case !c.strategy.LowerTiers():
		reason = "no lower tier (-strategy " + c.strategy.String() + ")"
	default:
		if _, err := cost.LookupModel(s.model.Name); err != nil {
			reason = "the cost model has no preset of " + s.model.Name
			break
		}
		pc, err := plannerConfig(c, s)
		if err != nil {
			return err
		}
		choice, err := cost.ChooseCodec(pc.Paths[cost.TierHost], pc.Model, pc.BlockTokens, 1, f.budget)
		if err != nil {
			return fmt.Errorf("-host-codec auto: %w", err)
		}
		if choice.Codec.Enabled() {
			if f.host, err = stack.ParseCodec(choice.Codec.Name); err != nil {
				return fmt.Errorf("-host-codec auto chose %s: %w", choice.Codec.Name, err)
			}
		}
		reason = choice.Reason
	}
	c.log.Info("server: -host-codec auto", "codec", f.host.String(), "why", reason)
	return nil
}
