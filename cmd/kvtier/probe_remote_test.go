package main

import (
	"bytes"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"kvtier.dev/internal/redistest"
	"kvtier.dev/kvtier/replay"
)

func TestMain(m *testing.M) { os.Exit(redistest.RunMain(m)) }

// TestProbeRemote measures the remote tier of a real cluster and writes a
// file `kvtier replay --remote-link` reads.
func TestProbeRemote(t *testing.T) {
	addrs := redistest.Shared(t)
	path := filepath.Join(t.TempDir(), "probe.json")
	var out, errb bytes.Buffer
	code := run([]string{"probe", "--remote", strings.Join(addrs, ","), "--remote-block", "64KiB", "--remote-blocks", "4",
		"--runs", "2", "--json", path}, &out, &errb)
	if code != 0 {
		t.Fatalf("exit %d: %s", code, errb.String())
	}
	for _, row := range []string{"tier write", "tier read", "tier read latency"} {
		if !strings.Contains(out.String(), row) {
			t.Errorf("no %q row:\n%s", row, out.String())
		}
	}
	l, err := replay.RemoteLinkFromResults(path)
	if err != nil {
		t.Fatal(err)
	}
	if l.BandwidthBytesPerS <= 0 || l.Latency <= 0 {
		t.Errorf("link %+v", l)
	}
}

// TestProbeRemoteBadInput: bad --remote flags are errors naming them, and
// an unreachable cluster is an error, not a hang.
func TestProbeRemoteBadInput(t *testing.T) {
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"--remote-depth", "2"}, "need --remote"},
		{[]string{"--remote", "127.0.0.1:1", "--remote-block", "lots"}, "--remote-block"},
		{[]string{"--remote", "127.0.0.1:1", "--remote-block", "2GiB"}, "--remote-block"},
		{[]string{"--remote", "127.0.0.1:1", "--remote-blocks", "0"}, "--remote-blocks 0"},
		{[]string{"--remote", "127.0.0.1:1", "--device", "1"}, "--device, --size and --methods do not apply"},
		{[]string{"--remote", "127.0.0.1:1"}, "127.0.0.1:1"},
	} {
		var out, errb bytes.Buffer
		code := run(append([]string{"probe"}, c.args...), &out, &errb)
		if code == 0 || !strings.Contains(errb.String(), c.want) {
			t.Errorf("%v: exit %d, stderr %q; want an error containing %q", c.args, code, errb.String(), c.want)
		}
	}
}
