package main

import (
	"bytes"
	"encoding/json"
	"io"
	"os"
	"path/filepath"
	"runtime/debug"
	"slices"
	"strings"
	"testing"
	"time"

	"kvtier.dev/kvtier/replay"
	"kvtier.dev/kvtier/trace"
)

// replayQuick reports whether the tests run with the invariants build tag,
// under which the block manager checks its whole state on almost every
// operation: the replays then use the first requests of the bundled trace
// and small tiers (quickArgs).
func replayQuick() bool {
	bi, ok := debug.ReadBuildInfo()
	if !ok {
		return false
	}
	for _, s := range bi.Settings {
		if s.Key == "-tags" && slices.Contains(strings.Split(s.Value, ","), "invariants") {
			return true
		}
	}
	return false
}

// quickArgs are the flags that make a replay small in quick mode, nil
// otherwise.
func quickArgs(t *testing.T) []string {
	t.Helper()
	if !replayQuick() {
		return nil
	}
	all, err := io.ReadAll(trace.Bundled())
	if err != nil {
		t.Fatal(err)
	}
	lines := bytes.SplitAfter(all, []byte("\n"))
	path := filepath.Join(t.TempDir(), "first.jsonl")
	if err := os.WriteFile(path, bytes.Join(lines[:200], nil), 0o644); err != nil {
		t.Fatal(err)
	}
	return []string{"--trace", path, "--gpu-kv", "16GiB", "--host", "16GiB", "--nvme", "64GiB"}
}

func runReplayArgs(t *testing.T, args ...string) (code int, stdout, stderr string) {
	t.Helper()
	var out, errb bytes.Buffer
	code = run(append([]string{"replay"}, args...), &out, &errb)
	return code, out.String(), errb.String()
}

// TestReplayDefault is the README's first command: the bundled trace on the
// default configuration, every strategy.
func TestReplayDefault(t *testing.T) {
	code, out, errs := runReplayArgs(t, quickArgs(t)...)
	if code != 0 {
		t.Fatalf("exit %d: %s", code, errs)
	}
	wants := []string{"bundled:synthetic.jsonl", "3000 requests", "llama-3.1-8b on h200", "cost", "reload",
		"recompute", "gpu-only", "none", "TTFT p50"}
	if replayQuick() {
		wants = wants[2:]
	}
	for _, want := range wants {
		if !strings.Contains(out, want) {
			t.Errorf("output lacks %q:\n%s", want, out)
		}
	}
	if errs != "" {
		t.Errorf("stderr not empty (a progress bar off a terminal?): %q", errs)
	}
}

// TestReplayJSONDeterministic: the same flags give byte-identical JSON,
// and the JSON carries the configuration the flags set.
func TestReplayJSONDeterministic(t *testing.T) {
	args := append(quickArgs(t), "--json", "--host", "64GiB", "--policy", "s3fifo", "--baselines=false", "--sweep-host", "0,32GiB")
	var outs [2]string
	for i := range outs {
		code, out, errs := runReplayArgs(t, args...)
		if code != 0 {
			t.Fatalf("exit %d: %s", code, errs)
		}
		outs[i] = out
	}
	if outs[0] != outs[1] {
		t.Fatal("two runs gave different JSON")
	}
	var rep replay.Report
	if err := json.Unmarshal([]byte(outs[0]), &rep); err != nil {
		t.Fatal(err)
	}
	if rep.Config.HostBytes != 64<<30 || rep.Config.Policy != "s3fifo" || len(rep.Results) != 1 || len(rep.HostSweep) != 2 {
		t.Errorf("config %+v, %d results, %d sweep points", rep.Config, len(rep.Results), len(rep.HostSweep))
	}
}

