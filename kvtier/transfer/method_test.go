package transfer

import (
	"bytes"
	"context"
	"fmt"
	"math/rand/v2"
	"strings"
	"testing"
	"testing/synctest"
	"time"

	"kvtier.dev/cudastream"
)

// TestMethodsMoveTheSameBytes runs the same scattered onboard and offload
// through every method and checks the data, which method moved the
// descriptors, and that on the H200's modelled link the copy kernel beats
// batches and batches beat the loop for small pieces.
func TestMethodsMoveTheSameBytes(t *testing.T) {
	took := map[Method]time.Duration{}
	for _, m := range []Method{MethodAuto, MethodBatch, MethodKernel, MethodLoop} {
		t.Run(m.String(), func(t *testing.T) {
			f := newFixture(t, "layer-first", cudastream.H200Link())
			e := f.engine(t, Config{Method: m})
			rng := rand.New(rand.NewPCG(5, uint64(m)))
			fill(rng, f.host.Pool[:fxSlots/2*int(f.host.SlotBytes)])
			in := make([]Pair, fxSlots/2)
			out := make([]Pair, fxSlots/2)
			for i, b := range rng.Perm(fxBlocks)[:fxSlots/2] {
				in[i] = Pair{GPUBlock: int32(b), HostSlot: int32(i)}
				out[i] = Pair{GPUBlock: int32(b), HostSlot: int32(fxSlots/2 + i)}
			}
			tr, err := e.Onboard(context.Background(), in)
			if err != nil {
				t.Fatal(err)
			}
			<-tr.Done()
			took[m] = tr.Duration()
			wait(t, tr)
			tr, err = e.Offload(context.Background(), out, nil)
			if err != nil {
				t.Fatal(err)
			}
			wait(t, tr)
			for i := range in {
				if !bytes.Equal(f.host.Slot(int32(i)), f.host.Slot(int32(fxSlots/2+i))) {
					t.Fatalf("slot %d came back different", i)
				}
			}
			all, kernel := e.Stats().Descriptors, e.Stats().KernelDescriptors
			// 4 KiB pieces (and 32 KiB blocks offloaded whole) are all
			// below the 64 KiB switch: Auto picks the kernel.
			wantKernel := m == MethodKernel || m == MethodAuto
			if wantKernel && kernel != all || !wantKernel && kernel != 0 {
				t.Errorf("method %v: the kernel moved %d of %d descriptors", m, kernel, all)
			}
		})
	}
	if !(took[MethodKernel] < took[MethodBatch] && took[MethodBatch] < took[MethodLoop]) {
		t.Errorf("modelled onboard times: kernel %v, batch %v, loop %v; want kernel < batch < loop",
			took[MethodKernel], took[MethodBatch], took[MethodLoop])
	}
	if took[MethodAuto] != took[MethodKernel] {
		t.Errorf("auto took %v, the kernel %v: auto should have used the kernel", took[MethodAuto], took[MethodKernel])
	}
}

// TestAutoSwitchesOnDescriptorSize: with the switch below the coalesced
// block size, Auto sends whole blocks to batches and split layers to the
// kernel.
func TestAutoSwitchesOnDescriptorSize(t *testing.T) {
	f := newFixture(t, "block-first", cudastream.LinkModel{})
	blockBytes := f.gpu.BlockBytes() // 32 KiB, one descriptor per block when offloaded
	e := f.engine(t, Config{KernelBelowBytes: blockBytes})
	pairs := []Pair{{3, 0}, {9, 1}, {27, 2}}
	tr, err := e.Offload(context.Background(), pairs, nil)
	if err != nil {
		t.Fatal(err)
	}
	wait(t, tr)
	if k := e.Stats().KernelDescriptors; k != 0 {
		t.Errorf("offload of whole %d-byte blocks with the switch at %d: the kernel moved %d descriptors, want 0 (batch)", blockBytes, blockBytes, k)
	}
	// An onboard moves layer by layer: pieces of 2*4 KiB (K and V are
	// adjacent in a block-first layout), below the switch.
	tr, err = e.Onboard(context.Background(), pairs)
	if err != nil {
		t.Fatal(err)
	}
	wait(t, tr)
	if k := e.Stats().KernelDescriptors; k != int64(len(pairs)*fxLayers) {
		t.Errorf("onboard of %d blocks x %d layers: the kernel moved %d descriptors, want %d", len(pairs), fxLayers, k, len(pairs)*fxLayers)
	}
}

