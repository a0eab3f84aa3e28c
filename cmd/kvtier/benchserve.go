package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"time"

	"github.com/schollz/progressbar/v3"

	"kvtier.dev/internal/benchserve"
	"kvtier.dev/internal/openai"
	"kvtier.dev/kvtier/trace"
)

func init() {
	register(command{name: "bench-serve", summary: "replay a trace against an OpenAI-compatible completions server and report TTFT", run: runBenchServe})
}

// benchServeArgs is bench-serve's parsed command line.
type benchServeArgs struct {
	cfg      benchserve.Config
	json     bool
	plotDir  string
	progress string
}

func runBenchServe(args []string, stdout, stderr io.Writer) int {
	a, err := benchServeParse(args, stderr)
	if errors.Is(err, flag.ErrHelp) {
		return 0
	}
	if err != nil {
		fmt.Fprintf(stderr, "kvtier bench-serve: %v\n", err)
		return 2
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	var bar *progressbar.ProgressBar
	if showProgress(a.progress, stderr) {
		total := int64(-1)
		if a.cfg.Requests > 0 {
			total = int64(a.cfg.Requests)
		}
		bar = progressbar.NewOptions64(total, progressbar.OptionSetWriter(stderr), progressbar.OptionSetDescription("serving"),
			progressbar.OptionShowCount(), progressbar.OptionSetItsString("req"), progressbar.OptionShowIts(),
			progressbar.OptionClearOnFinish())
		a.cfg.OnDone = func() { bar.Add(1) }
	}
	rep, err := benchserve.Run(ctx, a.cfg)
	if bar != nil {
		bar.Finish()
	}
	if err != nil {
		fmt.Fprintf(stderr, "kvtier bench-serve: %v\n", err)
		var le *trace.LineError
		if errors.As(err, &le) {
			return 2
		}
		return 1
	}
	if a.plotDir != "" {
		files, err := rep.Plot(a.plotDir)
		if err != nil {
			fmt.Fprintf(stderr, "kvtier bench-serve: --plot %s: %v\n", a.plotDir, err)
			return 1
		}
		fmt.Fprintf(stderr, "kvtier bench-serve: wrote %s\n", strings.Join(files, ", "))
	}
	if a.json {
		err = rep.WriteJSON(stdout)
	} else {
		err = rep.WriteText(stdout)
	}
	if err != nil {
		fmt.Fprintf(stderr, "kvtier bench-serve: %v\n", err)
		return 1
	}
	if v := rep.Verify; v != nil && v.Differences > 0 {
		fmt.Fprintf(stderr, "kvtier bench-serve: --verify: %d of %d cached answers differ from their no-cache reference (%d more differed at a near tie)\n",
			v.Differences, v.Compared, v.Ties)
		return 1
	}
	return 0
}

func benchServeParse(args []string, stderr io.Writer) (benchServeArgs, error) {
	fs := flag.NewFlagSet("kvtier bench-serve", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.Usage = func() {
		fmt.Fprintf(stderr, `usage: kvtier bench-serve --url URL [--trace FILE] [flags]

Replays a request trace (Mooncake or native; the bundled one by default)
against an OpenAI-compatible completions endpoint: kvtier's server, vLLM,
SGLang. Each trace block becomes a fixed run of token ids (from its key and
salt), so requests that share a prefix in the trace send the same prompt
prefix. Requests are streamed and greedy (temperature 0); the report gives
TTFT and inter-token latency percentiles, throughput, errors by status, and
the cached prompt tokens per tier that the server reports in usage.

Requests arrive at the trace's times (compressed by --speed) or, with
--concurrency N, from N clients each sending its next request when the last
is answered. --verify N sends every Nth request again with "no_cache": true
(see internal/openai) and compares the greedy tokens. Both ask for logprobs
(--verify-logprobs), so that a first differing token that was a near tie in
both answers (the other's token within --verify-tolerance nats of its own:
bf16 rounding of KV computed in passes of other shapes flips such ties) is
reported apart; any other difference is reported and the exit status is 1.

flags:
`)
		fs.PrintDefaults()
	}
	var c benchserve.Config
	fs.StringVar(&c.URL, "url", "", "the server: a base URL such as http://127.0.0.1:8080 (then "+openai.CompletionsPath+" is appended) or the endpoint's full URL (required)")
	tracePath := fs.String("trace", "", "trace file (JSONL, gzip-compressed or not); default: the bundled synthetic trace")
	format := fs.String("format", "auto", "trace format: auto, mooncake or native")
	fs.BoolVar(&c.SkipBad, "skip-bad", false, "skip malformed trace lines instead of stopping at the first")
	fs.StringVar(&c.Model, "model", "", "the model field of each request (vLLM and SGLang want the served model's name)")
	fs.Float64Var(&c.Speed, "speed", 1, "divide the trace's arrival times by this (2: twice as fast)")
	fs.IntVar(&c.Concurrency, "concurrency", 0, "N clients sending back to back, ignoring the trace's times (0: the trace's arrivals)")
	fs.IntVar(&c.Requests, "requests", 0, "send at most this many requests (0: the whole trace)")
	fs.DurationVar(&c.Duration, "duration", 0, "stop after this long, cancelling requests in flight (0: no limit)")
	fs.DurationVar(&c.Timeout, "timeout", 10*time.Minute, "give up on one request after this long (counted as an error)")
	fs.IntVar(&c.Verify, "verify", 0, "send every Nth request again with no cache and compare the greedy tokens (0: off)")
	fs.IntVar(&c.VerifyLogprobs, "verify-logprobs", 5, "with --verify, the most likely tokens per position both answers ask for (logprobs), to tell near ties (0: none, every differing token is a difference)")
	fs.Float64Var(&c.VerifyTolerance, "verify-tolerance", benchserve.DefaultVerifyTolerance, "with --verify, a first differing token is a near tie when each answer's token beats the other's by at most this many nats (default: about twice the largest drift of a shared token measured between cached and no-cache answers on the H200, 0.055)")
	fs.BoolVar(&c.PerRequest, "per-request", false, "add one record per request (arrival, send time, TTFT, cached tokens per tier) to the --json report")
	fs.IntVar(&c.Vocab, "vocab", openai.ByteVocab, "prompt token ids are drawn from [0, vocab)")
	fs.IntVar(&c.BlockTokens, "block-tokens", 0, "tokens a trace block becomes in the prompts sent (0: the trace's, 512 for Mooncake); smaller shrinks prompts in proportion and keeps their shared prefixes")
	fs.IntVar(&c.MaxPromptTokens, "max-prompt-tokens", 0, "cut prompts to this many tokens (0: no limit); the cut ones are counted")
	fs.IntVar(&c.MaxTokens, "max-tokens", 0, "cap each request's max_tokens (0: the trace's output length)")
	fs.Uint64Var(&c.Seed, "seed", 0, "seed of the token ids a block becomes")
	jsonOut := fs.Bool("json", false, "print the report as JSON")
	plotDir := fs.String("plot", "", "write TTFT and inter-token latency plots (SVG and PNG) into this directory")
	progress := fs.String("progress", "auto", "progress bar on stderr: auto (on a terminal), always or never")
	if err := fs.Parse(args); err != nil {
		return benchServeArgs{}, err
	}
	a := benchServeArgs{json: *jsonOut, plotDir: *plotDir, progress: *progress}
	if fs.NArg() > 0 {
		return a, fmt.Errorf("unexpected argument %q (the trace is --trace FILE)", fs.Arg(0))
	}
	set := map[string]bool{}
	fs.Visit(func(f *flag.Flag) { set[f.Name] = true })
	if set["speed"] && c.Concurrency > 0 {
		return a, errors.New("--speed applies to the trace's arrivals, which --concurrency ignores: give one of them")
	}
	switch a.progress {
	case "auto", "always", "never":
	default:
		return a, fmt.Errorf("--progress %q: want auto, always or never", a.progress)
	}
	var err error
	if c.Format, err = trace.ParseFormat(*format); err != nil {
		return a, fmt.Errorf("--format: %w", err)
	}
	if *tracePath == "" {
		c.BundledTrace()
	} else {
		// Open the trace now, so that a missing file is a flag error.
		f, err := trace.Open(*tracePath)
		if err != nil {
			return a, fmt.Errorf("--trace: %w", err)
		}
		f.Close()
		c.FileTrace(*tracePath)
	}
	if err := c.Validate(); err != nil {
		return a, err
	}
	a.cfg = c
	return a, nil
}
