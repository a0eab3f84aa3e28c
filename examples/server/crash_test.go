package main

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"kvtier.dev/examples/server/internal/model"
	"kvtier.dev/internal/openai"
	"kvtier.dev/internal/redistest"
)

// childEnv makes the test binary run the server's main instead of the
// tests: the crash test needs a server in another process to kill.
const childEnv = "KVSERVE_TEST_SERVER_ARGS"

func TestMain(m *testing.M) {
	if args, ok := os.LookupEnv(childEnv); ok {
		os.Args = append([]string{"server"}, strings.Fields(args)...)
		main()
		os.Exit(0)
	}
	os.Exit(redistest.RunMain(m))
}

// child is the server running in a process of its own.
type child struct {
	cmd *exec.Cmd
	url string
	log *logBuffer
	// exited is closed once the process has been waited for; err is then
	// its exit.
	exited chan struct{}
	err    error
}

// wait returns the process's exit once it has ended.
func (c *child) wait() error {
	<-c.exited
	return c.err
}

var listenRE = regexp.MustCompile(`msg="server: listening" addr=(\S+)`)

// startChild runs the server with args in a new process and waits until it
// listens.
func startChild(t testing.TB, args ...string) *child {
	t.Helper()
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), childEnv+"="+strings.Join(args, " "))
	stderr, err := cmd.StderrPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	c := &child{cmd: cmd, log: &logBuffer{}, exited: make(chan struct{})}
	up := make(chan string, 1)
	go func() {
		sc := bufio.NewScanner(stderr)
		for sc.Scan() {
			line := sc.Text()
			fmt.Fprintln(c.log, line)
			if m := listenRE.FindStringSubmatch(line); m != nil {
				up <- m[1]
			}
		}
		_, _ = io.Copy(io.Discard, stderr)
		c.err = cmd.Wait()
		close(c.exited)
	}()
	t.Cleanup(func() {
		select {
		case <-c.exited:
		default:
			_ = cmd.Process.Kill()
			<-c.exited
		}
	})
	select {
	case addr := <-up:
		c.url = "http://" + addr
	case <-c.exited:
		t.Fatalf("the server did not start (%v):\n%s", c.err, c.log)
	case <-time.After(30 * time.Second):
		t.Fatalf("the server did not listen within 30s:\n%s", c.log)
	}
	return c
}

func (c *child) client() *openai.Client {
	return &openai.Client{URL: c.url + openai.CompletionsPath}
}

// nvmeBlocks reads how many blocks the server has written to its NVMe tier
// from /metrics (kvtier_bytes_in_total{tier="nvme"} over the block bytes
// of testArgs' model).
func nvmeBlocks(t *testing.T, url string) float64 {
	t.Helper()
	m, err := model.Lookup("tiny", 0)
	if err != nil {
		t.Fatal(err)
	}
	tiny := m
	for _, f := range scrape(t, url) {
		if f.GetName() != "kvtier_bytes_in_total" {
			continue
		}
		for _, m := range f.GetMetric() {
			for _, l := range m.GetLabel() {
				if l.GetName() == "tier" && l.GetValue() == "nvme" {
					return m.GetCounter().GetValue() / float64(tiny.BlockBytes())
				}
			}
		}
	}
	t.Fatal("/metrics has no kvtier_bytes_in_total{tier=\"nvme\"}")
	return 0
}

// overBudget returns the NVMe writes the server refused over its rate or
// endurance budget.
func overBudget(t *testing.T, url string) float64 {
	t.Helper()
	n := 0.0
	for _, m := range scrape(t, url)["kvtier_writes_refused_total"].GetMetric() {
		labels := map[string]string{}
		for _, l := range m.GetLabel() {
			labels[l.GetName()] = l.GetValue()
		}
		if labels["tier"] == "nvme" && (labels["reason"] == "over_rate" || labels["reason"] == "over_endurance") {
			n += m.GetCounter().GetValue()
		}
	}
	return n
}