// noKernelDevice hides the sim's copy kernel from the engine.
type noKernelDevice struct{ cudastream.Device }

type noKernelStream struct{ cudastream.Stream }

func (d noKernelDevice) NewStream(prio int) (cudastream.Stream, error) {
	s, err := d.Device.NewStream(prio)
	if err != nil {
		return nil, err
	}
	return noKernelStream{s}, nil
}

func TestMethodConfigErrors(t *testing.T) {
	f := newFixture(t, "layer-first", cudastream.LinkModel{})
	for _, tc := range []struct {
		name string
		dev  cudastream.Device
		cfg  Config
		want string
	}{
		{"unknown method", f.sim, Config{Method: NumMethods}, "Config.Method"},
		{"negative switch", f.sim, Config{KernelBelowBytes: -1}, "KernelBelowBytes"},
		{"negative contended switch", f.sim, Config{OnboardContendedKernelBelowBytes: -1}, "OnboardContendedKernelBelowBytes must not be negative"},
		{"bad kernel CTAs", f.sim, Config{KernelCopy: cudastream.KernelCopyOptions{CTAs: -2}}, "KernelCopy"},
		{"bad kernel threads", f.sim, Config{Method: MethodKernel, KernelCopy: cudastream.KernelCopyOptions{ThreadsPerCTA: 100}}, "ThreadsPerCTA"},
		{"kernel without a copy kernel", noKernelDevice{f.sim}, Config{Method: MethodKernel}, "no copy kernel"},
	} {
		tc.cfg.GPU, tc.cfg.Host = f.gpu, f.host
		if _, err := New(tc.dev, tc.cfg); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: New = %v, want an error naming %q", tc.name, err, tc.want)
		}
	}
}

func TestMethodString(t *testing.T) {
	for m, want := range map[Method]string{MethodAuto: "auto", MethodBatch: "batch", MethodKernel: "kernel", MethodLoop: "loop", MethodGather: "gather", NumMethods: "Method(5)"} {
		if got := m.String(); got != want {
			t.Errorf("Method(%d).String() = %q, want %q", uint8(m), got, want)
		}
	}
}

