// Layerwait measures what a prefill's wait for its loads costs when the
// host waits (it blocks before it enqueues each layer until that layer's
// loads have landed: the server's -layer-wait host) against the device
// waiting (the model's stream waits on each layer's copy event and the
// host enqueues every layer at once: -layer-wait device), on the GPU, with
// the server's model (examples/server/internal/gpu) and kvtier's copy
// engine (kvtier/transfer) loading the prefix from a pinned host pool.
//
//	go build -o .gpu/ ./examples/server/internal/layerwait
//	./layerwait -results benchmarks/results        # on the GPU machine
//
// For each split (-splits TOTAL:LOADED,...) it computes the whole prompt
// once, offloads the first LOADED tokens' blocks to the pool, checks that
// both waits give the logits, bit for bit, of the pass with the prefix
// present (the prefix scrubbed to NaN before each), then times -runs passes
// of each wait, the order alternating, beside the same pass with the prefix
// present (compute only) and the onboard alone (load only). A pass's time
// runs from the onboard's submission to the logits on the host. It writes
// layerwait-<machine>.{json,md}, or prints the table without -results.
package main

import (
	"context"
	"flag"
	"fmt"
	"log"
	"os"
	"strconv"
	"strings"
	"time"

	"kvtier.dev/cudastream"
	"kvtier.dev/examples/server/internal/model"
	"kvtier.dev/internal/bytesize"
	"kvtier.dev/internal/results"
)

type flags struct {
	model         string
	blockTokens   int
	splits        string
	runs          int
	gatherStaging string
	resultsDir    string
	machine       string
	commit        string
}

func parseFlags(args []string) (flags, error) {
	var f flags
	fs := flag.NewFlagSet("layerwait", flag.ContinueOnError)
	fs.StringVar(&f.model, "model", "llama-3.1-8b", "model preset (llama-3.1-8b, llama-3.2-1b, qwen2.5-7b, tiny)")
	fs.IntVar(&f.blockTokens, "block-tokens", 16, "tokens per KV block")
	fs.StringVar(&f.splits, "splits", "13876:12432,13876:13856,13876:4096", "prefills to time, TOTAL:LOADED tokens each (LOADED a multiple of -block-tokens, below TOTAL), comma separated")
	fs.IntVar(&f.runs, "runs", 15, "timed passes of each kind per split")
	fs.StringVar(&f.gatherStaging, "gather-staging", "96MiB", "the copy engine's device staging, as the server's -gather-staging (0: none)")
	fs.StringVar(&f.resultsDir, "results", "", "directory for layerwait-<machine>.{json,md} (empty: print only)")
	fs.StringVar(&f.machine, "machine", "h200", "machine name in the results")
	fs.StringVar(&f.commit, "commit", "", "commit to record (default: the build's)")
	if err := fs.Parse(args); err != nil {
		return f, err
	}
	if fs.NArg() > 0 {
		return f, fmt.Errorf("unexpected argument %q (flags only)", fs.Arg(0))
	}
	return f, nil
}

// config is what the flags ask for, checked.
type config struct {
	c             model.Config
	splits        []split
	gatherStaging int64
	maxTotal      int
	maxLoaded     int
}

// checkFlags checks every flag before any GPU is opened.
func checkFlags(f flags) (config, error) {
	var k config
	if f.runs < 1 {
		return k, fmt.Errorf("-runs %d: want at least 1", f.runs)
	}
	var err error
	if k.c, err = model.Lookup(f.model, f.blockTokens); err != nil {
		return k, fmt.Errorf("-model %s -block-tokens %d: %w", f.model, f.blockTokens, err)
	}
	if k.gatherStaging, err = parseBytes(f.gatherStaging); err != nil {
		return k, fmt.Errorf("-gather-staging %q: %w", f.gatherStaging, err)
	}
	if k.splits, err = parseSplits(f.splits, k.c.BlockTokens); err != nil {
		return k, fmt.Errorf("-splits: %w", err)
	}
	for _, s := range k.splits {
		k.maxTotal, k.maxLoaded = max(k.maxTotal, s.total), max(k.maxLoaded, s.loaded)
	}
	return k, nil
}

func parseBytes(s string) (int64, error) {
	if s == "0" {
		return 0, nil
	}
	return bytesize.Parse(s)
}

// parseSplits reads TOTAL:LOADED,... .
func parseSplits(s string, blockTokens int) ([]split, error) {
	var out []split
	for i, item := range strings.Split(s, ",") {
		a, b, ok := strings.Cut(strings.TrimSpace(item), ":")
		total, terr := strconv.Atoi(a)
		loaded, lerr := strconv.Atoi(b)
		switch {
		case !ok || terr != nil || lerr != nil:
			return nil, fmt.Errorf("item %d %q: want TOTAL:LOADED, two token counts", i+1, item)
		case loaded <= 0 || loaded >= total:
			return nil, fmt.Errorf("item %d %q: LOADED must be above 0 and below TOTAL", i+1, item)
		case loaded%blockTokens != 0:
			return nil, fmt.Errorf("item %d %q: LOADED %d is not a multiple of the block's %d tokens", i+1, item, loaded, blockTokens)
		}
		out = append(out, split{total: total, loaded: loaded})
	}
	return out, nil
}

