package trace

import (
	"bytes"
	"io"
	"strings"
	"testing"
	"time"
)

// TestBundledMatchesGenerator: the embedded trace is exactly what the
// generator makes from DefaultGenConfig, so `go generate` reproduces it.
func TestBundledMatchesGenerator(t *testing.T) {
	embedded, err := io.ReadAll(Bundled())
	if err != nil {
		t.Fatal(err)
	}
	var fresh bytes.Buffer
	if err := Generate(&fresh, DefaultGenConfig(), FormatMooncake); err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(embedded, fresh.Bytes()) {
		t.Fatalf("the bundled trace (%d bytes) differs from the generator's output (%d bytes): run go generate ./kvtier/trace",
			len(embedded), fresh.Len())
	}
}

func TestGeneratorDeterministicPerSeed(t *testing.T) {
	cfg := DefaultGenConfig()
	cfg.Requests = 500
	gen := func(seed uint64) []byte {
		cfg.Seed = seed
		var buf bytes.Buffer
		if err := Generate(&buf, cfg, FormatNative); err != nil {
			t.Fatal(err)
		}
		return buf.Bytes()
	}
	a, b, c := gen(7), gen(7), gen(8)
	if !bytes.Equal(a, b) {
		t.Error("the same seed gave different traces")
	}
	if bytes.Equal(a, c) {
		t.Error("different seeds gave the same trace")
	}
}

