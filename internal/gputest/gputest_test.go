package gputest

import (
	"errors"
	"fmt"
	"runtime"
	"strings"
	"testing"

	"kvtier.dev/cudastream"
)

// recorder is a testing.TB that records what a helper does to its test.
// Its Skipf and Fatalf end the calling goroutine, as testing's do; its
// cleanups run when the test says.
type recorder struct {
	testing.TB // the real test, for anything not recorded
	skipped    string
	failed     string
	errors     []string
	cleanups   []func()
}

func (r *recorder) Helper() {}

func (r *recorder) Skipf(format string, args ...any) {
	r.skipped = fmt.Sprintf(format, args...)
	runtime.Goexit()
}

func (r *recorder) Fatalf(format string, args ...any) {
	r.failed = fmt.Sprintf(format, args...)
	runtime.Goexit()
}

func (r *recorder) Errorf(format string, args ...any) {
	r.errors = append(r.errors, fmt.Sprintf(format, args...))
}

func (r *recorder) Cleanup(f func()) { r.cleanups = append(r.cleanups, f) }

// run calls f with r on a goroutine of its own, which Skipf and Fatalf
// end, and reports whether f returned.
func (r *recorder) run(f func(testing.TB)) (returned bool) {
	done := make(chan struct{})
	go func() {
		defer close(done)
		f(r)
		returned = true
	}()
	<-done
	return returned
}

// cleanUp runs the cleanups, last first, as testing does.
func (r *recorder) cleanUp() {
	for i := len(r.cleanups) - 1; i >= 0; i-- {
		r.cleanups[i]()
	}
	r.cleanups = nil
}

func TestSkipOrFail(t *testing.T) {
	noDriver := fmt.Errorf("gpu: loading libcublas.so.12: %w", cudastream.ErrNoDriver)
	other := errors.New("cudastream: Open: cuDevicePrimaryCtxRetain: CUDA_ERROR_OUT_OF_MEMORY")
	for _, c := range []struct {
		name           string
		err            error
		require        string
		skip, fail     bool
		messageHolding string
	}{
		{name: "nil", err: nil},
		{name: "nil, GPU required", err: nil, require: "1"},
		{name: "no driver", err: noDriver, skip: true, messageHolding: "libcublas"},
		{name: "no driver, GPU required", err: noDriver, require: "1", fail: true, messageHolding: "KVTIER_REQUIRE_GPU=1 but no GPU: gpu: loading libcublas"},
		{name: "no driver, KVTIER_REQUIRE_GPU=0", err: noDriver, require: "0", skip: true},
		{name: "another error", err: other, fail: true, messageHolding: "CUDA_ERROR_OUT_OF_MEMORY"},
		{name: "another error, GPU required", err: other, require: "1", fail: true, messageHolding: "CUDA_ERROR_OUT_OF_MEMORY"},
	} {
		t.Run(c.name, func(t *testing.T) {
			t.Setenv(requireEnv, c.require)
			r := &recorder{TB: t}
			returned := r.run(func(tb testing.TB) { SkipOrFail(tb, c.err) })
			if skipped, failed := r.skipped != "", r.failed != ""; skipped != c.skip || failed != c.fail || returned == (c.skip || c.fail) {
				t.Fatalf("skipped %v (%q), failed %v (%q), returned %v; want skipped %v, failed %v", skipped, r.skipped, failed, r.failed, returned, c.skip, c.fail)
			}
			if msg := r.skipped + r.failed; !strings.Contains(msg, c.messageHolding) {
				t.Errorf("message %q does not hold %q", msg, c.messageHolding)
			}
		})
	}
}

