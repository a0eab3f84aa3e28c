package transfer

import (
	"errors"
	"fmt"

	"kvtier.dev/cudastream"
)

// Method is how the engine submits the copy descriptors of a transfer.
type Method uint8

const (
	// MethodAuto sends descriptors that average fewer bytes than
	// Config.KernelBelowBytes (default 1 MiB) to the copy kernel and the
	// rest to cuMemcpyBatchAsync. On the H200, 1 GiB per transfer, one way
	// (benchmarks/results/transfer-h200.md, 2026-11-29), in GiB/s:
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
	// also leave the SMs to the server. Both directions at once, the kernel
	// reaches only 50-58 GiB/s in sum where batches reach 70-80 from 256 KiB
	// up; Auto does not yet look at the other direction's traffic. Where the
	// stream has no copy kernel, or its module cannot be loaded, Auto uses
	// batches.
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

// DefaultKernelBelowBytes is Config.KernelBelowBytes's default: on the H200
// the copy kernel beats cuMemcpyBatchAsync up to 256 KiB per descriptor
// (each way) and loses to it at 2 MiB.
const DefaultKernelBelowBytes = 1 << 20

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

// submitOps hands ops to d's stream by the engine's method. Called with d.mu
// held.
func (e *Engine) submitOps(d *direction, ops []cudastream.Copy) error {
	m := e.method
	if m == MethodAuto {
		m = MethodBatch
		if d.kc != nil && !d.kernelBroken {
			var sum int64
			for i := range ops {
				sum += ops[i].Bytes
			}
			if sum < e.kernelBelow*int64(len(ops)) {
				m = MethodKernel
			}
		}
	}
	switch m {
	case MethodKernel:
		err := d.kc.CopyKernel(d.kind, ops)
		if err == nil {
			e.stats.KernelDescriptors.Add(int64(len(ops)))
			return nil
		}
		if e.method != MethodAuto || !errors.Is(err, cudastream.ErrNotSupported) {
			return err
		}
		// The device cannot run the kernel (no module entry points, or
		// no host pointers for registered memory): batches from now on.
		// CopyKernel checks this before enqueuing anything.
		d.kernelBroken = true
	case MethodLoop:
		for i := range ops {
			if err := d.stream.CopyBatch(d.kind, ops[i:i+1]); err != nil {
				return fmt.Errorf("descriptor %d of the loop: %w", i, err)
			}
		}
		return nil
	}
	return d.stream.CopyBatch(d.kind, ops)
}
