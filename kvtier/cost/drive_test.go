package cost

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func TestLoadDriveErrors(t *testing.T) {
	dir := t.TempDir()
	write := func(name, body string) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, []byte(body), 0o600); err != nil {
			t.Fatal(err)
		}
		return p
	}
	for _, c := range []struct{ path, want string }{
		{filepath.Join(dir, "missing.json"), "no such file"},
		{write("bad.json", "{"), "bad.json"},
		{write("norows.json", `{"machine": "m", "rows": [{"name": "drive read", "unit": "GiB/s", "median": 1.5}]}`), "want positive medians"},
		{write("huge.json", `{"machine": "m", "rows": [{"name": "drive read", "unit": "GiB/s", "median": 1e9}, {"name": "drive write", "unit": "GiB/s", "median": 1},
			{"name": "drive read latency", "unit": "us", "median": 40}, {"name": "drive write latency", "unit": "us", "median": 100}]}`), "bandwidth"},
	} {
		if _, err := LoadDrive(c.path); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s: %v, want an error containing %q", c.path, err, c.want)
		}
	}
	d, err := LoadDrive(write("ok.json", `{"machine": "m", "rows": [{"name": "drive read", "unit": "GiB/s", "median": 1.5}, {"name": "drive write", "unit": "GiB/s", "median": 1},
		{"name": "drive read latency", "unit": "us", "median": 40}, {"name": "drive write latency", "unit": "us", "median": 100}]}`))
	if err != nil || d.Read.Name != "drive-m" || d.Write.BandwidthBytesPerS != 1<<30 || d.Read.Latency.Microseconds() != 40 {
		t.Errorf("LoadDrive: %+v, %v", d, err)
	}
	if p := PresetDrive(d.Read); p.Write.Name != "drive-m write" || p.Write.BandwidthBytesPerS != d.Read.BandwidthBytesPerS {
		t.Errorf("PresetDrive: %+v", p)
	}
}
