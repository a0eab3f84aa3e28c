package cudastream

import (
	"errors"
	"strings"
	"testing"
)

// TestCheckLaunch covers Launch's checks on machines without a GPU (the
// GPU test TestCuLaunchBadConfig runs them through the driver's stream).
func TestCheckLaunch(t *testing.T) {
	ok := [3]uint32{1, 1, 1}
	if err := checkLaunch("k", LaunchConfig{Grid: [3]uint32{1 << 31, 65535, 65535}, Block: [3]uint32{1024, 1, 1}}, make([]uint64, MaxLaunchArgs)); err != nil {
		t.Fatalf("the largest good launch: %v", err)
	}
	cases := []struct {
		cfg  LaunchConfig
		args int
		says string
	}{
		{LaunchConfig{Grid: [3]uint32{1, 1, 0}, Block: ok}, 0, "at least 1"},
		{LaunchConfig{Grid: ok, Block: [3]uint32{0, 1, 1}}, 0, "at least 1"},
		{LaunchConfig{Grid: ok, Block: [3]uint32{16, 16, 8}}, 0, "2048 threads"},
		{LaunchConfig{Grid: [3]uint32{1, 1, 70000}, Block: ok}, 0, "65535"},
		{LaunchConfig{Grid: ok, Block: ok}, MaxLaunchArgs + 1, "17 arguments"},
	}
	for _, c := range cases {
		err := checkLaunch("kvtier_k", c.cfg, make([]uint64, c.args))
		if !errors.Is(err, ErrInvalidValue) || !strings.Contains(err.Error(), c.says) || !strings.Contains(err.Error(), "kvtier_k") {
			t.Errorf("checkLaunch(%+v, %d args) = %v, want ErrInvalidValue naming kvtier_k and %q", c.cfg, c.args, err, c.says)
		}
	}
}