// TestServeKill9DuringLoad: a server under load is killed with SIGKILL
// once it has written blocks to its NVMe directory; a new server over the
// same directory adopts them, answers the prompts sent before the kill
// with KV loaded from NVMe, and every answer equals its no-cache
// reference. Also with the writes under budgets (a tenth of the drive's
// write rate, and 12 drive writes a day of the 2 MiB tier: about 40 blocks
// of 4 KiB, then one every 15 s), which refuse writes while it runs.
func TestServeKill9DuringLoad(t *testing.T) {
	for name, flags := range map[string][]string{
		"gated":         nil,
		"under budgets": {"-nvme-write-share", "0.1", "-nvme-dwpd", "12"},
	} {
		t.Run(name, func(t *testing.T) { kill9DuringLoad(t, flags) })
	}
}

func kill9DuringLoad(t *testing.T, flags []string) {
	dir := filepath.Join(t.TempDir(), "kv")
	first := startChild(t, testArgs(append([]string{"-nvme-dir", dir}, flags...)...)...)

	// Load: clients sending prompts that share a 24-token prefix per
	// conversation, until the kill.
	const clients, conversations = 4, 6
	prompt := func(conv, turn int) openai.Prompt {
		return tokenPrompt(100+conv, 24+8*turn+3)
	}
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	var mu sync.Mutex
	answered := map[int]bool{} // conversations answered at least once
	for c := range clients {
		wg.Add(1)
		go func() {
			defer wg.Done()
			cl := first.client()
			for turn := 0; ctx.Err() == nil; turn++ {
				conv := (c + turn*clients) % conversations
				_, err := cl.Complete(ctx, openai.CompletionRequest{Prompt: prompt(conv, turn%4), MaxTokens: maxTokens(2)})
				if err == nil {
					mu.Lock()
					answered[conv] = true
					mu.Unlock()
				}
			}
		}()
	}
	deadline := time.Now().Add(30 * time.Second)
	// Under budgets, the kill comes once they have refused writes.
	for nvmeBlocks(t, first.url) < 20 || flags != nil && overBudget(t, first.url) == 0 {
		if time.Now().After(deadline) {
			cancel()
			wg.Wait()
			t.Fatalf("in 30s the server wrote %.0f blocks to NVMe (want 20) and refused %.0f over its budgets:\n%s",
				nvmeBlocks(t, first.url), overBudget(t, first.url), first.log)
		}
		time.Sleep(20 * time.Millisecond)
	}
	if err := first.cmd.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	err := first.wait()
	cancel()
	wg.Wait()
	var exit *exec.ExitError
	if !errors.As(err, &exit) || exit.Sys().(syscall.WaitStatus).Signal() != syscall.SIGKILL {
		t.Fatalf("the first server ended with %v, want killed by SIGKILL", err)
	}
	if strings.Contains(first.log.String(), "stopped cleanly") {
		t.Fatal("the first server stopped cleanly: it was not killed")
	}

	second := startChild(t, testArgs(append([]string{"-nvme-dir", dir}, flags...)...)...)
	if !strings.Contains(second.log.String(), "adopted the blocks a previous run left on NVMe") {
		t.Errorf("the restarted server adopted no NVMe block:\n%s", second.log)
	}
	cl := second.client()
	nvmeTokens, compared := 0, 0
	for conv := range conversations {
		if !answered[conv] {
			continue
		}
		for turn := range 4 {
			req := openai.CompletionRequest{Prompt: prompt(conv, turn), MaxTokens: maxTokens(3)}
			got, err := cl.Complete(context.Background(), req)
			if err != nil {
				t.Fatalf("conversation %d turn %d after the restart: %v", conv, turn, err)
			}
			req.NoCache = true
			ref, err := cl.Complete(context.Background(), req)
			if err != nil {
				t.Fatalf("conversation %d turn %d, no-cache reference: %v", conv, turn, err)
			}
			compared++
			if !slices.Equal(got.Tokens, ref.Tokens) {
				t.Errorf("conversation %d turn %d: tokens %v from the cache, %v without", conv, turn, got.Tokens, ref.Tokens)
			}
			nvmeTokens += got.Usage.PromptTokensDetails.CachedTokensByTier.NVMe
		}
	}
	if compared == 0 {
		t.Fatal("no conversation was answered before the kill")
	}
	if nvmeTokens == 0 {
		t.Errorf("after the restart no prompt token of %d requests came from the NVMe tier:\n%s", compared, second.log)
	}
	if err := second.cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	if err := second.wait(); err != nil {
		t.Errorf("the restarted server's exit: %v\n%s", err, second.log)
	}
	t.Logf("%d answers compared after the restart, %d prompt tokens from NVMe", compared, nvmeTokens)
}
