package transfer

import (
	"errors"
	"fmt"

	"kvtier.dev/cudastream"
)

// Method is how the engine submits the copy descriptors of a transfer.
type Method uint8

const (
	// MethodAuto chooses per transfer, then per call, by measured
	// switches. A transfer takes the gather/scatter path (MethodGather)
	// where the engine has a device staging ring (Config.GatherBuffers), the
	// GPU side's pieces average under Config.GatherBelowBytes and the host
	// side coalesces into runs averaging at least Config.GatherMinRunBytes
	// and four times those pieces. Otherwise each call of at most MaxBatch
	// descriptors goes to the copy kernel when they average under
	// Config.KernelBelowBytes (Config.OnboardContendedKernelBelowBytes for
	// an onboard while offloads are in flight), and to batches from there.
	// Where the stream has no copy kernel, or its module cannot be loaded,
	// Auto uses batches. The H200 figures behind the switches:
	// docs/transfer.md.
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

// Defaults of MethodAuto's switches (docs/transfer.md has the figures).
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
