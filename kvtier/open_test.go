package kvtier

import (
	"context"
	"errors"
	"log/slog"
	"strings"
	"testing"

	"kvtier.dev/cudastream"
	"kvtier.dev/kvtier/transfer"
)

// TestOpenErrors: each bad option is refused with an error naming it, and
// nothing is left open (the sim's Close would report leaked memory).
func TestOpenErrors(t *testing.T) {
	sim, err := cudastream.NewSim(cudastream.SimConfig{MemoryBytes: 1 << 20})
	if err != nil {
		t.Fatal(err)
	}
	defer sim.Close()
	region, err := sim.Alloc(8 << 12)
	if err != nil {
		t.Fatal(err)
	}
	gpu, err := transfer.BlockFirstLayout(region, 2, 2, 8, 1<<10)
	if err != nil {
		t.Fatal(err)
	}
	good := Options{Device: sim, GPU: gpu, BlockTokens: 4, HostBytes: 8 << 12, Logger: slog.New(slog.DiscardHandler)}
	for _, tc := range []struct {
		edit func(*Options)
		want string
	}{
		{func(o *Options) { o.Device = nil }, "Options.Device"},
		{func(o *Options) { o.HostBytes = 0 }, "Options.HostBytes"},
		{func(o *Options) { o.HostBytes = 100 }, "Options.HostBytes"},
		{func(o *Options) { o.NVMeBytes = 1 << 20 }, "Options.NVMeBytes"},
		{func(o *Options) { o.NVMeDirs = []string{t.TempDir()} }, "Options.NVMeBytes"},
		{func(o *Options) { o.NVMeDirs, o.NVMeBytes = []string{t.TempDir()}, 100 }, "Options.NVMeBytes"},
		{func(o *Options) { o.GPU.NumBlocks = 0 }, "Options.GPU"},
		{func(o *Options) { o.BlockTokens = 0 }, "Options.BlockTokens"},
		{func(o *Options) { o.NVMeDirs, o.NVMeBytes = []string{"/nonexistent/kvtier"}, 1<<20 }, "nonexistent"},
	} {
		o := good
		tc.edit(&o)
		c, err := Open(context.Background(), o)
		if err == nil {
			c.Close()
			t.Errorf("%s: Open succeeded", tc.want)
			continue
		}
		if !strings.Contains(err.Error(), tc.want) {
			t.Errorf("Open: %v, want an error naming %s", err, tc.want)
		}
		if strings.HasPrefix(tc.want, "Options.") && !errors.Is(err, ErrConfig) {
			t.Errorf("Open: %v does not wrap ErrConfig", err)
		}
	}
	c, err := Open(context.Background(), good)
	if err != nil {
		t.Fatal(err)
	}
	if got := c.CapacitySlots(Host); got != 8 {
		t.Errorf("host tier of 8 4-KiB slots has %d", got)
	}
	if err := c.Close(); err != nil {
		t.Fatal(err)
	}
}
