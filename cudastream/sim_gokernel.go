package cudastream

import (
	"fmt"
	"time"
)

// GoLauncher is an optional capability of the simulator's streams: work
// that the real device does with a kernel a package above this one owns
// (its PTX loaded through ModuleLoader, which the simulator lacks), done
// in Go over the simulated device memory, in stream order. The package
// then keeps one path for both devices: where a real stream launches its
// kernel, a simulated one runs its Go reference at the same point.
// Test for it with a type assertion.
type GoLauncher interface {
	// LaunchGo enqueues k. Its ranges are checked now (each inside one
	// live allocation) and, like a copy's, MUST stay allocated until an
	// event recorded after the call has completed; freeing one earlier
	// faults the stream. k.Run is called when the op completes, with the
	// ranges' bytes in k.Ranges' order, under the simulator's lock: it
	// MUST NOT call the simulator. An error from Run faults the stream,
	// naming k.Name, as a kernel's fault would. A TimingOnly simulator
	// has no bytes: the op takes its time and Run is not called.
	LaunchGo(k GoKernel) error
}

// GoKernel is one LaunchGo call.
type GoKernel struct {
	// Name names the kernel in errors, e.g. "kvtier_fp8_quantize".
	Name string
	// Ranges is the device memory the work reads or writes.
	Ranges []DeviceRange
	// Cost is the work's modelled time on the device; the op also pays
	// LinkModel.KernelLaunch. It occupies the device-to-device engine,
	// as the simulated copy kernel and word sums do.
	Cost time.Duration
	// Run does the work; see LaunchGo.
	Run func(mem [][]byte) error
}

// DeviceRange is Bytes of device memory at Ptr.
type DeviceRange struct {
	Ptr   DevicePtr
	Bytes int64
}

// simGoKernel is a LaunchGo op's work, done at its completion.
type simGoKernel struct {
	name string
	mem  [][]byte
	run  func([][]byte) error
}

func (g *simGoKernel) runOn(st *simStream) {
	if err := g.run(g.mem); err != nil {
		st.setFault(cudaErrorLaunchFailed, fmt.Sprintf("%s (Go kernel): %v", g.name, err))
	}
}

var _ GoLauncher = (*simStream)(nil)

// LaunchGo implements GoLauncher.
func (st *simStream) LaunchGo(k GoKernel) error {
	call := "cuLaunchKernel (" + k.Name + ")"
	switch {
	case k.Run == nil:
		return simError(call, cudaErrorInvalidValue, "GoKernel.Run is nil")
	case k.Cost < 0:
		return simError(call, cudaErrorInvalidValue, "GoKernel.Cost %v is negative", k.Cost)
	}
	s := st.sim
	s.mu.Lock()
	defer s.mu.Unlock()
	if err := st.check(call); err != nil {
		return err
	}
	op := s.newOp(simOpCopy, call)
	op.dir = DeviceToDevice
	g := &simGoKernel{name: k.Name, run: k.Run, mem: make([][]byte, len(k.Ranges))}
	for i, r := range k.Ranges {
		if r.Bytes <= 0 {
			s.putOp(op)
			return simError(call, cudaErrorInvalidValue, "range %d (%#x) has %d bytes, want at least 1", i, uint64(r.Ptr), r.Bytes)
		}
		al, off, err := s.mem.resolve(call, r.Ptr, r.Bytes)
		if err != nil {
			s.putOp(op)
			return fmt.Errorf("range %d of %d: %w", i, len(k.Ranges), err)
		}
		op.spans = append(op.spans, simSpan{dstMem: al})
		if al.data != nil {
			g.mem[i] = al.data[off : off+r.Bytes]
		}
		op.bytes += r.Bytes
	}
	if !s.timingOnly {
		op.goKernel = g
	}
	op.cost = s.link.KernelLaunch + k.Cost
	s.enqueue(st, op)
	return nil
}