func TestReplayConfigFileAndOverrides(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "cfg.json")
	if err := os.WriteFile(path, []byte(`{"decode_token_time": "20ms", "policy": "2q", "baselines": false}`), 0o644); err != nil {
		t.Fatal(err)
	}
	code, out, errs := runReplayArgs(t, append(quickArgs(t), "--config", path, "--policy", "lru", "--json")...)
	if code != 0 {
		t.Fatalf("exit %d: %s", code, errs)
	}
	var rep replay.Report
	if err := json.Unmarshal([]byte(out), &rep); err != nil {
		t.Fatal(err)
	}
	if rep.Config.DecodeTokenTime.String() != "20ms" || rep.Config.Policy != "lru" || rep.Config.Baselines {
		t.Errorf("file then flags gave %+v", rep.Config)
	}
	if err := os.WriteFile(path, []byte(`{"host_bytes": "32GiB", "polcy": "2q"}`), 0o644); err != nil {
		t.Fatal(err)
	}
	code, _, errs = runReplayArgs(t, "--config", path)
	if code != 2 || !strings.Contains(errs, "polcy") {
		t.Errorf("unknown field: exit %d, %q", code, errs)
	}
	// A file holding null does not run on the defaults.
	if err := os.WriteFile(path, []byte("null\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	code, out, errs = runReplayArgs(t, "--config", path)
	if code != 2 || !strings.Contains(errs, "found null") || out != "" {
		t.Errorf("config null: exit %d, %q", code, errs)
	}
}

func TestReplayBadInput(t *testing.T) {
	dir := t.TempDir()
	bad := filepath.Join(dir, "bad.jsonl")
	if err := os.WriteFile(bad, []byte(`{"timestamp": 0, "input_length": 10, "output_length": 1, "hash_ids": [1]}
{"timestamp": 1, "input_length": -10, "output_length": 1, "hash_ids": []}
`), 0o644); err != nil {
		t.Fatal(err)
	}
	allBad := filepath.Join(dir, "allbad.jsonl")
	if err := os.WriteFile(allBad, []byte("{}\n[1]\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	cases := []struct {
		args []string
		want string
	}{
		{[]string{"--trace", bad}, "bad.jsonl:2: input_length: negative"},
		{[]string{"--trace", filepath.Join(dir, "absent.jsonl")}, "absent.jsonl"},
		{[]string{"--gpu-kv", "lots"}, "gpu-kv"},
		{[]string{"--model", "gpt-9"}, "model"},
		{[]string{"--strategy", "magic"}, "strategy"},
		{[]string{"--format", "csv"}, "csv"},
		{[]string{"--sweep-host", "1GiB,x"}, "sweep-host"},
		{[]string{"--progress", "sometimes"}, "progress"},
		{[]string{"--model", "llama-3.1-70b"}, "gpu_bytes: does not fit in GPU memory: llama-3.1-70b's weights take 141.2 GB"},
		{[]string{"--gpu-kv", "130GB"}, "at most 124.9 GB of KV fits"},
		{[]string{"--gpu-memory", "-1"}, "gpu-memory"},
		{[]string{"--generate", "poetry"}, `--generate "poetry"`},
		{[]string{"--generate", "chat", "--trace", bad}, "--generate and --trace"},
		{[]string{"--requests", "5"}, "need --generate"},
		{[]string{"--generate", "agentic", "--requests", "-1"}, "--requests -1"},
		{[]string{"--generate", "agentic", "--sessions-per-second", "-2"}, "--sessions-per-second -2"},
		{[]string{"--cpuprofile", filepath.Join(dir, "absent", "cpu.prof")}, "--cpuprofile"},
		{[]string{"extra"}, "unexpected argument"},
		{[]string{"--memory-budget", "-1GiB"}, "memory"},
		{[]string{"--decode-token-time", "2540400h"}, "decode_token_time"},
		{[]string{"--handling-time", "-1ms"}, "handling_time: -1ms is negative"},
		{[]string{"--handling-token-time", "-1ns"}, "handling_token_time: -1ns is negative"},
		{[]string{"--handling-token-time", "2540400h"}, "input_length"},
		{[]string{"--plot", bad}, "--plot " + bad},
		{[]string{"--trace", allBad, "--skip-bad"}, "all 2 lines were malformed and skipped"},
		{[]string{"--remote", "16GiB"}, "--remote needs --remote-link"},
		{[]string{"--remote-link", remoteLinkFile}, "--remote-link without --remote"},
		{[]string{"--remote", "16GiB,x", "--remote-link", remoteLinkFile}, "--remote: "},
		{[]string{"--remote", "16GiB", "--remote-link", bad}, "--remote-link: " + bad},
		{[]string{"--decode-on-gpu", "--prefill-slots", "2"}, "decode_on_gpu: needs prefill_slots 1"},
		{[]string{"--max-batch", "4"}, "max_batch: 4 without decode_on_gpu"},
		{[]string{"--decode-on-gpu", "--max-batch", "-1"}, "max_batch: -1 is negative"},
		{[]string{"--requests-out", filepath.Join(dir, "absent", "requests.jsonl")}, "--requests-out"},
		{[]string{"--host-codec", "auto", "--codec-error-budget", "x"}, `invalid value "x" for flag -codec-error-budget`},
		{[]string{"--host-codec", "auto", "--codec-error-budget", "1"}, "codec_error_budget: 1: must be at least 0 and below 1"},
		{[]string{"--codec-error-budget", "0.1"}, "codec_error_budget: without host_codec auto"},
	}
	for _, c := range cases {
		code, _, errs := runReplayArgs(t, c.args...)
		if code == 0 || !strings.Contains(errs, c.want) {
			t.Errorf("%v: exit %d, stderr %q; want an error containing %q", c.args, code, errs, c.want)
		}
	}
	code, out, errs := runReplayArgs(t, "--trace", bad, "--skip-bad", "--baselines=false")
	if code != 0 || !strings.Contains(out, "1 bad lines skipped") {
		t.Errorf("--skip-bad: exit %d, %q, %q", code, out, errs)
	}
}

// remoteLinkFile is what benchmarks/remote measured on the dev VM.
const remoteLinkFile = "../../benchmarks/results/remote-local.json"

// TestReplayRemote: --remote replays the chosen strategy with a remote tier
// of each size, read over the link --remote-link measured, and the report
// has a row per size, and --plot its picture.
func TestReplayRemote(t *testing.T) {
	dir := t.TempDir()
	args := append(quickArgs(t), "--baselines=false", "--remote", "0,16GiB", "--remote-link", remoteLinkFile, "--plot", dir)
	code, out, errs := runReplayArgs(t, args...)
	if code != 0 {
		t.Fatalf("exit %d: %s", code, errs)
	}
	if !strings.Contains(out, "TTFT against the remote tier's size") || !strings.Contains(out, "16GiB") {
		t.Errorf("no remote sweep in the report:\n%s", out)
	}
	for _, f := range []string{"ttft.svg", "ttft.png", "remote-sweep.svg", "remote-sweep.png"} {
		if st, err := os.Stat(filepath.Join(dir, f)); err != nil || st.Size() == 0 {
			t.Errorf("%s: %v", f, err)
		}
	}
}

// A --plot path that cannot be written is found before the replay runs:
// exit 2 at once, nothing on stdout.
func TestReplayPlotCheckedFirst(t *testing.T) {
	file := filepath.Join(t.TempDir(), "file")
	if err := os.WriteFile(file, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	code, out, errs := runReplayArgs(t, "--plot", filepath.Join(file, "plots"))
	if code != 2 || !strings.Contains(errs, "--plot") || out != "" {
		t.Errorf("--plot under a file: exit %d, stdout %q, stderr %q", code, out, errs)
	}
}

func TestReplayPlot(t *testing.T) {
	dir := t.TempDir()
	code, _, errs := runReplayArgs(t, append(quickArgs(t), "--plot", dir, "--sweep-host", "16GiB,64GiB", "--baselines=false")...)
	if code != 0 {
		t.Fatalf("exit %d: %s", code, errs)
	}
	for _, f := range []string{"ttft.svg", "ttft.png", "host-sweep.svg", "host-sweep.png"} {
		if st, err := os.Stat(filepath.Join(dir, f)); err != nil || st.Size() == 0 {
			t.Errorf("%s: %v", f, err)
		}
	}
}

// TestReplayCPUProfile: --cpuprofile writes a profile that is not empty.
func TestReplayCPUProfile(t *testing.T) {
	path := filepath.Join(t.TempDir(), "cpu.prof")
	code, _, errs := runReplayArgs(t, append(quickArgs(t), "--cpuprofile", path, "--baselines=false")...)
	if code != 0 {
		t.Fatalf("exit %d: %s", code, errs)
	}
	if st, err := os.Stat(path); err != nil || st.Size() == 0 {
		t.Errorf("%s: %v", path, err)
	}
}

// TestReplayGenerated: --generate replays a generated trace, named in the
// report, with its own block size.
func TestReplayGenerated(t *testing.T) {
	code, out, errs := runReplayArgs(t, "--generate", "agentic", "--requests", "20", "--model", "llama-3.1-70b", "--tp", "8",
		"--gpu-kv", "4GiB", "--host", "16GiB", "--nvme", "32GiB", "--baselines=false")
	if code != 0 {
		t.Fatalf("exit %d: %s", code, errs)
	}
	for _, want := range []string{"generated:agentic-20 (native): 20 requests", "of 64 tokens"} {
		if !strings.Contains(out, want) {
			t.Errorf("output lacks %q:\n%s", want, out)
		}
	}
}

func TestReplayHelp(t *testing.T) {
	code, _, errs := runReplayArgs(t, "-h")
	if code != 0 || !strings.Contains(errs, "--config") && !strings.Contains(errs, "-config") {
		t.Errorf("-h: exit %d, %q", code, errs)
	}
}

// TestReplayDecodeOnGPUAndRequestsOut: --decode-on-gpu and --max-batch,
// from a config file or flags, reach the report; --requests-out writes one
// JSON line per request, the same bytes on every run.
func TestReplayDecodeOnGPUAndRequestsOut(t *testing.T) {
	dir := t.TempDir()
	cfgPath := filepath.Join(dir, "cfg.json")
	if err := os.WriteFile(cfgPath, []byte(`{"decode_on_gpu": true, "max_batch": 4, "baselines": false}`), 0o644); err != nil {
		t.Fatal(err)
	}
	var lines [2][]byte
	var rep replay.Report
	for i := range lines {
		path := filepath.Join(dir, "requests.jsonl")
		args := append(quickArgs(t), "--config", cfgPath, "--max-batch", "8", "--decode-token-time", "10ms", "--json", "--requests-out", path)
		code, out, errs := runReplayArgs(t, args...)
		if code != 0 {
			t.Fatalf("exit %d: %s", code, errs)
		}
		if err := json.Unmarshal([]byte(out), &rep); err != nil {
			t.Fatal(err)
		}
		var err error
		if lines[i], err = os.ReadFile(path); err != nil {
			t.Fatal(err)
		}
	}
	if !bytes.Equal(lines[0], lines[1]) {
		t.Fatal("two runs wrote different request lines")
	}
	if c := rep.Config; !c.DecodeOnGPU || c.MaxBatch != 8 || len(rep.Results) != 1 {
		t.Fatalf("config %+v, %d results", c, len(rep.Results))
	}
	res := rep.Results[0]
	if res.DecodeSteps == 0 || res.DecodeBusySeconds <= 0 || res.MaxDecoding == 0 || res.MaxDecoding > 8 {
		t.Errorf("decode on the GPU: %d steps, %.3f s, at most %d decoding", res.DecodeSteps, res.DecodeBusySeconds, res.MaxDecoding)
	}
	var n int64
	for _, line := range bytes.Split(bytes.TrimSuffix(lines[0], []byte("\n")), []byte("\n")) {
		var r replay.RequestRecord
		d := json.NewDecoder(bytes.NewReader(line))
		d.DisallowUnknownFields()
		if err := d.Decode(&r); err != nil {
			t.Fatalf("%s: %v", line, err)
		}
		if r.Strategy != "cost" || r.TTFTSeconds <= 0 || r.PlannedSeconds <= 0 {
			t.Errorf("record %s", line)
		}
		n++
	}
	if n != res.Requests {
		t.Errorf("%d lines for %d requests", n, res.Requests)
	}
}

// TestReplayParseSource: the trace to replay, from --generate, --trace or
// neither, and each way's errors, without replaying.
func TestReplayParseSource(t *testing.T) {
	for _, c := range []struct {
		args []string
		name string // the source's, or
		want string // the error's
	}{
		{nil, "bundled:synthetic.jsonl", ""},
		{[]string{"--trace", "t.jsonl", "--format", "native"}, "t.jsonl", ""},
		{[]string{"--generate", "chat", "--requests", "60"}, "generated:chat-60", ""},
		{[]string{"--generate", "agentic", "--requests", "5", "--seed", "7", "--sessions-per-second", "1"}, "generated:agentic-5-seed7", ""},
		{[]string{"--generate", "chat", "--sessions-per-second", "inf"}, "", "--generate: trace: GenConfig.SessionsPerSecond = +Inf"},
		{[]string{"--generate", "chat", "--trace", "t.jsonl"}, "", "--generate and --trace: give one"},
		{[]string{"--generate", "poetry"}, "", `--generate "poetry": want chat or agentic`},
		{[]string{"--generate", "chat", "--requests", "-1"}, "", "--requests -1: negative"},
		{[]string{"--generate", "chat", "--sessions-per-second", "-2"}, "", "--sessions-per-second -2: negative"},
		{[]string{"--seed", "3"}, "", "need --generate"},
		{[]string{"--format", "csv"}, "", `unknown format "csv"`},
	} {
		a, err := replayParse(c.args, io.Discard)
		switch {
		case c.want != "" && (err == nil || !strings.Contains(err.Error(), c.want)):
			t.Errorf("%q: %v, want an error containing %q", c.args, err, c.want)
		case c.want == "" && err != nil:
			t.Errorf("%q: %v", c.args, err)
		case c.want == "" && a.src.Name != c.name:
			t.Errorf("%q: source %q, want %q", c.args, a.src.Name, c.name)
		}
	}
}

// A replay whose no-cache baseline passes --memory-budget prints the
// strategies that finished, names the one that did not, and exits 1 with
// the error. Without a cache the GPU cannot keep up with these prompts
// (all but their last block shared) and the queue grows past the budget.
func TestReplayOverBudgetPrintsTheOthers(t *testing.T) {
	var b []byte
	for i := range 200 {
		req := trace.Request{Arrival: time.Duration(i) * 4 * time.Millisecond, BlockTokens: 16, InputTokens: 32 * 16, OutputTokens: 1,
			Keys: make([]uint64, 32)}
		for k := range req.Keys {
			req.Keys[k] = uint64(k) + 1
		}
		req.Keys[31] = uint64(1000 + i)
		b = trace.AppendNative(b, &req)
	}
	path := filepath.Join(t.TempDir(), "shared.jsonl")
	if err := os.WriteFile(path, b, 0o644); err != nil {
		t.Fatal(err)
	}
	code, out, errs := runReplayArgs(t, "--trace", path, "--memory-budget", "96KiB")
	if code != 1 || !strings.Contains(errs, "strategy none") || !strings.Contains(errs, "over the memory budget of 96KiB") {
		t.Fatalf("exit %d, stderr %q; want 1 and none's error", code, errs)
	}
	for _, want := range []string{"\n       cost ", "\n     reload ", "\n  recompute ", "\n   gpu-only ",
		"NOT FINISHED, over the memory budget of 96KiB", "\n  none: stopped at line "} {
		if !strings.Contains(out, want) {
			t.Errorf("output lacks %q:\n%s", want, out)
		}
	}
}
