package main

import (
	"bytes"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"kvtier.dev/internal/benchserve"
	"kvtier.dev/internal/openai"
)

// plainServer is an OpenAI-compatible completions server that is not
// kvtier's: it streams max_tokens tokens (the prompt's length plus the
// position, mod 256), reports usage without the per-tier split (as vLLM
// does), and, with differ, answers requests that do not ask for no_cache
// with a different last token.
func plainServer(t *testing.T, differ bool) string {
	t.Helper()
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		var req openai.CompletionRequest
		if r.URL.Path != openai.CompletionsPath || json.NewDecoder(r.Body).Decode(&req) != nil || req.MaxTokens == nil {
			http.Error(w, "bad request", http.StatusBadRequest)
			return
		}
		w.Header().Set("Content-Type", "text/event-stream")
		n := len(req.Prompt.Tokens)
		for i := range *req.MaxTokens {
			tok := int32((n + i) % 256)
			if differ && !req.NoCache && i == *req.MaxTokens-1 {
				tok++
			}
			fmt.Fprintf(w, "data: {\"choices\":[{\"index\":0,\"text\":\"x\",\"token_ids\":[%d],\"finish_reason\":null}]}\n\n", tok)
		}
		fmt.Fprintf(w, "data: {\"choices\":[],\"usage\":{\"prompt_tokens\":%d,\"completion_tokens\":%d,\"total_tokens\":0,\"prompt_tokens_details\":{\"cached_tokens\":%d}}}\n\n",
			n, *req.MaxTokens, n/2)
		fmt.Fprint(w, "data: [DONE]\n\n")
	}))
	t.Cleanup(srv.Close)
	return srv.URL
}

// writeBenchTrace writes a native trace of n small requests.
func writeBenchTrace(t *testing.T, n int) string {
	t.Helper()
	var buf bytes.Buffer
	for i := range n {
		fmt.Fprintf(&buf, `{"arrival_us":%d,"block_tokens":16,"input_tokens":20,"output_tokens":3,"keys":[1,%d]}`+"\n", i*100, i+2)
	}
	path := filepath.Join(t.TempDir(), "trace.jsonl")
	if err := os.WriteFile(path, buf.Bytes(), 0o644); err != nil {
		t.Fatal(err)
	}
	return path
}

func runBenchServeArgs(t *testing.T, args ...string) (code int, stdout, stderr string) {
	t.Helper()
	var out, errb bytes.Buffer
	code = run(append([]string{"bench-serve"}, args...), &out, &errb)
	return code, out.String(), errb.String()
}

// TestBenchServeCommand: the table, the JSON and the plots against a
// server that is not kvtier's.
func TestBenchServeCommand(t *testing.T) {
	url := plainServer(t, false)
	path := writeBenchTrace(t, 12)
	code, out, errs := runBenchServeArgs(t, "--url", url, "--trace", path, "--verify", "3")
	if code != 0 || errs != "" {
		t.Fatalf("exit %d: %s", code, errs)
	}
	for _, want := range []string{"bench-serve " + url + openai.CompletionsPath, "12 sent, 12 completed", "TTFT", "inter-token",
		"p99", "cached prompt tokens: 120 of 240 (50.0%) from 12 usage reports", "verify (every 3): 4 compared, 0 differ",
		"agreement: 1.0000 of answers token for token, 1.0000 with near ties, over 12 reference tokens; of the 4 that reused 10-10 cached prompt tokens: 1.0000, 1.0000 with near ties"} {
		if !strings.Contains(out, want) {
			t.Errorf("report lacks %q:\n%s", want, out)
		}
	}
	dir := filepath.Join(t.TempDir(), "plots")
	code, out, errs = runBenchServeArgs(t, "--url", url+openai.CompletionsPath, "--trace", path, "--concurrency", "2", "--json", "--plot", dir)
	if code != 0 || !strings.Contains(errs, "wrote ") {
		t.Fatalf("exit %d: %s", code, errs)
	}
	var rep benchserve.Report
	if err := json.Unmarshal([]byte(out), &rep); err != nil {
		t.Fatal(err)
	}
	if rep.Completed != 12 || rep.CompletionTokens != 36 || rep.Cache.CachedTokens != 120 || rep.Cache.RequestsWithTiers != 0 ||
		rep.TTFT.P50 <= 0 || rep.Load != "concurrency 2" || rep.Prompts.Vocab != 256 {
		t.Fatalf("%+v", rep)
	}
	for _, f := range []string{"ttft.svg", "ttft.png", "inter-token.svg", "inter-token.png"} {
		if st, err := os.Stat(filepath.Join(dir, f)); err != nil || st.Size() == 0 {
			t.Errorf("%s: %v", f, err)
		}
	}
}