// TestDevice: on a machine without a CUDA driver Device skips, and fails
// under KVTIER_REQUIRE_GPU=1, saying so. On a GPU machine it returns GPU 0
// and closes it at cleanup.
func TestDevice(t *testing.T) {
	for _, require := range []string{"", "1"} {
		t.Run("KVTIER_REQUIRE_GPU="+require, func(t *testing.T) {
			t.Setenv(requireEnv, require)
			r := &recorder{TB: t}
			var dev cudastream.Device
			if r.run(func(tb testing.TB) { dev = Device(tb) }) {
				t.Logf("a GPU is here: %s", dev.Info().Name)
				r.cleanUp()
				if len(r.errors) > 0 {
					t.Fatalf("cleanup: %v", r.errors)
				}
				if err := dev.Close(); !errors.Is(err, cudastream.ErrInvalidValue) {
					t.Fatalf("Close after cleanup = %v, want ErrInvalidValue: cleanup did not close it", err)
				}
				return
			}
			if require == "1" {
				if !strings.Contains(r.failed, "KVTIER_REQUIRE_GPU=1 but no GPU: ") || !strings.Contains(r.failed, "CUDA driver") || r.skipped != "" {
					t.Fatalf("required and missing: failed %q, skipped %q; want a failure naming KVTIER_REQUIRE_GPU and the driver", r.failed, r.skipped)
				}
				return
			}
			if !strings.HasPrefix(r.skipped, "no GPU: ") || r.failed != "" {
				t.Fatalf("missing: skipped %q, failed %q; want a skip", r.skipped, r.failed)
			}
			if len(r.cleanups) != 0 {
				t.Errorf("%d cleanups registered for a device never opened", len(r.cleanups))
			}
		})
	}
}

// TestHostMemoryFreedAtCleanup: HostAlloc and HostRegistered hand out
// pinned memory of the size asked, writable, and give it back to the
// device when the test ends; the device (a sim here) then refuses to free
// or unregister it again.
func TestHostMemoryFreedAtCleanup(t *testing.T) {
	sim, err := cudastream.NewSim(cudastream.SimConfig{MemoryBytes: 1 << 20})
	if err != nil {
		t.Fatal(err)
	}
	defer sim.Close()
	r := &recorder{TB: t}
	var alloc, reg []byte
	if !r.run(func(tb testing.TB) {
		alloc = HostAlloc(tb, sim, 3<<10+1)
		reg = HostRegistered(tb, sim, 64<<10)
	}) {
		t.Fatalf("skipped %q, failed %q", r.skipped, r.failed)
	}
	if len(alloc) != 3<<10+1 || len(reg) != 64<<10 || cudastream.HostAddr(reg)%4096 != 0 {
		t.Fatalf("%d and %d bytes at %#x; want %d and %d, the second page-aligned", len(alloc), len(reg), cudastream.HostAddr(reg), 3<<10+1, 64<<10)
	}
	alloc[len(alloc)-1], reg[len(reg)-1] = 1, 1
	if err := sim.HostRegister(reg); !errors.Is(err, cudastream.ErrAlreadyRegistered) {
		t.Errorf("HostRegister of the registered memory again = %v, want ErrAlreadyRegistered", err)
	}
	r.cleanUp()
	if len(r.errors) > 0 {
		t.Fatalf("cleanup: %v", r.errors)
	}
	if err := sim.HostFree(alloc); err == nil {
		t.Error("HostFree after cleanup succeeded: cleanup did not free it")
	}
	if err := sim.HostUnregister(reg); !errors.Is(err, cudastream.ErrNotRegistered) {
		t.Errorf("HostUnregister after cleanup = %v, want ErrNotRegistered", err)
	}

	// A failure is reported, and what was made is undone.
	r = &recorder{TB: t}
	if r.run(func(tb testing.TB) { HostAlloc(tb, sim, -1) }) || !strings.Contains(r.failed, "HostAlloc(-1)") {
		t.Errorf("HostAlloc(-1): failed %q", r.failed)
	}
	r = &recorder{TB: t}
	if r.run(func(tb testing.TB) { HostRegistered(tb, sim, 600<<30) }) || r.failed == "" {
		t.Errorf("HostRegistered of 600 GiB: failed %q", r.failed)
	}
	if len(r.cleanups) != 0 {
		t.Errorf("%d cleanups registered for memory never handed out", len(r.cleanups))
	}
}