// TestAutoTable checks MethodAuto's default table against the H200
// measurements it was read from (docs/transfer.md): for each measured block
// size, the method that was fastest, one way and both ways at once.
func TestAutoTable(t *testing.T) {
	tab, err := newAutoTable(&Config{})
	if err != nil {
		t.Fatal(err)
	}
	const kernel, batch = true, false
	for _, tc := range []struct {
		block int64
		// one way; onboard during an offload; offload during an onboard
		onAlone, offAlone      bool
		onDuringOff, offDuring bool
	}{
		// one way HtoD kernel/batch, DtoH kernel/batch; both ways
		// (onboard+offload): kernel+kernel, kernel+batch, batch+kernel, batch+batch
		{16 << 10, kernel, kernel, kernel, kernel}, // 46.0/21.5, 47.0/32.9; 51.7, 37.2, 26.3, 19.6
		{64 << 10, batch, batch, kernel, batch},    // 46.4/49.2, 47.4/48.9; 54.6, 69.9, 48.9, 58.0
		{256 << 10, batch, batch, batch, batch},    // 46.2/49.6, 47.6/49.6; 55.0, 65.5, 49.3, 82.8
		{2 << 20, batch, batch, batch, batch},      // 46.5/50.3, 48.0/50.2; 55.4, 62.5, 49.5, 84.2
	} {
		const n = 1000
		for _, c := range []struct {
			what string
			row  int
			busy bool
			want bool
		}{
			{"onboard alone", onboardRow, false, tc.onAlone},
			{"offload alone", offloadRow, false, tc.offAlone},
			{"onboard during an offload", onboardRow, true, tc.onDuringOff},
			{"offload during an onboard", offloadRow, true, tc.offDuring},
		} {
			if got := tab.useKernel(c.row, c.busy, n*tc.block, n); got != c.want {
				t.Errorf("%s of %d-byte pieces: kernel = %v, want %v", c.what, tc.block, got, c.want)
			}
		}
	}

	// The one-way switch set alone applies everywhere.
	tab, err = newAutoTable(&Config{KernelBelowBytes: 128 << 10})
	if err != nil {
		t.Fatal(err)
	}
	if want := [2][2]int64{{128 << 10, 128 << 10}, {128 << 10, 128 << 10}}; tab.kernelBelow != want {
		t.Errorf("KernelBelowBytes 128 KiB: table %v, want %v", tab.kernelBelow, want)
	}
	tab, err = newAutoTable(&Config{OnboardContendedKernelBelowBytes: 4 << 20})
	if err != nil {
		t.Fatal(err)
	}
	if want := [2][2]int64{{64 << 10, 4 << 20}, {64 << 10, 64 << 10}}; tab.kernelBelow != want {
		t.Errorf("explicit contended switch: table %v, want %v", tab.kernelBelow, want)
	}

	for _, tc := range []struct {
		cfg  Config
		want string
	}{
		{Config{KernelBelowBytes: -1}, "KernelBelowBytes must not be negative"},
		{Config{OnboardContendedKernelBelowBytes: -1}, "OnboardContendedKernelBelowBytes must not be negative"},
		{Config{KernelBelowBytes: 4096, OnboardContendedKernelBelowBytes: -8192}, "OnboardContendedKernelBelowBytes must not be negative, got -8192"},
	} {
		if _, err := newAutoTable(&tc.cfg); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%+v: err = %v, want one containing %q", tc.cfg, err, tc.want)
		}
	}
}

// contentionRig is a wall-clock sim (run it inside synctest.Test, whose
// fake time stands still until every goroutine waits) with the H200's
// modelled link and one engine over blocks of blockBytes: one layer, one
// part, so each block is one descriptor both ways.
type contentionRig struct {
	sim *cudastream.Sim
	e   *Engine
}

const rigBlocks, rigSlots = 32, 16

func newContentionRig(t *testing.T, blockBytes int64, cfg Config) *contentionRig {
	t.Helper()
	sim, err := cudastream.NewSim(cudastream.SimConfig{MemoryBytes: 64 << 20, Link: cudastream.H200Link(), Clock: cudastream.SimWallClock})
	if err != nil {
		t.Fatal(err)
	}
	r := &contentionRig{sim: sim}
	region, err := sim.Alloc(rigBlocks * blockBytes)
	if err != nil {
		t.Fatal(err)
	}
	if cfg.GPU, err = BlockFirstLayout(region, 1, 1, rigBlocks, blockBytes); err != nil {
		t.Fatal(err)
	}
	pool, err := sim.HostAlloc(rigSlots * blockBytes)
	if err != nil {
		t.Fatal(err)
	}
	cfg.Host = HostLayout{Pool: pool, SlotBytes: blockBytes}
	if r.e, err = New(sim, cfg); err != nil {
		t.Fatal(err)
	}
	return r
}

func (r *contentionRig) close(t *testing.T) {
	if err := r.e.Close(); err != nil {
		t.Errorf("engine Close: %v", err)
	}
	r.sim.Close()
}

