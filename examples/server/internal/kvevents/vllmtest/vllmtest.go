// Package vllmtest runs, for tests, a consumer of KV events in vLLM's wire
// format that no one here wrote the protocol of: consumer.py, over libzmq
// (Debian's python3-zmq) and the msgpack package (python3-msgpack),
// decoding by vLLM's documented schema and keeping a router's index.
package vllmtest

import (
	"bufio"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"testing"
)

// Consumer is consumer.py running.
type Consumer struct {
	t     testing.TB
	cmd   *exec.Cmd
	stdin io.WriteCloser
	out   *bufio.Scanner
}

// Block is what the consumer's index holds of a block.
type Block struct {
	Parent    *uint64 // nil for a prefix's first block
	TokenIDs  []int32
	BlockSize int
}

// State is what the consumer reports at a checkpoint.
type State struct {
	Last     int64      `json:"last"`      // the last message seen
	Gaps     [][2]int64 `json:"gaps"`      // messages missed for good, inclusive ranges
	LiveGaps [][2]int64 `json:"live_gaps"` // missed live after the first live one (replays may fill them)
	Errors   []string   `json:"errors"`    // messages that broke the schema or contradicted the index
	Events   int        `json:"events"`
	Clears   int        `json:"clears"`
	Replayed int        `json:"replayed"` // messages taken from the replay socket
	// Media maps a medium ("GPU", "CPU", "DISK") to its blocks by hash.
	Media map[string]map[uint64]Block `json:"-"`
}

// Python returns an interpreter with zmq and msgpack, skipping the test
// without one, or failing it under CI (whose .ci/run installs them).
func Python(t testing.TB) string {
	t.Helper()
	for _, py := range []string{"/usr/bin/python3", "python3"} {
		if exec.Command(py, "-c", "import zmq, msgpack").Run() == nil {
			return py
		}
	}
	if os.Getenv("CI") == "true" {
		t.Fatal("no python3 with zmq and msgpack (apt-get install python3-zmq python3-msgpack)")
	}
	t.Skip("no python3 with zmq and msgpack (apt-get install python3-zmq python3-msgpack)")
	return ""
}

// Start runs the consumer on the PUB socket at pub (and the replay socket
// at replay, "" for none), subscribed to topic; it returns once the
// consumer has subscribed. A paused consumer reads nothing (and libzmq
// queues one message for it at most) until Resume.
func Start(t testing.TB, pub, replay, topic string, paused bool) *Consumer {
	t.Helper()
	_, self, _, _ := runtime.Caller(0)
	if replay == "" {
		replay = "-"
	}
	p := "0"
	if paused {
		p = "1"
	}
	cmd := exec.Command(Python(t), filepath.Join(filepath.Dir(self), "consumer.py"), pub, replay, topic, p)
	cmd.Stderr = os.Stderr
	stdin, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	c := &Consumer{t: t, cmd: cmd, stdin: stdin, out: bufio.NewScanner(stdout)}
	c.out.Buffer(nil, 256<<20)
	t.Cleanup(func() {
		stdin.Close()
		cmd.Process.Kill()
		cmd.Wait()
	})
	if !c.out.Scan() || c.out.Text() != "subscribed" {
		t.Fatalf("the consumer did not start: %q %v", c.out.Text(), c.out.Err())
	}
	return c
}

// Resume lets a paused consumer read.
func (c *Consumer) Resume() {
	c.t.Helper()
	if _, err := io.WriteString(c.stdin, "go\n"); err != nil {
		c.t.Fatal(err)
	}
}

// Until returns the consumer's state once it has seen message last (or
// found it lost), failing the test on any error the consumer found.
func (c *Consumer) Until(last uint64) State {
	c.t.Helper()
	if _, err := fmt.Fprintf(c.stdin, "until %d\n", last); err != nil {
		c.t.Fatal(err)
	}
	if !c.out.Scan() {
		c.t.Fatalf("the consumer ended without a state: %v", c.out.Err())
	}
	var raw struct {
		State
		Media map[string]map[string][3]json.RawMessage `json:"media"`
	}
	if err := json.Unmarshal(c.out.Bytes(), &raw); err != nil {
		c.t.Fatalf("the consumer's state: %v", err)
	}
	s := raw.State
	s.Media = map[string]map[uint64]Block{}
	for m, blocks := range raw.Media {
		s.Media[m] = map[uint64]Block{}
		for h, v := range blocks {
			k, err := strconv.ParseUint(h, 10, 64)
			var b Block
			if err != nil || json.Unmarshal(v[0], &b.Parent) != nil || json.Unmarshal(v[1], &b.TokenIDs) != nil || json.Unmarshal(v[2], &b.BlockSize) != nil {
				c.t.Fatalf("the consumer's block %s: %s", h, v)
			}
			s.Media[m][k] = b
		}
	}
	if len(s.Errors) > 0 {
		c.t.Errorf("the consumer found %d errors: %q", len(s.Errors), s.Errors)
	}
	return s
}
