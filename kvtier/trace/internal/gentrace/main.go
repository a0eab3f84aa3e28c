// Command gentrace writes a synthetic trace from kvtier/trace's generator.
// With no flags it regenerates the bundled trace's content; `go generate
// ./kvtier/trace` runs it to rewrite bundled/synthetic.jsonl.gz.
//
//	go run ./kvtier/trace/internal/gentrace -o bundled/synthetic.jsonl.gz
//	go run ./kvtier/trace/internal/gentrace -requests 1000000 -o /tmp/1m.jsonl
package main

import (
	"compress/gzip"
	"flag"
	"fmt"
	"io"
	"os"
	"strings"

	"kvtier.dev/kvtier/trace"
)

func main() {
	def := trace.DefaultGenConfig()
	seed := flag.Uint64("seed", def.Seed, "random seed")
	requests := flag.Int("requests", def.Requests, "number of requests")
	rate := flag.Float64("sessions-per-second", def.SessionsPerSecond, "arrival rate of conversations")
	format := flag.String("format", "mooncake", "output format: mooncake or native")
	out := flag.String("o", "-", "output file (gzip-compressed if it ends in .gz); - is stdout")
	flag.Parse()
	if err := run(*seed, *requests, *rate, *format, *out); err != nil {
		fmt.Fprintln(os.Stderr, "gentrace:", err)
		os.Exit(1)
	}
}

func run(seed uint64, requests int, rate float64, formatName, out string) error {
	cfg := trace.DefaultGenConfig()
	cfg.Seed, cfg.Requests, cfg.SessionsPerSecond = seed, requests, rate
	format, err := trace.ParseFormat(formatName)
	if err != nil {
		return err
	}
	var w io.Writer = os.Stdout
	var f *os.File
	if out != "-" {
		if f, err = os.Create(out); err != nil {
			return err
		}
		defer f.Close()
		w = f
	}
	var zw *gzip.Writer
	if strings.HasSuffix(out, ".gz") {
		zw, _ = gzip.NewWriterLevel(w, gzip.BestCompression)
		w = zw
	}
	if err := trace.Generate(w, cfg, format); err != nil {
		return err
	}
	if zw != nil {
		if err := zw.Close(); err != nil {
			return err
		}
	}
	if f != nil {
		return f.Close()
	}
	return nil
}
