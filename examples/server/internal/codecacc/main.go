// Codecacc measures the accuracy of reused FP8 KV on the GPU runtime
// (issue 37, item 4): for each of -prompts prompts with -cached-min to
// -cached-max cached tokens, it prefills the prompt, sends the cached
// blocks through the FP8 codec (package cudacodec's kernels, or package
// codec in Go) into other slots, and compares the prompt's tail and a
// -steps-token greedy continuation computed over them with the same over
// the original blocks (package kvdrift): logit drift, and agreement with
// near ties counted apart by bench-serve --verify's rule. It writes
// codecacc-<machine>.{json,md} and codecacc-<machine>-prompts.jsonl (one
// kvdrift.Result a line) under -out. It lives here, not under benchmarks/,
// because the model packages are internal to examples/server.
//
//	go build -o .gpu/ ./examples/server/internal/codecacc
//	./codecacc -out DIR                      # 200 prompts, 2K-16K cached, llama-3.1-8b
//	./codecacc -model tiny -prompts 20 -cached-max 4096 -out DIR
package main

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"log"
	"os"
	"strings"

	"kvtier.dev/examples/server/internal/model"
	"kvtier.dev/internal/benchserve"
)

type flags struct {
	model       string
	blockTokens int
	prompts     int
	cachedMin   int
	cachedMax   int
	tail        int
	steps       int
	seed        uint64
	codec       string
	tolerance   float64
	out         string
	machine     string
	commit      string
}

func parseFlags(args []string, stderr io.Writer) (flags, error) {
	var f flags
	fs := flag.NewFlagSet("codecacc", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.StringVar(&f.model, "model", "llama-3.1-8b", "model preset (llama-3.1-8b, llama-3.2-1b, qwen2.5-7b, tiny)")
	fs.IntVar(&f.blockTokens, "block-tokens", 16, "tokens per KV block")
	fs.IntVar(&f.prompts, "prompts", 200, "prompts to compare")
	fs.IntVar(&f.cachedMin, "cached-min", 2048, "fewest cached tokens of a prompt (rounded up to whole blocks)")
	fs.IntVar(&f.cachedMax, "cached-max", 16384, "most cached tokens of a prompt (rounded down to whole blocks); a prompt's count is uniform in between")
	fs.IntVar(&f.tail, "tail", 64, "tokens of each prompt after its cached ones, computed on top of them")
	fs.IntVar(&f.steps, "steps", 32, "greedy continuation tokens compared")
	fs.Uint64Var(&f.seed, "seed", 1, "seed of the prompts' tokens and of the model's weights")
	fs.StringVar(&f.codec, "codec", "auto", "the round trip: kernels (package cudacodec), go (package codec over copies to the host), auto (the kernels when they load), or none: the baseline, the blocks copied as they are and the reference continuing from the one-shot prefill (reuse itself against no reuse)")
	fs.Float64Var(&f.tolerance, "tolerance", benchserve.DefaultVerifyTolerance, "near-tie tolerance in nats (bench-serve --verify-tolerance's rule)")
	fs.StringVar(&f.out, "out", "", "directory for codecacc-<machine>.{json,md} and -prompts.jsonl (empty: print the table only)")
	fs.StringVar(&f.machine, "machine", "h200", "machine name in the results")
	fs.StringVar(&f.commit, "commit", "", "commit to record (default: the build's)")
	if err := fs.Parse(args); err != nil {
		return f, err
	}
	if fs.NArg() > 0 {
		return f, fmt.Errorf("unexpected arguments %q", fs.Args())
	}
	return f, nil
}

// check rounds the cached range to whole blocks and names the first flag
// that is wrong.
func (f *flags) check() (model.Config, error) {
	c, err := model.Lookup(f.model, f.blockTokens)
	if err != nil {
		return c, fmt.Errorf("-model %q, -block-tokens %d: %w", f.model, f.blockTokens, err)
	}
	bt := c.BlockTokens
	lo, hi := (f.cachedMin+bt-1)/bt*bt, f.cachedMax/bt*bt
	switch {
	case f.prompts < 1:
		return c, fmt.Errorf("-prompts %d: want 1 or more", f.prompts)
	case f.cachedMin < 1 || lo > hi:
		return c, fmt.Errorf("-cached-min %d, -cached-max %d: want 1 <= min <= max, with at least one whole block of %d tokens between them", f.cachedMin, f.cachedMax, bt)
	case f.tail < 1:
		return c, fmt.Errorf("-tail %d: want 1 or more", f.tail)
	case f.steps < 1:
		return c, fmt.Errorf("-steps %d: want 1 or more", f.steps)
	case !(f.tolerance >= 0):
		return c, fmt.Errorf("-tolerance %g: want 0 or more nats", f.tolerance)
	case f.codec != "auto" && f.codec != "kernels" && f.codec != "go" && f.codec != "none":
		return c, fmt.Errorf("-codec %q: want auto, kernels, go or none", f.codec)
	case f.machine == "" || strings.ContainsAny(f.machine, "/\\"):
		return c, fmt.Errorf("-machine %q: want a name without slashes", f.machine)
	}
	f.cachedMin, f.cachedMax = lo, hi
	return c, nil
}

func run(args []string, stdout, stderr io.Writer) error {
	f, err := parseFlags(args, stderr)
	if err != nil {
		return err
	}
	c, err := f.check()
	if err != nil {
		return err
	}
	rig, err := openRig(c, f)
	if err != nil {
		return err
	}
	rs, took, err := rig.runAll(f)
	if cerr := rig.close(); err == nil {
		err = cerr
	}
	if err != nil {
		return err
	}
	rep := newReport(c, f, rig.setup, rs, took)
	log.Print(rep.headline())
	if f.out == "" {
		return rep.markdown(stdout)
	}
	return rep.write(f.out)
}

func main() {
	log.SetFlags(0)
	if err := run(os.Args[1:], os.Stdout, os.Stderr); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			os.Exit(2)
		}
		log.Fatalf("codecacc: %v", err)
	}
}
