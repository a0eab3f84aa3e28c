package main

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

func TestMeasuredLink(t *testing.T) {
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
	l, err := measuredLink(good)
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
		if _, err := measuredLink(write(name, body)); err == nil || !strings.Contains(err.Error(), name) {
			t.Errorf("%s: %v, want an error naming the file", name, err)
		}
	}
	if _, err := measuredLink(filepath.Join(dir, "absent.json")); err == nil {
		t.Error("a missing file gave no error")
	}
}

func TestRunErrors(t *testing.T) {
	dir := t.TempDir()
	measured := filepath.Join(dir, "m.json")
	os.WriteFile(measured, []byte(`{"rows": [{"name": "tier read", "unit": "GiB/s", "median": 2},
		{"name": "tier read latency", "unit": "us", "median": 90}]}`), 0o644)
	if err := run("", measured, "1XB", dir, 0); err == nil || !strings.Contains(err.Error(), "--sizes") {
		t.Errorf("a bad size: %v", err)
	}
	if err := run("", measured, "0", dir, -1); err == nil || !strings.Contains(err.Error(), "--bandwidth") {
		t.Errorf("a negative bandwidth: %v", err)
	}
	if err := run(filepath.Join(dir, "absent.json"), measured, "0", dir, 0); err == nil {
		t.Error("a missing config gave no error")
	}
}
