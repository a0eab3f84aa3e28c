package transfer

import (
	"errors"
	"fmt"

	"kvtier.dev/cudastream"
)

// Method is how the engine submits the copy descriptors of a transfer.
type Method uint8

const (
	// MethodAuto picks, for each call of at most MaxBatch descriptors, the
	// copy kernel or cuMemcpyBatchAsync by the descriptors' average size and
	// by what the other direction is doing: nothing, copies through the
	// kernel, or copies through batches only (transfers submitted and not
	// yet done). One table, each entry a "kernel below" switch:
	//
	//	                  other idle   other on the kernel   other on batches
	//	onboard (HtoD)      1 MiB            1 MiB               256 KiB
	//	offload (DtoH)      1 MiB           64 KiB                64 KiB
	//
	// (Config.KernelBelowBytes, Config.OnboardContendedKernelBelowBytes and
	// Config.OffloadContendedKernelBelowBytes.) The figures behind it: the
	// H200, 1 GiB per transfer, blocks scattered on the GPU
	// (benchmarks/results/transfer-h200.md, 2026-11-29), in GiB/s. One way
	// at a time:
	//
	//	block    HtoD kernel  batch   DtoH kernel  batch   one large copy
	//	16 KiB      44.1       3.7        44.9      21.3        51.0
	//	64 KiB      45.8      41.7        47.0      42.4        51.0
	//	256 KiB     46.1      42.4        47.5      42.5        50.7
	//	2 MiB       46.1      48.8        47.7      49.6        51.0
	//
	// cuMemcpyBatchAsync costs the CPU 1.1 us per descriptor host to device
	// and 0.4 us device to host (whatever its attributes), so small blocks
	// are issue-bound; the kernel's reads and writes over PCIe top out near
	// 90% of the copy engines' rate, so large blocks go to the engines, which
	// also leave the SMs to the server. Both ways at once, sum of the two,
	// the pair being onboard method + offload method:
	//
	//	block    kernel+kernel  kernel+batch  batch+kernel  batch+batch
	//	16 KiB       49.6           36.4           9.7          11.2
	//	64 KiB       56.8           66.1          46.2          61.2
	//	256 KiB      58.6           63.9          46.2          75.8
	//	2 MiB        58.6           61.2          48.5          83.0
	//
	// The kernel's SM-driven PCIe traffic tops out near 57 GiB/s in sum when
	// both directions use it, where the copy engines reach 80, and a batched
	// onboard beside a kernel offload is the worst pair at every size. The
	// method is chosen when a call is submitted, so the first of two
	// transfers cannot know the second is coming; the table picks the best
	// second move given the first: an offload during an onboard leaves the
	// kernel from 64 KiB (kernel+batch 66.1 and 63.9, batch+batch 75.8 and
	// 83.0); an onboard during a kernel offload stays on the kernel
	// (kernel+kernel, never batch+kernel), and during a batched offload
	// moves to batches from 256 KiB. One way at a time the kernel is used
	// below 1 MiB. Where the stream has no copy kernel, or its module cannot
	// be loaded, Auto uses batches.
	MethodAuto Method = iota
	// MethodBatch submits cuMemcpyBatchAsync calls (or the driver's loop of
	// single copies where it lacks them).
	MethodBatch
	// MethodKernel submits copy-kernel launches (cudastream.KernelCopier):
	// SMs read or write the pinned host pool directly. New fails if the
	// device's streams cannot do it.
	MethodKernel
	// MethodLoop submits one cuMemcpyAsync per descriptor: the baseline the
	// others are measured against.
	MethodLoop
	NumMethods
)

func (m Method) String() string {
	switch m {
	case MethodAuto:
		return "auto"
	case MethodBatch:
		return "batch"
	case MethodKernel:
		return "kernel"
	case MethodLoop:
		return "loop"
	}
	return fmt.Sprintf("Method(%d)", uint8(m))
}

// Defaults of MethodAuto's table (see MethodAuto for the figures).
const (
	// DefaultKernelBelowBytes is Config.KernelBelowBytes's default: one
	// way at a time, the copy kernel beats cuMemcpyBatchAsync up to 256
	// KiB per descriptor and loses to it at 2 MiB.
	DefaultKernelBelowBytes = 1 << 20
	// DefaultOnboardContendedKernelBelowBytes: while offloads run through
	// batches, 64 KiB pieces are onboarded fastest by the kernel, 256 KiB
	// ones by batches. (While offloads run through the kernel, onboards keep
	// the one-way switch.)
	DefaultOnboardContendedKernelBelowBytes = 256 << 10
	// DefaultOffloadContendedKernelBelowBytes: while onboards run, 16 KiB
	// pieces are offloaded fastest by the kernel, 64 KiB ones by batches.
	DefaultOffloadContendedKernelBelowBytes = 64 << 10
)

// autoTable is MethodAuto's table: a call goes to the copy kernel when its
// descriptors average fewer bytes than kernelBelow[direction][other], where
// other is what the other direction is doing.
type autoTable struct {
	kernelBelow [2][numOtherStates]int64 // [onboard, offload][otherState]
}