// TestBundledWorkloadShape checks the mix the generator promises on the
// bundled trace: arrival order, multi-turn prefix growth, shared system
// prompts, and the request rate.
func TestBundledWorkloadShape(t *testing.T) {
	r := NewReader(Bundled(), Options{Format: FormatMooncake, Name: BundledName})
	var req Request
	var refs, reused, inputTokens, outputTokens int
	seen := map[uint64]int{} // id -> requests that used it
	var last time.Duration
	for {
		err := r.Next(&req)
		if err == io.EOF {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		refs += len(req.Keys)
		inputTokens += req.InputTokens
		outputTokens += req.OutputTokens
		for _, k := range req.Keys {
			if seen[k] > 0 {
				reused++
			}
			seen[k]++
		}
		last = req.Arrival
	}
	n := r.Requests()
	cfg := DefaultGenConfig()
	if n != cfg.Requests {
		t.Fatalf("%d requests, want %d", n, cfg.Requests)
	}
	hot := 0 // ids used by 50 requests or more: the popular system prompts
	for _, c := range seen {
		if c >= 50 {
			hot++
		}
	}
	meanIn, meanOut := inputTokens/n, outputTokens/n
	rate := float64(n) / last.Seconds()
	reuse := float64(reused) / float64(refs)
	t.Logf("%d requests over %v (%.2f/s), %d block refs, %d ids (%d hot), mean input %d, mean output %d, reuse %.3f",
		n, last.Round(time.Second), rate, refs, len(seen), hot, meanIn, meanOut, reuse)
	switch {
	case meanIn < 4000 || meanIn > 16000:
		t.Errorf("mean input %d tokens, want 4,000-16,000", meanIn)
	case meanOut < 100 || meanOut > 400:
		t.Errorf("mean output %d tokens, want 100-400", meanOut)
	case rate < 0.6*cfg.SessionsPerSecond*cfg.MeanTurns || rate > 1.4*cfg.SessionsPerSecond*cfg.MeanTurns:
		t.Errorf("%.2f requests/s, want about SessionsPerSecond x MeanTurns = %.2f", rate, cfg.SessionsPerSecond*cfg.MeanTurns)
	case reuse < 0.5 || reuse > 0.9:
		t.Errorf("%.2f of block references reuse an earlier block, want 0.5-0.9", reuse)
	case hot < 5:
		t.Errorf("%d ids shared by 50+ requests, want the popular system prompts' blocks", hot)
	}
}

func TestGenConfigValidate(t *testing.T) {
	cases := []struct {
		field string
		edit  func(*GenConfig)
	}{
		{"Requests", func(c *GenConfig) { c.Requests = -1 }},
		{"SessionsPerSecond", func(c *GenConfig) { c.SessionsPerSecond = 0 }},
		{"SystemPrompts", func(c *GenConfig) { c.SystemPrompts = 0 }},
		{"SystemPromptZipf", func(c *GenConfig) { c.SystemPromptZipf = 1 }},
		{"SystemPromptTokens", func(c *GenConfig) { c.SystemPromptTokens = [2]int{10, 5} }},
		{"DocumentFraction", func(c *GenConfig) { c.DocumentFraction = 1.5 }},
		{"MedianDocumentTokens", func(c *GenConfig) { c.MedianDocumentTokens = 0 }},
		{"MeanTurns", func(c *GenConfig) { c.MeanTurns = 0.5 }},
		{"MedianUserTokens", func(c *GenConfig) { c.MedianUserTokens = 0 }},
		{"MedianOutputTokens", func(c *GenConfig) { c.MedianOutputTokens = 0 }},
		{"MeanThinkTime", func(c *GenConfig) { c.MeanThinkTime = -1 }},
		{"MaxContextTokens", func(c *GenConfig) { c.MaxContextTokens = 100 }},
		{"BlockTokens", func(c *GenConfig) { c.BlockTokens = 0 }},
		{"BlockTokens", func(c *GenConfig) { c.BlockTokens = MaxBlockTokens + 1 }},
	}
	for _, c := range cases {
		cfg := DefaultGenConfig()
		c.edit(&cfg)
		_, err := NewGenerator(cfg)
		if err == nil || !strings.Contains(err.Error(), "GenConfig."+c.field+" ") {
			t.Errorf("%s: error %v, want one naming the field", c.field, err)
		}
	}
}

// TestGeneratedReaderMatchesGenerate: the streaming reader gives the bytes
// Generate writes, read in odd-sized pieces; a mooncake trace with blocks
// other than 512 tokens is refused.
func TestGeneratedReaderMatchesGenerate(t *testing.T) {
	for _, c := range []struct {
		cfg    GenConfig
		format Format
	}{{DefaultGenConfig(), FormatMooncake}, {AgenticGenConfig(), FormatNative}} {
		c.cfg.Requests = 300
		var want bytes.Buffer
		if err := Generate(&want, c.cfg, c.format); err != nil {
			t.Fatal(err)
		}
		r, err := NewGeneratedReader(c.cfg, c.format)
		if err != nil {
			t.Fatal(err)
		}
		var got bytes.Buffer
		buf := make([]byte, 777)
		for {
			n, err := r.Read(buf)
			got.Write(buf[:n])
			if err == io.EOF {
				break
			}
			if err != nil {
				t.Fatal(err)
			}
		}
		if !bytes.Equal(got.Bytes(), want.Bytes()) {
			t.Errorf("%v: the reader's %d bytes differ from Generate's %d", c.format, got.Len(), want.Len())
		}
	}
	if _, err := NewGeneratedReader(AgenticGenConfig(), FormatMooncake); err == nil || !strings.Contains(err.Error(), "BlockTokens") {
		t.Errorf("64-token blocks as mooncake: %v", err)
	}
}

// TestAgenticShape: the agentic workload's sessions grow past 100K tokens
// in 64-token blocks, and each turn shares all but its tail with the last.
func TestAgenticShape(t *testing.T) {
	g, err := NewGenerator(AgenticGenConfig())
	if err != nil {
		t.Fatal(err)
	}
	var r Request
	longest, over100K := 0, 0
	for g.Next(&r) != io.EOF {
		if r.BlockTokens != 64 || len(r.Keys) != (r.InputTokens+63)/64 {
			t.Fatalf("%d tokens in %d blocks of %d", r.InputTokens, len(r.Keys), r.BlockTokens)
		}
		longest = max(longest, r.InputTokens)
		if r.InputTokens > 100_000 {
			over100K++
		}
	}
	if longest < 150_000 || over100K < 100 {
		t.Errorf("longest session %d tokens, %d requests over 100K; want sessions past 100K", longest, over100K)
	}
}
