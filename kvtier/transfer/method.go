package transfer

import (
	"errors"
	"fmt"

	"kvtier.dev/cudastream"
)

// Method is how the engine submits the copy descriptors of a transfer.
type Method uint8

const (
	// MethodAuto first decides, per transfer, whether it takes the
	// gather/scatter path (MethodGather): where the engine has a device
	// staging ring (Config.GatherBuffers), the GPU side's pieces average
	// under Config.GatherBelowBytes (1 MiB) and the host side coalesces
	// into runs of at least Config.GatherMinRunBytes (1 MiB) and four times
	// those pieces. Both ways at once on the H200 (benchmarks/results/
	// transfer-h200.md, 2026-12-02), it moved 16 KiB blocks at 0.86 of two
	// large copies and serving blocks of 32 layers (64 KiB pieces per
	// layer) at 0.95, where the direct methods below reach 0.55 and 0.70.
	//
	// Otherwise it picks, for each call of at most MaxBatch descriptors, the
	// copy kernel or cuMemcpyBatchAsync by the descriptors' average size:
	// the kernel below Config.KernelBelowBytes (64 KiB), batches from
	// there. One exception: while offloads are in flight, onboards use the
	// kernel below Config.OnboardContendedKernelBelowBytes (256 KiB). The
	// figures behind it: the H200, 1 GiB per transfer, blocks scattered on
	// the GPU, 5 rounds (benchmarks/results/transfer-h200.md, 2026-11-29),
	// median GiB/s. One way at a time:
	//
	//	block    HtoD kernel  batch   DtoH kernel  batch   one large copy
	//	16 KiB      46.0      21.5        47.0      32.9        51.4
	//	64 KiB      46.4      49.2        47.4      48.9        51.4
	//	256 KiB     46.2      49.6        47.6      49.6        51.3
	//	2 MiB       46.5      50.3        48.0      50.2        51.5
	//
	// cuMemcpyBatchAsync costs the CPU 0.5-1 us per descriptor, so 16 KiB
	// blocks are issue-bound there; the kernel's reads and writes over PCIe
	// top out at 90-94% of the copy engines' rate (Hopper's bulk copies
	// reach no more: benchmarks/results/copykernel-h200.md), so 64 KiB
	// blocks and up go to the engines, which also leave the SMs to the
	// server. Both ways at once, sum of the two, the pair being onboard
	// method + offload method, the onboard submitted first:
	//
	//	block    kernel+kernel  kernel+batch  batch+kernel  batch+batch
	//	16 KiB       51.7           37.2          26.3          19.6
	//	64 KiB       54.6           69.9          48.9          58.0
	//	256 KiB      55.0           65.5          49.3          82.8
	//	2 MiB        55.4           62.5          49.5          84.2
	//
	// The kernel's SM-driven PCIe traffic tops out near 55 GiB/s in sum when
	// both directions use it, where the copy engines reach 84. The method
	// is chosen when a call is submitted, so the first of two transfers
	// cannot know the second is coming; the second picks its best move
	// given the first. An offload does best with the one-way switch
	// whatever the onboard uses; an onboard beside batched offloads does
	// best on the kernel up to 64 KiB blocks (69.9 against 58.0) and on
	// batches from 256 KiB. (Beside a kernel offload, which carries pieces
	// under 64 KiB, an onboard of 256 KiB blocks and up would do 10% better
	// on the kernel too; the table gives up that rare case to keep one
	// switch per state.) Where the stream has no copy kernel, or its module
	// cannot be loaded, Auto uses batches.
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
	// MethodGather moves every transfer through the device staging ring
	// (gather.go): the copy kernel gathers the blocks into a device buffer
	// and one DMA per host run crosses the link, or the reverse for
	// onboards. New fails without a ring (Config.GatherBuffers) or without
	// a copy kernel. MethodAuto takes this path where the host side
	// coalesces into long runs (Config.GatherMinRunBytes).
	MethodGather
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
	case MethodGather:
		return "gather"
	}
	return fmt.Sprintf("Method(%d)", uint8(m))
}

// Defaults of MethodAuto's switches (see MethodAuto for the figures).
const (
	// DefaultKernelBelowBytes is Config.KernelBelowBytes's default: the
	// copy kernel beats cuMemcpyBatchAsync on 16 KiB blocks and loses to it
	// from 64 KiB, in each direction.
	DefaultKernelBelowBytes = 64 << 10
	// DefaultOnboardContendedKernelBelowBytes: while offloads are in
	// flight, 64 KiB pieces are onboarded fastest by the kernel, 256 KiB
	// ones by batches.
	DefaultOnboardContendedKernelBelowBytes = 256 << 10
)

// autoTable is MethodAuto's table: a call goes to the copy kernel when its
// descriptors average fewer bytes than kernelBelow[direction][busy], where
// busy says whether the other direction has transfers in flight.
type autoTable struct {
	kernelBelow [2][2]int64 // [onboard, offload][other idle, other busy]
}

const (
	onboardRow = 0
	offloadRow = 1
)

// newAutoTable checks cfg's switches and fills the defaults. The contended
// switch left at zero takes its default, or KernelBelowBytes where that was
// set: one switch set alone applies everywhere.
func newAutoTable(cfg *Config) (autoTable, error) {
	var t autoTable
	alone, busy := cfg.KernelBelowBytes, cfg.OnboardContendedKernelBelowBytes
	switch {
	case alone < 0:
		return t, fmt.Errorf("transfer: Config.KernelBelowBytes must not be negative, got %d", alone)
	case busy < 0:
		return t, fmt.Errorf("transfer: Config.OnboardContendedKernelBelowBytes must not be negative, got %d", busy)
	case busy == 0 && alone != 0:
		busy = alone
	case busy == 0:
		busy = DefaultOnboardContendedKernelBelowBytes
	}
	if alone == 0 {
		alone = DefaultKernelBelowBytes
	}
	t.kernelBelow[onboardRow] = [2]int64{alone, busy}
	t.kernelBelow[offloadRow] = [2]int64{alone, alone}
	return t, nil
}

// useKernel reports whether MethodAuto sends n descriptors of sum bytes in
// all to the copy kernel.
func (t *autoTable) useKernel(row int, otherBusy bool, sum int64, n int) bool {
	col := 0
	if otherBusy {
		col = 1
	}
	return sum < t.kernelBelow[row][col]*int64(n)
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
	busy := d.other.inflight.Load() > 0
	if busy {
		e.stats.contendedDescriptors.Add(int64(len(ops)))
	}
	m := e.method
	if m == MethodAuto {
		m = MethodBatch
		if d.kc != nil && !d.kernelBroken {
			var sum int64
			for i := range ops {
				sum += ops[i].Bytes
			}
			if e.auto.useKernel(d.row, busy, sum, len(ops)) {
				m = MethodKernel
			}
		}
	}
	switch m {
	case MethodKernel:
		err := d.kc.CopyKernel(d.kind, ops)
		if err == nil {
			e.stats.kernelDescriptors.Add(int64(len(ops)))
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
