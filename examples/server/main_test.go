package main

import (
	"bytes"
	"regexp"
	"strconv"
	"testing"
)

// TestRun runs the example end to end (on the simulated device without a
// GPU) and checks that every tier served hits and that blocks were loaded:
// run itself fails if a loaded block differs from what was cached.
func TestRun(t *testing.T) {
	var out bytes.Buffer
	if err := run(&out); err != nil {
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
