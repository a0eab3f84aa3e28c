package main

import (
	"bytes"
	"os"
	"path/filepath"
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
		{[]string{"--device", "-1"}, "--device"},
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

// A cgroup limit below --size is refused before anything is pinned, naming
// the limit and its file, for cgroup v2 and v1, at the process's cgroup or
// an ancestor; "max" and v1's "no limit" value check nothing.
func TestPinChecksCgroupLimit(t *testing.T) {
	write := func(path, s string) {
		t.Helper()
		if err := os.MkdirAll(filepath.Dir(path), 0o700); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(path, []byte(s), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	root := t.TempDir()
	write(root+"/v2/self", "0::/job/task\n")
	write(root+"/v2/fs/job/task/memory.max", "max\n")
	write(root+"/v2/fs/job/memory.max", "1073741824\n")
	write(root+"/v1/self", "5:cpu:/\n4:memory:/box\n")
	write(root+"/v1/fs/memory/box/memory.limit_in_bytes", "536870912\n")
	write(root+"/none/self", "0::/free\n")
	write(root+"/none/fs/free/memory.max", "max\n")
	write(root+"/v1max/self", "4:memory:/box\n")
	write(root+"/v1max/fs/memory/box/memory.limit_in_bytes", "9223372036854771712\n")
	for _, tc := range []struct {
		tree string
		size int64
		want string // "" for no error
	}{
		{"v2", 2 << 30, "cgroup memory limit, 1GiB (" + root + "/v2/fs/job/memory.max)"},
		{"v2", 512 << 20, ""},
		{"v1", 1 << 30, "cgroup memory limit, 512MiB (" + root + "/v1/fs/memory/box/memory.limit_in_bytes)"},
		{"none", 1 << 40, ""},
		{"v1max", 1 << 40, ""},
		{"missing", 1 << 40, ""},
	} {
		err := checkCgroupMemory(tc.size, root+"/"+tc.tree+"/self", root+"/"+tc.tree+"/fs")
		if tc.want == "" && err != nil || tc.want != "" && (err == nil || !strings.Contains(err.Error(), tc.want)) {
			t.Errorf("%s, size %d: %v, want %q", tc.tree, tc.size, err, tc.want)
		}
	}
}
