// Package stacktest opens a cache (kvtier/stack) over a simulated GPU for
// the tests of packages built on it, so that they do not wire a device
// stack by hand.
//
// It promises a small, fixed shape: blocks of 2 layers, K and V, 1 KiB
// each (BlockBytes, 4 KiB: O_DIRECT-sized), a GPU region of
// Options.GPUBlocks of them, the tiers Options asks for, everything closed
// at the test's end; and a stream of the test's own to write and read GPU
// slots, as a prefill kernel would.
package stacktest

import (
	"context"
	"log/slog"
	"testing"

	"kvtier.dev/cudastream"
	"kvtier.dev/kvtier"
	"kvtier.dev/kvtier/stack"
	"kvtier.dev/kvtier/transfer"
)

// The blocks' shape.
const (
	Layers     = 2
	PartBytes  = 1 << 10
	BlockBytes = Layers * 2 * PartBytes
)

// Options sizes the cache. Zero fields take the defaults named.
type Options struct {
	GPUBlocks    int  // the GPU tier's slots; 0 means 8
	HostBlocks   int  // the host tier's slots; 0 means 8
	NVMeBlocks   int  // the NVMe tier's slots (in a temporary directory); 0: none
	BlockTokens  int  // 0 means 4
	WriteThrough bool // stack.Options.WriteThrough
	EventBuffer  int  // stack.Options.EventBuffer; 0: no event stream
	Planner      kvtier.Planner
}

// Stack is an open cache and what a test needs to play the server.
type Stack struct {
	*stack.Cache
	Sim    *cudastream.Sim
	GPU    transfer.GPULayout
	region cudastream.DevicePtr
	st     cudastream.Stream
}

// Open opens the cache o describes, or fails t.
func Open(t testing.TB, o Options) *Stack {
	t.Helper()
	if o.GPUBlocks == 0 {
		o.GPUBlocks = 8
	}
	if o.HostBlocks == 0 {
		o.HostBlocks = 8
	}
	if o.BlockTokens == 0 {
		o.BlockTokens = 4
	}
	sim, err := cudastream.NewSim(cudastream.SimConfig{MemoryBytes: int64(o.GPUBlocks)*BlockBytes + 1<<20, Link: cudastream.H200Link()})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { sim.Close() })
	s := &Stack{Sim: sim}
	if s.region, err = sim.Alloc(int64(o.GPUBlocks) * BlockBytes); err != nil {
		t.Fatal(err)
	}
	if s.GPU, err = transfer.BlockFirstLayout(s.region, Layers, 2, o.GPUBlocks, PartBytes); err != nil {
		t.Fatal(err)
	}
	if s.st, err = sim.NewStream(0); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.st.Destroy() })
	so := stack.Options{Device: sim, GPU: s.GPU, BlockTokens: o.BlockTokens, HostBytes: int64(o.HostBlocks) * BlockBytes,
		WriteThrough: o.WriteThrough, Planner: o.Planner, EventBuffer: o.EventBuffer, Logger: slog.New(slog.DiscardHandler)}
	if o.NVMeBlocks > 0 {
		so.NVMeDirs, so.NVMeBytes = []string{t.TempDir()}, int64(o.NVMeBlocks)*BlockBytes
	}
	if s.Cache, err = stack.Open(context.Background(), so); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := s.Cache.Close(); err != nil {
			t.Error(err)
		}
	})
	return s
}

func (s *Stack) addr(slot kvtier.Slot) cudastream.DevicePtr {
	return s.region + cudastream.DevicePtr(int64(slot)*BlockBytes)
}

// WriteGPU writes kv (BlockBytes) into GPU slot slot, as a prefill would,
// and waits for it.
func (s *Stack) WriteGPU(t testing.TB, slot kvtier.Slot, kv []byte) {
	t.Helper()
	if err := s.st.CopyHtoD(s.addr(slot), kv); err != nil {
		t.Fatal(err)
	}
	if err := s.st.Synchronize(); err != nil {
		t.Fatal(err)
	}
}

// ReadGPU returns the bytes of GPU slot slot.
func (s *Stack) ReadGPU(t testing.TB, slot kvtier.Slot) []byte {
	t.Helper()
	b := make([]byte, BlockBytes)
	if err := s.st.CopyDtoH(b, s.addr(slot)); err != nil {
		t.Fatal(err)
	}
	if err := s.st.Synchronize(); err != nil {
		t.Fatal(err)
	}
	return b
}

// HostSlot returns the memory of host slot slot (its first BlockBytes).
func (s *Stack) HostSlot(slot kvtier.Slot) []byte { return s.Host.Slot(int32(slot))[:BlockBytes] }