// otherState is what the other direction has in flight.
type otherState uint8

const (
	otherIdle    otherState = iota // nothing
	otherKernel                    // at least one transfer that used the copy kernel
	otherBatches                   // transfers, none of them on the kernel
	numOtherStates
)

const (
	onboardRow = 0
	offloadRow = 1
)

// newAutoTable checks cfg's switches and fills the defaults. A contended
// switch left at zero takes its default, lowered to KernelBelowBytes where
// that is smaller: contention never sends more work to the kernel.
func newAutoTable(cfg *Config) (autoTable, error) {
	var t autoTable
	alone := cfg.KernelBelowBytes
	switch {
	case alone < 0:
		return t, fmt.Errorf("transfer: Config.KernelBelowBytes must not be negative, got %d", alone)
	case alone == 0:
		alone = DefaultKernelBelowBytes
	}
	busy := [2]int64{}
	for row, c := range []struct {
		field string
		v     int64
		def   int64
	}{
		{"OnboardContendedKernelBelowBytes", cfg.OnboardContendedKernelBelowBytes, DefaultOnboardContendedKernelBelowBytes},
		{"OffloadContendedKernelBelowBytes", cfg.OffloadContendedKernelBelowBytes, DefaultOffloadContendedKernelBelowBytes},
	} {
		b := c.v
		switch {
		case b < 0:
			return t, fmt.Errorf("transfer: Config.%s must not be negative, got %d", c.field, b)
		case b > alone:
			return t, fmt.Errorf("transfer: Config.%s (%d) is above KernelBelowBytes (%d): contention must not send more work to the copy kernel", c.field, b, alone)
		case b == 0:
			b = min(c.def, alone)
		}
		busy[row] = b
	}
	t.kernelBelow[onboardRow] = [numOtherStates]int64{otherIdle: alone, otherKernel: alone, otherBatches: busy[onboardRow]}
	t.kernelBelow[offloadRow] = [numOtherStates]int64{otherIdle: alone, otherKernel: busy[offloadRow], otherBatches: busy[offloadRow]}
	return t, nil
}

// useKernel reports whether MethodAuto sends n descriptors of sum bytes in
// all to the copy kernel.
func (t *autoTable) useKernel(row int, other otherState, sum int64, n int) bool {
	return sum < t.kernelBelow[row][other]*int64(n)
}

// state says what d is doing, for the other direction's choice.
func (d *direction) state() otherState {
	switch {
	case d.inflight.Load() == 0:
		return otherIdle
	case d.kernelInflight.Load() > 0:
		return otherKernel
	}
	return otherBatches
}

// setupMethod checks the method against the device and tunes each stream's
// copy kernel. Called by New once the streams exist.
func (e *Engine) setupMethod(cfg *Config) error {
	for _, d := range []*direction{&e.on, &e.off} {
		kc, ok := d.stream.(cudastream.KernelCopier)
		if !ok {
			continue
		}
		if err := kc.SetKernelCopyOptions(cfg.KernelCopy); err != nil {
			return fmt.Errorf("transfer: Config.KernelCopy: %w", err)
		}
		d.kc = kc
	}
	if cfg.Method == MethodKernel && (e.on.kc == nil || e.off.kc == nil) {
		return fmt.Errorf("transfer: Config.Method is kernel, but the device's streams (%T) have no copy kernel", e.on.stream)
	}
	return nil
}

// submitOps hands ops to d's stream by the engine's method and reports
// whether the copy kernel took them. Called with d.mu held.
func (e *Engine) submitOps(d *direction, ops []cudastream.Copy) (kernel bool, err error) {
	other := d.other.state()
	if other != otherIdle {
		e.stats.ContendedDescriptors.Add(int64(len(ops)))
	}
	m := e.method
	if m == MethodAuto {
		m = MethodBatch
		if d.kc != nil && !d.kernelBroken {
			var sum int64
			for i := range ops {
				sum += ops[i].Bytes
			}
			if e.auto.useKernel(d.row, other, sum, len(ops)) {
				m = MethodKernel
			}
		}
	}
	switch m {
	case MethodKernel:
		err := d.kc.CopyKernel(d.kind, ops)
		if err == nil {
			e.stats.KernelDescriptors.Add(int64(len(ops)))
			return true, nil
		}
		if e.method != MethodAuto || !errors.Is(err, cudastream.ErrNotSupported) {
			return false, err
		}
		// The device cannot run the kernel (no module entry points, or
		// no host pointers for registered memory): batches from now on.
		// CopyKernel checks this before enqueuing anything.
		d.kernelBroken = true
	case MethodLoop:
		for i := range ops {
			if err := d.stream.CopyBatch(d.kind, ops[i:i+1]); err != nil {
				return false, fmt.Errorf("descriptor %d of the loop: %w", i, err)
			}
		}
		return false, nil
	}
	return false, d.stream.CopyBatch(d.kind, ops)
}
