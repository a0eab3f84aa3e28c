package cudastream_test

import (
	"encoding/binary"
	"errors"
	"strings"
	"testing"

	"kvtier.dev/internal/gputest"

	. "kvtier.dev/cudastream"
)

// storePTX is a hand-written module: kvtier_store(p, v) writes the 8-byte
// value v at device address p.
const storePTX = `.version 7.0
.target sm_70
.address_size 64
.visible .entry kvtier_store(.param .u64 p, .param .u64 v)
{
	.reg .b64 %rd<3>;
	ld.param.u64 %rd1, [p];
	ld.param.u64 %rd2, [v];
	cvta.to.global.u64 %rd1, %rd1;
	st.global.u64 [%rd1], %rd2;
	ret;
}
`

// TestSimHasNoModules: the simulator runs no PTX, so it does not offer
// the capability; packages with kernels fall back to Go on it.
func TestSimHasNoModules(t *testing.T) {
	sim, err := NewSim(SimConfig{MemoryBytes: 1 << 20})
	if err != nil {
		t.Fatal(err)
	}
	defer sim.Close()
	if _, ok := Device(sim).(ModuleLoader); ok {
		t.Fatal("the simulator claims to load PTX modules")
	}
}

func TestCuModuleLaunch(t *testing.T) {
	dev := gputest.Device(t)
	ml, ok := dev.(ModuleLoader)
	if !ok {
		t.Fatal("the real device is not a ModuleLoader")
	}
	mod, err := ml.LoadModule("storePTX", storePTX)
	if err != nil {
		t.Fatal(err)
	}
	fn, err := mod.Function("kvtier_store")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := mod.Function("kvtier_nope"); err == nil || !strings.Contains(err.Error(), "kvtier_nope") {
		t.Errorf("Function of a missing kernel: %v, want an error naming it", err)
	}
	st, err := dev.NewStream(0)
	if err != nil {
		t.Fatal(err)
	}
	defer st.Destroy()
	p, err := dev.Alloc(8)
	if err != nil {
		t.Fatal(err)
	}
	defer dev.Free(p)
	one := LaunchConfig{Grid: [3]uint32{1, 1, 1}, Block: [3]uint32{1, 1, 1}}
	l := st.(Launcher)
	if err := l.Launch(fn, one, []uint64{uint64(p), 0x0123456789abcdef}); err != nil {
		t.Fatal(err)
	}
	got := make([]byte, 8)
	if err := st.CopyDtoH(got, p); err != nil {
		t.Fatal(err)
	}
	if err := st.Synchronize(); err != nil {
		t.Fatal(err)
	}
	if v := binary.LittleEndian.Uint64(got); v != 0x0123456789abcdef {
		t.Fatalf("the kernel stored %#x", v)
	}
	if err := mod.Unload(); err != nil {
		t.Fatal(err)
	}
	if err := l.Launch(fn, one, []uint64{uint64(p), 1}); !errors.Is(err, ErrInvalidValue) || !strings.Contains(err.Error(), "unloaded") {
		t.Errorf("Launch after Unload: %v, want ErrInvalidValue saying unloaded", err)
	}
	if _, err := ml.LoadModule("garbage", "not ptx"); err == nil || !strings.Contains(err.Error(), "garbage") {
		t.Errorf("LoadModule of garbage: %v, want an error naming it", err)
	}
	if _, err := ml.LoadModule("empty", ""); !errors.Is(err, ErrInvalidValue) {
		t.Errorf("LoadModule of nothing: %v, want ErrInvalidValue", err)
	}
}

func TestCuLaunchBadConfig(t *testing.T) {
	dev := gputest.Device(t)
	mod, err := dev.(ModuleLoader).LoadModule("storePTX", storePTX)
	if err != nil {
		t.Fatal(err)
	}
	defer mod.Unload()
	fn, err := mod.Function("kvtier_store")
	if err != nil {
		t.Fatal(err)
	}
	st, err := dev.NewStream(0)
	if err != nil {
		t.Fatal(err)
	}
	defer st.Destroy()
	ok := [3]uint32{1, 1, 1}
	cases := []struct {
		cfg  LaunchConfig
		args int
		says string
	}{
		{LaunchConfig{Grid: [3]uint32{0, 1, 1}, Block: ok}, 2, "at least 1"},
		{LaunchConfig{Grid: ok, Block: [3]uint32{32, 0, 1}}, 2, "at least 1"},
		{LaunchConfig{Grid: ok, Block: [3]uint32{1024, 2, 1}}, 2, "2048 threads"},
		{LaunchConfig{Grid: [3]uint32{1, 65536, 1}, Block: ok}, 2, "65535"},
		{LaunchConfig{Grid: ok, Block: ok}, MaxLaunchArgs + 1, "17 arguments"},
	}
	for _, c := range cases {
		err := st.(Launcher).Launch(fn, c.cfg, make([]uint64, c.args))
		if !errors.Is(err, ErrInvalidValue) || !strings.Contains(err.Error(), c.says) || !strings.Contains(err.Error(), "kvtier_store") {
			t.Errorf("Launch %+v with %d args: %v, want ErrInvalidValue naming kvtier_store and %q", c.cfg, c.args, err, c.says)
		}
	}
	if err := st.Synchronize(); err != nil {
		t.Fatalf("a refused launch left the stream broken: %v", err)
	}
}
