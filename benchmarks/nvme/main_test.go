package main

import (
	"errors"
	"strings"
	"testing"

	"kvtier.dev/cudastream"
)

// TestParseArgs: every bad flag is an error naming it; good ones parse,
// --workers 0 taking --depth.
func TestParseArgs(t *testing.T) {
	o, err := parseArgs([]string{"--dir", "/tmp/x", "--sizes", "1MiB,4MiB", "--depth", "16", "--gpu", "--gpu-batch", "4"})
	if err != nil {
		t.Fatal(err)
	}
	if o.workers != 16 || len(o.sizes) != 2 || o.sizes[1] != 4<<20 || !o.gpu || o.gpuBatch != 4 {
		t.Fatalf("parsed %+v", o)
	}
	for _, c := range []struct {
		args []string
		want string
	}{
		{nil, "--dir"},
		{[]string{"--dir", "d", "--rounds", "0"}, "--rounds"},
		{[]string{"--dir", "d", "--size-gib", "0"}, "--size-gib"},
		{[]string{"--dir", "d", "--depth", "0"}, "--depth"},
		{[]string{"--dir", "d", "--workers", "-1"}, "--workers"},
		{[]string{"--dir", "d", "--gpu-batch", "0"}, "--gpu-batch"},
		{[]string{"--dir", "d", "--gpu-batch", "257"}, "--gpu-batch"},
		{[]string{"--dir", "d", "--sizes", "1000"}, "--sizes"},
		{[]string{"--dir", "d", "extra"}, "unexpected"},
	} {
		if _, err := parseArgs(c.args); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%q: %v, want an error naming %s", c.args, err, c.want)
		}
	}
}

// TestGPUSideNeedsADevice: --gpu without a CUDA driver says so.
func TestGPUSideNeedsADevice(t *testing.T) {
	g, err := newGPUSide(1, 1, 4096, func([]byte) {})
	if err == nil {
		g.close()
		t.Skip("a GPU is present")
	}
	if !errors.Is(err, cudastream.ErrNoDriver) || !strings.Contains(err.Error(), "--gpu") {
		t.Fatalf("newGPUSide without a driver: %v, want ErrNoDriver naming --gpu", err)
	}
}
