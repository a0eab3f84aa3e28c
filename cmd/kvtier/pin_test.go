package main

import (
	"bytes"
	"strings"
	"testing"
)

// TestPinWithMlock pins a small region for real (mlock; no GPU here) and
// checks the report names every stage.
func TestPinWithMlock(t *testing.T) {
	var out, errb bytes.Buffer
	code := run([]string{"pin", "--size", "16MiB", "--chunk", "4MiB", "--registrar", "mlock", "--progress", "always"}, &out, &errb)
	if code != 0 {
		t.Fatalf("exit %d: %s", code, errb.String())
	}
	for _, want := range []string{"pinning 16MiB with mlock", "end to end", "touch", "register", "bound by", "chunks      4 of 4MiB"} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("report lacks %q:\n%s", want, out.String())
		}
	}
}

func TestPinBadInput(t *testing.T) {
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"--size", "0"}, "--size"},
		{[]string{"--size", "lots"}, "--size"},
		{[]string{"--chunk", "-1GiB"}, "--chunk"},
		{[]string{"--pages", "1g"}, "--pages"},
		{[]string{"--fault", "madvise"}, "--fault"},
		{[]string{"--registrar", "rdma"}, "--registrar"},
		{[]string{"--progress", "sometimes"}, "--progress"},
		{[]string{"--touchers", "-2"}, "--touchers"},
		{[]string{"extra"}, "unexpected argument"},
	} {
		var out, errb bytes.Buffer
		code := run(append([]string{"pin"}, tc.args...), &out, &errb)
		if code != 2 || !strings.Contains(errb.String(), tc.want) || out.Len() != 0 {
			t.Errorf("pin %v: exit %d, stderr %q, stdout %q; want exit 2 naming %s and no output", tc.args, code, errb.String(), out.String(), tc.want)
		}
	}
	// A size the allocator refuses is reported with the allocator's words.
	var out, errb bytes.Buffer
	if code := run([]string{"pin", "--size", "4097", "--registrar", "mlock"}, &out, &errb); code != 1 || !strings.Contains(errb.String(), "not a multiple") {
		t.Errorf("unaligned size: exit %d, %q", code, errb.String())
	}
}