// TestBenchServeProgress: --progress always draws the bar on stderr (here
// not a terminal) and leaves the report on stdout.
func TestBenchServeProgress(t *testing.T) {
	code, out, errs := runBenchServeArgs(t, "--url", plainServer(t, false), "--trace", writeBenchTrace(t, 5),
		"--requests", "5", "--progress", "always")
	if code != 0 || !strings.Contains(errs, "serving") || !strings.Contains(out, "5 sent, 5 completed") {
		t.Fatalf("exit %d\nstdout %s\nstderr %q", code, out, errs)
	}
}

// TestBenchServeVerifyExitStatus: differences found by --verify are
// reported and make the exit status 1.
func TestBenchServeVerifyExitStatus(t *testing.T) {
	code, out, errs := runBenchServeArgs(t, "--url", plainServer(t, true), "--trace", writeBenchTrace(t, 8), "--verify", "4")
	if code != 1 || !strings.Contains(errs, "2 of 2 cached answers differ") ||
		!strings.Contains(out, "request 3: first difference at token 2") {
		t.Fatalf("exit %d\nstdout %s\nstderr %s", code, out, errs)
	}
}

func TestBenchServeBadFlags(t *testing.T) {
	path := writeBenchTrace(t, 2)
	bad := filepath.Join(t.TempDir(), "bad.jsonl")
	if err := os.WriteFile(bad, []byte(`{"arrival_us":0,"block_tokens":16,"input_tokens":3,"output_tokens":1,"keys":[1]}`+"\n"+`{"arrival_us":1}`+"\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	url := plainServer(t, false)
	cases := []struct {
		args []string
		want string
	}{
		{[]string{"--trace", path}, "--url is required"},
		{[]string{"--url", "ftp://x"}, `--url "ftp://x": want an http:// or https:// URL`},
		{[]string{"--url", "http://"}, "no host"},
		{[]string{"--url", "http://a b"}, `--url "http://a b"`},
		{[]string{"--url", url, "--speed", "0"}, "--speed 0: want a number above 0"},
		{[]string{"--url", url, "--speed", "-2"}, "--speed -2: want a number above 0"},
		{[]string{"--url", url, "--speed", "NaN"}, "--speed NaN"},
		{[]string{"--url", url, "--speed", "+Inf"}, "--speed +Inf"},
		{[]string{"--url", url, "--speed", "2", "--concurrency", "2"}, "--concurrency ignores"},
		{[]string{"--url", url, "--concurrency", "-1"}, "--concurrency -1: want 0"},
		{[]string{"--url", url, "--requests", "-1"}, "--requests -1: want 0"},
		{[]string{"--url", url, "--duration", "-1s"}, "--duration -1s: want 0"},
		{[]string{"--url", url, "--timeout", "0s"}, "--timeout 0s: want more than 0"},
		{[]string{"--url", url, "--verify", "-3"}, "--verify -3: want 0"},
		{[]string{"--url", url, "--verify-logprobs", "21"}, "--verify-logprobs 21: want 0 to 20"},
		{[]string{"--url", url, "--verify-tolerance", "-0.1"}, "--verify-tolerance -0.1: want 0"},
		{[]string{"--url", url, "--verify-tolerance", "NaN"}, "--verify-tolerance NaN"},
		{[]string{"--url", url, "--vocab", "0"}, "--vocab 0: want 1 to 2147483647"},
		{[]string{"--url", url, "--vocab", "3000000000"}, "--vocab 3000000000"},
		{[]string{"--url", url, "--block-tokens", "-1"}, "--block-tokens -1"},
		{[]string{"--url", url, "--block-tokens", "70000"}, "--block-tokens 70000: want 0 (the trace's) to 65536"},
		{[]string{"--url", url, "--max-prompt-tokens", "-1"}, "--max-prompt-tokens -1"},
		{[]string{"--url", url, "--max-tokens", "-1"}, "--max-tokens -1"},
		{[]string{"--url", url, "--progress", "sometimes"}, `--progress "sometimes": want auto, always or never`},
		{[]string{"--url", url, "--format", "csv"}, `--format: trace: unknown format "csv"`},
		{[]string{"--url", url, "--trace", filepath.Join(t.TempDir(), "none.jsonl")}, "--trace: trace: open"},
		{[]string{"--url", url, "--trace", path, "extra"}, `unexpected argument "extra"`},
		{[]string{"--url", url, "--concurrency", "x"}, `invalid value "x" for flag -concurrency`},
		{[]string{"--url", url, "--trace", bad}, "bad.jsonl:2: block_tokens: missing"},
	}
	for _, c := range cases {
		code, out, errs := runBenchServeArgs(t, c.args...)
		if code != 2 || !strings.Contains(errs, c.want) || out != "" {
			t.Errorf("%v: exit %d, stderr %q, want 2 and %q", c.args, code, errs, c.want)
		}
	}
	if code, _, errs := runBenchServeArgs(t, "-h"); code != 0 || !strings.Contains(errs, "usage: kvtier bench-serve") {
		t.Errorf("-h: exit %d: %s", code, errs)
	}
}
