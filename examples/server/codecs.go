package main

import (
	"flag"
	"fmt"

	"kvtier.dev/examples/server/internal/model"
	"kvtier.dev/kvtier/codec"
	"kvtier.dev/kvtier/stack"
)

// codecFlags are -host-codec, -nvme-codec and -remote-codec: how each
// tier below the GPU holds blocks (stack.Options.Codecs). The NVMe and
// remote tiers follow -host-codec unless their flag is given.
type codecFlags struct {
	host, nvme, remote     codec.Codec
	nvmeGiven, remoteGiven bool
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
	fs.Func("host-codec", "how the host tier holds blocks: none (the GPU's bf16 bytes) or fp8-e4m3 (FP8 with a scale per head, coded on the GPU: about twice the blocks in -host) (default none)", set(&f.host, nil))
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
