package main

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

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