func run(f flags) error {
	k, err := checkFlags(f)
	if err != nil {
		return err
	}
	dev, err := cudastream.Open(0)
	if err == nil {
		defer dev.Close()
		err = runOn(dev, k, f)
	}
	return err
}

// runOn verifies and times every split on dev and writes the results.
func runOn(dev cudastream.Device, k config, f flags) error {
	t0 := time.Now()
	r, err := newRig(dev, k.c, k.maxTotal, k.maxLoaded, k.gatherStaging)
	if err != nil {
		return err
	}
	defer r.close()
	ctx := context.Background()
	if err := r.fill(ctx, k.maxTotal, k.maxLoaded); err != nil {
		return err
	}
	log.Printf("%s on %s: model, pool and prefix ready in %v", k.c.Name, dev.Info().Name, time.Since(t0).Round(time.Millisecond))
	res := results.New("layerwait", f.machine, f.commit)
	res.Notes = notes(k, dev.Info(), r.m.Library())
	for _, s := range k.splits {
		inFlight, err := r.verify(ctx, s)
		if err != nil {
			return fmt.Errorf("verify: %w", err)
		}
		res.Notes = append(res.Notes, fmt.Sprintf("%v: logits equal to the prefix-present pass's with both waits; layers not landed when the pass reached them: host wait %d, device wait %d of %d",
			s, inFlight[hostWait], inFlight[deviceWait], k.c.Layers))
		if err := measure(ctx, r, res, s, f.runs); err != nil {
			return fmt.Errorf("%v: %w", s, err)
		}
	}
	if f.resultsDir == "" {
		return res.Markdown(os.Stdout)
	}
	if err := res.Write(f.resultsDir); err != nil {
		return err
	}
	return res.Markdown(os.Stdout)
}

// The kinds of timed run, in the order of a round; round i starts at kind
// i mod numKinds, so that no kind always follows the same other.
const (
	kindHost = iota
	kindDevice
	kindPresent
	kindLoad
	numKinds
)

var kindNames = [numKinds]string{"host wait", "device wait", "compute only (prefix present)", "load only"}

// measure runs one warm-up round, then runs rounds of every kind, and
// adds s's rows: the device wait against the host wait (ratio above 1:
// the device wait is faster), and the two bounds.
func measure(ctx context.Context, r *rig, res *results.File, s split, runs int) error {
	var secs [numKinds][]float64
	for round := range runs + 1 {
		for j := range numKinds {
			kind := (round + j) % numKinds
			var d time.Duration
			var err error
			switch kind {
			case kindHost, kindDevice:
				d, _, err = r.pass(ctx, s, wait(kind))
			case kindPresent:
				d, _, err = r.present(s)
			case kindLoad:
				d, err = r.loadOnly(ctx, s)
			}
			if err != nil {
				return fmt.Errorf("%s: %w", kindNames[kind], err)
			}
			if round > 0 {
				secs[kind] = append(secs[kind], d.Seconds())
			}
		}
	}
	name := func(kind int) string { return fmt.Sprintf("%v: %s", s, kindNames[kind]) }
	host := res.Add(name(kindHost), "s", secs[kindHost], "")
	dev := res.Add(name(kindDevice), "s", secs[kindDevice], name(kindHost))
	res.Add(name(kindPresent), "s", secs[kindPresent], "")
	res.Add(name(kindLoad), "s", secs[kindLoad], "")
	log.Printf("%v: host wait %.2f ms (%.2f-%.2f), device wait %.2f ms (%.2f-%.2f): host/device %.3f",
		s, host.Median*1e3, host.Min*1e3, host.Max*1e3, dev.Median*1e3, dev.Min*1e3, dev.Max*1e3, dev.Ratio)
	return nil
}

// notes say what was run and what a row's figures are.
func notes(k config, info cudastream.Info, library string) []string {
	c := k.c
	return []string{
		fmt.Sprintf("%s shapes (%d layers), seeded bf16 weights, blocks of %d tokens (%d KiB, block-first layout); device %s, cuBLAS %s",
			c.Name, c.Layers, c.BlockTokens, c.BlockBytes()>>10, info.Name, library),
		fmt.Sprintf("loads: kvtier's copy engine (kvtier/transfer, MethodAuto, gather staging %s) from a pinned host pool (cuMemHostAlloc) into the model's KV region, one onboard per pass, per-layer events",
			bytesize.Format(k.gatherStaging)),
		"host wait: before each layer the host blocks in Transfer.WaitLayer (what the server's Lease.WaitLayer calls); device wait: the model's stream waits on Transfer.LayerEvent (cuStreamWaitEvent) and the host enqueues every layer at once",
		"seconds: one pass, from the onboard's submission to the logits on the host; compute only: the same pass with the prefix already present; load only: the onboard alone, submission to completion; each kind once to warm up, then the runs, kinds in rotating order",
		"ratio of the device wait's row: the host wait's median over the device wait's (above 1: the device wait is faster)",
	}
}

func main() {
	log.SetFlags(0)
	f, err := parseFlags(os.Args[1:])
	if err != nil {
		os.Exit(2)
	}
	if err := run(f); err != nil {
		log.Fatalf("layerwait: %v", err)
	}
}
