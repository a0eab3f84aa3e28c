package transfer

import (
	"bytes"
	"context"
	"math/rand/v2"
	"strings"
	"testing"
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
			all, kernel := e.Stats().Descriptors.Load(), e.Stats().KernelDescriptors.Load()
			// 4 KiB pieces (and 32 KiB blocks offloaded whole) are all
			// below the 1 MiB switch: Auto picks the kernel.
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
	if k := e.Stats().KernelDescriptors.Load(); k != 0 {
		t.Errorf("offload of whole %d-byte blocks with the switch at %d: the kernel moved %d descriptors, want 0 (batch)", blockBytes, blockBytes, k)
	}
	// An onboard moves layer by layer: pieces of 2*4 KiB (K and V are
	// adjacent in a block-first layout), below the switch.
	tr, err = e.Onboard(context.Background(), pairs)
	if err != nil {
		t.Fatal(err)
	}
	wait(t, tr)
	if k := e.Stats().KernelDescriptors.Load(); k != int64(len(pairs)*fxLayers) {
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
	for m, want := range map[Method]string{MethodAuto: "auto", MethodBatch: "batch", MethodKernel: "kernel", MethodLoop: "loop", NumMethods: "Method(4)"} {
		if got := m.String(); got != want {
			t.Errorf("Method(%d).String() = %q, want %q", uint8(m), got, want)
		}
	}
}
