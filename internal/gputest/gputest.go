// Package gputest is how a test gets a GPU and its pinned host memory.
//
// Its promise, the same in every package that uses it: a test that needs
// a GPU skips on a machine without a CUDA driver, and fails there instead
// when KVTIER_REQUIRE_GPU=1 says a GPU must be there, so that a GPU
// machine that lost its driver cannot pass silently. Any other error
// fails the test. What it hands out is released when the test ends, last
// first (testing.TB.Cleanup): memory before the device it came from. The
// host memory helpers take any cudastream.Device, a cudastream.Sim too.
package gputest

import (
	"errors"
	"os"
	"testing"

	"kvtier.dev/cudastream"
)

// requireEnv, set to 1, makes a missing GPU a failure instead of a skip.
const requireEnv = "KVTIER_REQUIRE_GPU"

// Device opens GPU 0 for t and closes it when t ends. Without a driver it
// skips t, or fails it under KVTIER_REQUIRE_GPU=1.
func Device(t testing.TB) cudastream.Device {
	t.Helper()
	dev, err := cudastream.Open(0)
	SkipOrFail(t, err)
	t.Cleanup(func() {
		if err := dev.Close(); err != nil {
			t.Errorf("gputest: closing GPU 0: %v", err)
		}
	})
	return dev
}

// SkipOrFail ends t when err is not nil. An error that matches
// cudastream.ErrNoDriver (no driver, no device, or a library the GPU work
// needs that would not load) skips t, or fails it under
// KVTIER_REQUIRE_GPU=1; any other error fails t. A nil err does nothing.
func SkipOrFail(t testing.TB, err error) {
	t.Helper()
	switch {
	case err == nil:
	case !errors.Is(err, cudastream.ErrNoDriver):
		t.Fatalf("%v", err)
	case os.Getenv(requireEnv) == "1":
		t.Fatalf("%s=1 but no GPU: %v", requireEnv, err)
	default:
		t.Skipf("no GPU: %v", err)
	}
}
