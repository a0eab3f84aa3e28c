package main

import (
	"bytes"
	"regexp"
	"strconv"
	"strings"
	"testing"
)

// TestRun runs the example end to end (on the simulated device without a
// GPU) and checks that every tier served hits and that blocks were loaded:
// run itself fails if a loaded block differs from what was cached.
func TestRun(t *testing.T) {
	var out bytes.Buffer
	if err := run(&out, ""); err != nil {
		t.Fatalf("%v\n%s", err, out.String())
	}
	t.Log("\n" + out.String())
	m := regexp.MustCompile(`hits gpu (\d+), host (\d+), nvme (\d+); (\d+) loaded`).FindStringSubmatch(out.String())
	if m == nil {
		t.Fatal("no summary line in the output")
	}
	for i, name := range []string{"gpu hits", "host hits", "nvme hits", "loaded blocks"} {
		if n, _ := strconv.Atoi(m[i+1]); n == 0 {
			t.Errorf("%s: 0", name)
		}
	}
}

// TestRunTwiceStartsWarm runs the example twice over one NVMe directory: the
// second run adopts the blocks the first left on the drive, serves NVMe hits
// from them, and every block it loads checks out byte for byte.
func TestRunTwiceStartsWarm(t *testing.T) {
	dir := t.TempDir()
	var first, second bytes.Buffer
	if err := run(&first, dir); err != nil {
		t.Fatalf("first run: %v\n%s", err, first.String())
	}
	if strings.Contains(first.String(), "adopted") {
		t.Errorf("the first run adopted blocks from an empty directory:\n%s", first.String())
	}
	if err := run(&second, dir); err != nil {
		t.Fatalf("second run: %v\n%s", err, second.String())
	}
	t.Log("\n" + second.String())
	m := regexp.MustCompile(`nvme: adopted (\d+) of the (\d+) blocks`).FindStringSubmatch(second.String())
	if m == nil {
		t.Fatal("the second run adopted nothing")
	}
	if n, _ := strconv.Atoi(m[1]); n == 0 {
		t.Errorf("adopted 0 of %s blocks", m[2])
	}
	h := regexp.MustCompile(`hits gpu (\d+), host (\d+), nvme (\d+)`).FindStringSubmatch(second.String())
	if h == nil {
		t.Fatal("no summary line in the second run's output")
	}
	n1 := regexp.MustCompile(`hits gpu (\d+), host (\d+), nvme (\d+)`).FindStringSubmatch(first.String())
	if a, b := atoi(h[3]), atoi(n1[3]); a <= b {
		t.Errorf("nvme hits: %d in the second run, %d in the first; want more after starting warm", a, b)
	}
}

func atoi(s string) int { n, _ := strconv.Atoi(s); return n }