// rigPairs maps host slots first..first+n-1 to every other GPU block from
// gpu0, so that nothing coalesces.
func rigPairs(first, gpu0, n int) []Pair {
	p := make([]Pair, n)
	for i := range p {
		p[i] = Pair{GPUBlock: int32(gpu0 + 2*i), HostSlot: int32(first + i)}
	}
	return p
}

// submit starts an onboard of slots 0-7 or an offload into slots 8-15, on
// disjoint GPU blocks.
func (r *contentionRig) submit(t *testing.T, kind cudastream.CopyKind) *Transfer {
	t.Helper()
	var tr *Transfer
	var err error
	if kind == cudastream.HostToDevice {
		tr, err = r.e.Onboard(context.Background(), rigPairs(0, 0, rigSlots/2))
	} else {
		tr, err = r.e.Offload(context.Background(), rigPairs(rigSlots/2, 1, rigSlots/2), nil)
	}
	if err != nil {
		t.Fatal(err)
	}
	return tr
}

// TestAutoWatchesOtherDirection submits each direction alone, then one
// while the other is still in flight (synctest's clock stands still between
// the two calls, so the first is certainly not done), and checks which
// method moved each transfer. One way at a time the choice is the one-way
// switch's whatever happened before; under contention it is the table's
// busy column; the transfer submitted first, into an idle link, keeps the
// one-way choice.
func TestAutoWatchesOtherDirection(t *testing.T) {
	const kernel, batch = true, false
	for _, tc := range []struct {
		block                    int64
		method                   Method
		onAlone, offAlone        bool
		onDuringOff, offDuringOn bool
	}{
		{16 << 10, MethodAuto, kernel, kernel, kernel, kernel},
		{64 << 10, MethodAuto, batch, batch, kernel, batch}, // an onboard beside an offload takes the kernel
		{256 << 10, MethodAuto, batch, batch, batch, batch},
		{2 << 20, MethodAuto, batch, batch, batch, batch},
		// Forced methods ignore the other direction.
		{256 << 10, MethodKernel, kernel, kernel, kernel, kernel},
		{16 << 10, MethodBatch, batch, batch, batch, batch},
	} {
		t.Run(fmt.Sprintf("%v/%dKiB", tc.method, tc.block>>10), func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				r := newContentionRig(t, tc.block, Config{Method: tc.method})
				defer r.close(t)
				n := rigSlots / 2
				check := func(what string, tr *Transfer, want bool) {
					t.Helper()
					wait(t, tr)
					if got := tr.KernelCopies(); want && got != n || !want && got != 0 {
						t.Errorf("%s: the kernel moved %d of %d descriptors, want kernel = %v", what, got, n, want)
					}
				}
				// One way at a time, twice, in both orders.
				for range 2 {
					check("onboard alone", r.submit(t, cudastream.HostToDevice), tc.onAlone)
					check("offload alone", r.submit(t, cudastream.DeviceToHost), tc.offAlone)
				}
				if c := r.e.Stats().ContendedDescriptors; c != 0 {
					t.Errorf("one way at a time: %d descriptors counted as contended, want 0", c)
				}

				off := r.submit(t, cudastream.DeviceToHost)
				on := r.submit(t, cudastream.HostToDevice)
				check("offload submitted into an idle link", off, tc.offAlone)
				check("onboard during an offload", on, tc.onDuringOff)

				on = r.submit(t, cudastream.HostToDevice)
				off = r.submit(t, cudastream.DeviceToHost)
				check("onboard submitted into an idle link", on, tc.onAlone)
				check("offload during an onboard", off, tc.offDuringOn)
				if c := r.e.Stats().ContendedDescriptors; c != int64(2*n) {
					t.Errorf("after two contended submissions of %d descriptors: ContendedDescriptors = %d, want %d", n, c, 2*n)
				}

				// Once both are done, the link is idle again.
				check("onboard after both finished", r.submit(t, cudastream.HostToDevice), tc.onAlone)
				check("offload after both finished", r.submit(t, cudastream.DeviceToHost), tc.offAlone)
			})
		})
	}
}
