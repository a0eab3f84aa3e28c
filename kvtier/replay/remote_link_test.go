package replay

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// TestRemoteLinkFromResults: the link is the file's "tier read" rate and
// latency; a file without them, or not JSON, or absent is an error naming
// it.
func TestRemoteLinkFromResults(t *testing.T) {
	dir := t.TempDir()
	write := func(name, body string) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, []byte(body), 0o644); err != nil {
			t.Fatal(err)
		}
		return p
	}
	good := write("good.json", `{"benchmark": "remote", "machine": "m", "rows": [
		{"name": "tier read", "unit": "GiB/s", "median": 2},
		{"name": "tier read latency", "unit": "us", "median": 90}]}`)
	l, err := RemoteLinkFromResults(good)
	if err != nil {
		t.Fatal(err)
	}
	if l.BandwidthBytesPerS != 2*(1<<30) || l.Latency != 90*time.Microsecond || !strings.Contains(l.Source, good) {
		t.Errorf("%+v", l)
	}
	for name, body := range map[string]string{
		"no latency.json": `{"rows": [{"name": "tier read", "unit": "GiB/s", "median": 2}]}`,
		"bad.json":        `{"rows": `,
	} {
		if _, err := RemoteLinkFromResults(write(name, body)); err == nil || !strings.Contains(err.Error(), name) {
			t.Errorf("%s: %v, want an error naming the file", name, err)
		}
	}
	if _, err := RemoteLinkFromResults(filepath.Join(dir, "absent.json")); err == nil {
		t.Error("a missing file gave no error")
	}
}
