package cudastream

import (
	"bytes"
	"errors"
	"testing"
	"time"
)

// TestSimLaunchGoRunsInOrder: a Go kernel sees the bytes the copies before
// it wrote, the copies after it see its output, and it costs
// KernelLaunch + Cost on the virtual clock.
func TestSimLaunchGoRunsInOrder(t *testing.T) {
	link := H200Link()
	s := newTestSim(t, SimVirtualClock, link)
	st := mustStream(t, s, 0)
	gl, ok := st.(GoLauncher)
	if !ok {
		t.Fatalf("%T does not implement GoLauncher", st)
	}
	const n = 4096
	dev := mustAlloc(t, s, 2*n)
	in, err := s.HostAlloc(n)
	must(t, err)
	out, err := s.HostAlloc(n)
	must(t, err)
	for i := range in {
		in[i] = byte(i)
	}
	must(t, st.CopyHtoD(dev, in))
	start := eventTime(t, s, st)
	const cost = 3 * time.Microsecond
	must(t, gl.LaunchGo(GoKernel{Name: "not", Cost: cost,
		Ranges: []DeviceRange{{dev, n}, {dev + n, n}},
		Run: func(mem [][]byte) error {
			for i, b := range mem[0] {
				mem[1][i] = ^b
			}
			return nil
		}}))
	if got, want := eventTime(t, s, st)-start, link.KernelLaunch+cost+link.EventCost; got != want {
		t.Errorf("the Go kernel took %v on the virtual clock, want %v", got, want)
	}
	must(t, st.CopyDtoH(out, dev+n))
	must(t, st.Synchronize())
	for i, b := range out {
		if b != ^byte(i) {
			t.Fatalf("byte %d is %#x after the Go kernel, want %#x", i, b, ^byte(i))
		}
	}
}

// TestSimLaunchGoErrors: bad launches enqueue nothing and say why; a
// failing Run faults the stream, naming the kernel.
func TestSimLaunchGoErrors(t *testing.T) {
	s := newTestSim(t, SimVirtualClock, LinkModel{})
	st := mustStream(t, s, 0)
	gl := st.(GoLauncher)
	dev := mustAlloc(t, s, 4096)
	run := func([][]byte) error { return nil }
	for name, k := range map[string]GoKernel{
		"nil Run":       {Name: "k", Ranges: []DeviceRange{{dev, 16}}},
		"negative cost": {Name: "k", Ranges: []DeviceRange{{dev, 16}}, Cost: -1, Run: run},
		"empty range":   {Name: "k", Ranges: []DeviceRange{{dev, 0}}, Run: run},
		"past the end":  {Name: "k", Ranges: []DeviceRange{{dev, 4097}}, Run: run},
		"not allocated": {Name: "k", Ranges: []DeviceRange{{dev + 1<<30, 16}}, Run: run},
	} {
		if err := gl.LaunchGo(k); !errors.Is(err, ErrInvalidValue) {
			t.Errorf("%s: LaunchGo = %v, want ErrInvalidValue", name, err)
		}
	}
	must(t, st.Synchronize())
	must(t, gl.LaunchGo(GoKernel{Name: "kvtier_broken", Ranges: []DeviceRange{{dev, 16}},
		Run: func([][]byte) error { return errors.New("scale is NaN") }}))
	err := st.Synchronize()
	if err == nil || !bytes.Contains([]byte(err.Error()), []byte("kvtier_broken (Go kernel): scale is NaN")) {
		t.Fatalf("Synchronize after a failing Go kernel = %v, want the kernel's fault", err)
	}
}

// TestSimLaunchGoTimingOnly: without bytes, the op takes its time and Run
// is not called.
func TestSimLaunchGoTimingOnly(t *testing.T) {
	s, err := NewSim(SimConfig{MemoryBytes: 1 << 20, TimingOnly: true, Clock: SimVirtualClock})
	must(t, err)
	defer s.Close()
	st := mustStream(t, s, 0)
	defer st.Destroy()
	dev := mustAlloc(t, s, 4096)
	defer s.Free(dev)
	ran := false
	must(t, st.(GoLauncher).LaunchGo(GoKernel{Name: "k", Cost: time.Millisecond, Ranges: []DeviceRange{{dev, 4096}},
		Run: func([][]byte) error { ran = true; return nil }}))
	if got := eventTime(t, s, st); got != time.Millisecond {
		t.Errorf("the op ended at %v, want 1ms", got)
	}
	if ran {
		t.Error("Run was called on a TimingOnly simulator")
	}
}
