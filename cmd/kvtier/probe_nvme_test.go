package main

import (
	"bytes"
	"strings"
	"testing"

	"path/filepath"

	"kvtier.dev/kvtier/cost"
)

// TestProbeNVMe measures a temporary directory's drive and writes a file
// that the replay's and the server's -nvme-link read (cost.LoadDrive).
func TestProbeNVMe(t *testing.T) {
	path := filepath.Join(t.TempDir(), "drive.json")
	var out, errb bytes.Buffer
	code := run([]string{"probe", "--nvme", t.TempDir(), "--nvme-block", "1MiB", "--nvme-bytes", "4MiB", "--runs", "2",
		"--machine", "test", "--json", path}, &out, &errb)
	if code != 0 {
		t.Fatalf("exit %d: %s", code, errb.String())
	}
	for _, row := range []string{"drive write", "drive read", "drive write latency", "drive read latency"} {
		if !strings.Contains(out.String(), row) {
			t.Errorf("no %q row:\n%s", row, out.String())
		}
	}
	d, err := cost.LoadDrive(path)
	if err != nil {
		t.Fatal(err)
	}
	if d.Read.Name != "drive-test" || d.Write.Name != cost.WriteLinkName("drive-test") || d.Read.BandwidthBytesPerS <= 0 || d.Write.Latency <= 0 {
		t.Errorf("drive %+v", d)
	}
}

// TestProbeNVMeBadInput: bad --nvme flags are errors naming them.
func TestProbeNVMeBadInput(t *testing.T) {
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"--nvme-block", "1MiB"}, "need --nvme"},
		{[]string{"--nvme", "/tmp", "--nvme-block", "1000"}, "--nvme-block: 1000 bytes"},
		{[]string{"--nvme", "/tmp", "--nvme-block", "lots"}, "--nvme-block"},
		{[]string{"--nvme", "/tmp", "--nvme-bytes", "1MiB"}, "--nvme-bytes: 1048576 bytes holds no --nvme-block"},
		{[]string{"--nvme", "/tmp", "--methods"}, "do not apply"},
		{[]string{"--nvme", "/nonexistent/kvtier"}, "/nonexistent/kvtier"},
	} {
		var out, errb bytes.Buffer
		code := run(append([]string{"probe"}, c.args...), &out, &errb)
		if code == 0 || !strings.Contains(errb.String(), c.want) {
			t.Errorf("%v: exit %d, stderr %q; want an error containing %q", c.args, code, errb.String(), c.want)
		}
	}
}
