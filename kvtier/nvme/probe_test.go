package nvme

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestProbeDrive measures a temporary directory's drive, small: both
// directions have a rate and a latency, and the scratch file is gone.
func TestProbeDrive(t *testing.T) {
	dir := t.TempDir()
	p, err := ProbeDrive(context.Background(), ProbeConfig{Dir: dir, BlockBytes: 1 << 20, Bytes: 8 << 20})
	if err != nil {
		t.Fatal(err)
	}
	if p.ReadBytesPerS <= 0 || p.WriteBytesPerS <= 0 || p.ReadLatency <= 0 || p.WriteLatency <= 0 || p.Writes != 8 || p.Reads != 8 {
		t.Errorf("probe %+v", p)
	}
	if _, err := os.Stat(filepath.Join(dir, probeFile)); !os.IsNotExist(err) {
		t.Errorf("the probe left its file: %v", err)
	}
	t.Logf("%s: write %.2f GB/s, read %.2f GB/s, direct %v", dir, p.WriteBytesPerS/1e9, p.ReadBytesPerS/1e9, p.Direct)
}

func TestProbeDriveErrors(t *testing.T) {
	for field, cfg := range map[string]ProbeConfig{
		"Dir":        {},
		"BlockBytes": {Dir: t.TempDir(), BlockBytes: 1000},
		"Bytes":      {Dir: t.TempDir(), Bytes: -1},
		"MaxTime":    {Dir: t.TempDir(), MaxTime: -1},
	} {
		if _, err := ProbeDrive(context.Background(), cfg); !errors.Is(err, ErrConfig) || !strings.Contains(err.Error(), "ProbeConfig."+field) {
			t.Errorf("%s: %v, want ErrConfig naming it", field, err)
		}
	}
	if _, err := ProbeDrive(context.Background(), ProbeConfig{Dir: filepath.Join(t.TempDir(), "missing")}); err == nil {
		t.Error("a missing directory was probed")
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if _, err := ProbeDrive(ctx, ProbeConfig{Dir: t.TempDir(), Bytes: 4 << 20}); !errors.Is(err, context.Canceled) {
		t.Errorf("a cancelled probe: %v", err)
	}
}
