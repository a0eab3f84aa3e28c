// Gentrace writes a synthetic chat trace (kvtier/trace's generator) for the
// serve benchmark, and prints its size: requests, span, prompt lengths and
// the prefix working set (distinct blocks) in tokens and in KV bytes of a
// model, to compare with the tiers the benchmark gives the server.
//
//	go run ./benchmarks/serve/gentrace -out trace.jsonl -requests 150 -sessions-per-second 0.8
package main

import (
	"bufio"
	"flag"
	"fmt"
	"io"
	"log"
	"os"
	"time"

	"kvtier.dev/internal/bytesize"
	"kvtier.dev/kvtier/cost"
	"kvtier.dev/kvtier/trace"
)

func main() {
	log.SetFlags(0)
	c := trace.DefaultGenConfig()
	out := flag.String("out", "", "trace file to write (native format)")
	modelName := flag.String("model", "llama-3.1-8b", "model whose KV bytes per token size the working set")
	flag.Uint64Var(&c.Seed, "seed", 1, "generator seed")
	flag.IntVar(&c.Requests, "requests", 150, "requests")
	flag.Float64Var(&c.SessionsPerSecond, "sessions-per-second", 0.8, "new conversations per second")
	flag.IntVar(&c.SystemPrompts, "system-prompts", 24, "distinct shared system prompts")
	flag.IntVar(&c.SystemPromptTokens[0], "system-min", 1000, "shortest system prompt, tokens")
	flag.IntVar(&c.SystemPromptTokens[1], "system-max", 6000, "longest system prompt, tokens")
	flag.Float64Var(&c.DocumentFraction, "documents", 0.3, "fraction of conversations opening with a document")
	flag.IntVar(&c.MedianDocumentTokens, "document-tokens", 4000, "median document, tokens")
	flag.Float64Var(&c.MeanTurns, "turns", 4, "mean turns per conversation")
	flag.IntVar(&c.MedianUserTokens, "user-tokens", 250, "median user message, tokens")
	flag.IntVar(&c.MedianOutputTokens, "output-tokens", 150, "median reply, tokens")
	flag.DurationVar(&c.MeanThinkTime, "think", 8*time.Second, "mean pause before the next turn")
	flag.IntVar(&c.MaxContextTokens, "max-context", 16000, "longest prompt, tokens")
	flag.IntVar(&c.BlockTokens, "block-tokens", 16, "tokens per block id")
	flag.Parse()
	if *out == "" {
		log.Fatal("gentrace: -out is required")
	}
	m, err := cost.LookupModel(*modelName)
	if err != nil {
		log.Fatalf("gentrace: -model: %v", err)
	}
	f, err := os.Create(*out)
	if err != nil {
		log.Fatalf("gentrace: %v", err)
	}
	w := bufio.NewWriter(f)
	if err := trace.Generate(w, c, trace.FormatNative); err != nil {
		log.Fatalf("gentrace: %v", err)
	}
	if err := w.Flush(); err != nil {
		log.Fatalf("gentrace: %v", err)
	}
	if err := f.Close(); err != nil {
		log.Fatalf("gentrace: %v", err)
	}
	if err := stats(*out, m.KVBytesPerToken()); err != nil {
		log.Fatalf("gentrace: %v", err)
	}
}

// stats prints the trace's size and its prefix working set.
func stats(path string, bytesPerToken int64) error {
	f, err := trace.Open(path)
	if err != nil {
		return err
	}
	defer f.Close()
	r := trace.NewReader(f, trace.Options{Format: trace.FormatNative, Name: path})
	seen := map[[2]uint64]bool{}
	var req trace.Request
	var n, tokens, maxTok int
	var last time.Duration
	var blockTokens int
	for {
		if err := r.Next(&req); err == io.EOF {
			break
		} else if err != nil {
			return err
		}
		n++
		tokens += req.InputTokens
		maxTok = max(maxTok, req.InputTokens)
		last = req.Arrival
		blockTokens = req.BlockTokens
		for _, k := range req.Keys {
			seen[[2]uint64{req.Salt, k}] = true
		}
	}
	ws := int64(len(seen)) * int64(blockTokens)
	fmt.Printf("%d requests over %v; prompts: mean %d tokens, max %d; prefix working set %d blocks of %d tokens = %d tokens = %s of KV at %d bytes/token\n",
		n, last.Round(time.Second), tokens/max(n, 1), maxTok, len(seen), blockTokens, ws, bytesize.Format(ws*bytesPerToken&^(1<<20-1)), bytesPerToken)
	return nil
}
