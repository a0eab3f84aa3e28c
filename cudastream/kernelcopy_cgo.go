//go:build cgo

package cudastream

/*
#include <stdlib.h>
#include "cuda_driver.h"
*/
import "C"

import (
	"fmt"
	"sync"
	"unsafe"
)

// drvKernel is a device's copy-kernel module, loaded once at first use.
type drvKernel struct {
	once    sync.Once
	err     error
	hostPtr bool      // the device reaches registered memory at the host's address
	fmaOut  DevicePtr // LaunchFMA's output, one float per thread
}

const (
	fmaThreads      = 256
	fmaMaxCTAsPerSM = 64
)

// loadKernel loads the module on first use and reports why it cannot be used.
func (d *drvDevice) loadKernel() error {
	k := &d.kernel
	k.once.Do(func() {
		ptx := C.CString(copyPTX)
		defer C.free(unsafe.Pointer(ptx))
		var hostPtr, step C.int
		if rc := C.drvLoadCopyModule(d.t, ptx, &hostPtr, &step); rc != 0 {
			k.err = fmt.Errorf("cudastream: loading the copy kernel: %w", d.err(drvKernelStep(step), rc))
			return
		}
		k.hostPtr = hostPtr != 0
		p, err := d.Alloc(int64(max(d.info.SMCount, 1) * fmaMaxCTAsPerSM * fmaThreads * 4))
		if err != nil {
			k.err = fmt.Errorf("cudastream: the FMA kernel's output: %w", err)
			return
		}
		k.fmaOut = p
	})
	return k.err
}

// drvKernelStep names the driver call behind a step of the C kernel helpers.
func drvKernelStep(step C.int) string {
	switch step {
	case 1:
		return "cuDeviceGetAttribute (CAN_USE_HOST_POINTER_FOR_REGISTERED_MEM)"
	case 2:
		return "cuModuleLoadData"
	case 3:
		return "cuModuleGetFunction (kvtier_copy)"
	case 4:
		return "cuModuleGetFunction (kvtier_fma)"
	case 5:
		return "cuMemHostAlloc (descriptor ring)"
	case 6:
		return "cuMemAlloc (descriptor ring)"
	case 7:
		return "cuEventCreate (descriptor ring)"
	case 8:
		return "cuEventSynchronize (descriptor ring slot)"
	case 9:
		return "cuMemcpyHtoDAsync (descriptors)"
	case 10:
		return "cuLaunchKernel (kvtier_copy)"
	case 11:
		return "cuEventRecord (descriptor ring slot)"
	case 12:
		return "cuMemGetAddressRange"
	case 13:
		return "cuPointerGetAttribute"
	}
	return "kvtier_copy"
}

var _ KernelCopier = (*cuStream)(nil)
var _ ComputeLoader = (*cuStream)(nil)

func (s *cuStream) SetKernelCopyOptions(o KernelCopyOptions) error {
	o, err := o.withDefaults()
	if err != nil {
		return err
	}
	if err := s.lock("SetKernelCopyOptions"); err != nil {
		return err
	}
	if s.st.kcap != 0 && (o.Launches != int(s.st.kslots) || o.PiecesPerLaunch != int(s.st.kcap)) {
		s.mu.Unlock()
		return fmt.Errorf("cudastream: SetKernelCopyOptions: the stream's descriptor ring already has %d slots of %d pieces; Launches %d and PiecesPerLaunch %d cannot change it: %w",
			s.st.kslots, s.st.kcap, o.Launches, o.PiecesPerLaunch, ErrInvalidValue)
	}
	s.kopts = o
	s.mu.Unlock()
	return nil
}

func (s *cuStream) CopyKernel(kind CopyKind, ops []Copy) error {
	if err := checkCopyOps("CopyKernel", kind, ops); err != nil {
		return err
	}
	if len(ops) == 0 {
		return nil
	}
	if err := s.d.loadKernel(); err != nil {
		return err
	}
	if kind != DeviceToDevice && !s.d.kernel.hostPtr {
		return fmt.Errorf("cudastream: CopyKernel %s: %w: the device cannot use host pointers for registered memory", kind, ErrNotSupported)
	}
	if err := s.lock("CopyKernel"); err != nil {
		return err
	}
	o := s.kopts
	opts := C.drvKernelOpts{ctas: C.uint(o.CTAs), threads: C.uint(o.ThreadsPerCTA), pieceBytes: C.size_t(o.PieceBytes),
		launches: C.uint(o.Launches), pieces: C.uint(o.PiecesPerLaunch)}
	if o.MappedDescriptors {
		opts.mapped = 1
	}
	var fail C.size_t
	var step C.int
	rc := C.drvCopyKernel(s.d.t, s.st, s.s, C.int(kind), (*C.drvCopy)(unsafe.Pointer(&ops[0])), C.size_t(len(ops)), &opts, &fail, &step)
	s.mu.Unlock()
	if rc == 0 {
		return nil
	}
	err := s.d.err(drvKernelStep(step), rc)
	if uint64(fail) < uint64(len(ops)) {
		return fmt.Errorf("cudastream: CopyKernel %s: descriptor %d of %d (dst %#x src %#x %d bytes): %w",
			kind, uint64(fail), len(ops), ops[fail].Dst, ops[fail].Src, ops[fail].Bytes, err)
	}
	return fmt.Errorf("cudastream: CopyKernel %s of %d descriptors: %w", kind, len(ops), err)
}

func (s *cuStream) LaunchFMA(ctasPerSM, iterations int) error {
	if ctasPerSM < 1 || ctasPerSM > fmaMaxCTAsPerSM {
		return fmt.Errorf("cudastream: LaunchFMA(%d, %d): %w: CTAs per SM must be in [1, %d]", ctasPerSM, iterations, ErrInvalidValue, fmaMaxCTAsPerSM)
	}
	if iterations < 0 || int64(iterations) > 1<<32-1 {
		return fmt.Errorf("cudastream: LaunchFMA(%d, %d): %w: iterations must be in [0, 2^32)", ctasPerSM, iterations, ErrInvalidValue)
	}
	if err := s.d.loadKernel(); err != nil {
		return err
	}
	if s.destroyed.Load() {
		return s.gone("LaunchFMA")
	}
	grid := max(s.d.info.SMCount, 1) * ctasPerSM
	return s.d.err("cuLaunchKernel (kvtier_fma)", C.drvLaunchFMA(s.d.t, s.s, C.drvCUdeviceptr(s.d.kernel.fmaOut), C.uint(grid), fmaThreads, C.uint(iterations)))
}

// setBatchTuning changes how CopyBatch calls cuMemcpyBatchAsync on d, for
// the measurements in cuda_test.go: srcAccessOrder (0: STREAM), flags,
// whether to pass location hints and whether to check each descriptor's
// device range first. Not safe while copies are being submitted.
func setBatchTuning(dev Device, order int, flags uint, hints, check bool) {
	d := dev.(*drvDevice)
	d.t.batchOrder = C.int(order)
	d.t.batchFlags = C.uint(flags)
	d.t.batchNoHints = 0
	if !hints {
		d.t.batchNoHints = 1
	}
	d.t.batchNoCheck = 0
	if !check {
		d.t.batchNoCheck = 1
	}
}

// setBatchChunk sets the descriptors per cuMemcpyBatchAsync call on d (0:
// DRV_BATCH_CHUNK), for the measurements in copyvariants_gpu_test.go. Not
// safe while copies are being submitted.
func setBatchChunk(dev Device, n uint) {
	dev.(*drvDevice).t.batchChunk = C.uint(n)
}
