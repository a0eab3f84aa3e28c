//go:build cgo

package cudastream

/*
#cgo LDFLAGS: -ldl
#include <stdlib.h>
#include "cuda_driver.h"
*/
import "C"

import (
	"errors"
	"fmt"
	"runtime"
	"sync"
	"sync/atomic"
	"time"
	"unsafe"
)

// Device attributes (CUdevice_attribute) read at Open.
const (
	cuAttrMultiprocessorCount = 16
	cuAttrAsyncEngineCount    = 40
	cuAttrComputeCapMajor     = 75
	cuAttrComputeCapMinor     = 76
	cuAttrHostNUMAID          = 134 // CUDA 12.2+
)

// Flags passed to the driver.
const (
	cuMemHostRegisterPortable  = 0x01 // CU_MEMHOSTREGISTER_PORTABLE
	cuMemHostRegisterDeviceMap = 0x02 // CU_MEMHOSTREGISTER_DEVICEMAP: the copy kernel reads it
	cuMemHostAllocPortable     = 0x01 // CU_MEMHOSTALLOC_PORTABLE
	cuMemHostAllocDeviceMap    = 0x02 // CU_MEMHOSTALLOC_DEVICEMAP
	cuStreamNonBlocking        = 0x01 // CU_STREAM_NON_BLOCKING
	cuEventBlockingSync        = 0x01 // CU_EVENT_BLOCKING_SYNC
	cuEventDisableTiming       = 0x02 // CU_EVENT_DISABLE_TIMING
)

// The layout of Copy is passed to C as drvCopy without conversion.
var _ = [1]struct{}{}[unsafe.Sizeof(Copy{})-C.sizeof_drvCopy]

// Open opens GPU ordinal with its primary context. Without libcuda.so.1, or
// without a device, the error matches ErrNoDriver. The caller MUST Close the
// device once its streams, events and memory are released.
func Open(ordinal int) (Device, error) {
	// dlerror and the first driver calls are per OS thread.
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()

	var errbuf [512]C.char
	t := C.drvLoad(&errbuf[0], C.size_t(len(errbuf)))
	if t == nil {
		return nil, fmt.Errorf("%w: %s", ErrNoDriver, C.GoString(&errbuf[0]))
	}
	d := &drvDevice{t: t}
	if err := d.open(ordinal); err != nil {
		C.drvUnload(t)
		return nil, err
	}
	d.cleanup = runtime.AddCleanup(d, drvReleaseLeaked, drvLeak{t: t})
	return d, nil
}

// drvLeak is what the safety-net cleanup of a device that was never closed
// needs.
type drvLeak struct{ t *C.drvTable }

func drvReleaseLeaked(l drvLeak) {
	C.drvReleasePrimary(l.t)
	C.drvUnload(l.t)
}

// drvDevice is a GPU reached through libcuda.so.1.
type drvDevice struct {
	t                       *C.drvTable
	info                    Info
	prioLeast, prioGreatest int
	closed                  atomic.Bool
	closeMu                 sync.Mutex
	cleanup                 runtime.Cleanup
	kernel                  drvKernel // the copy kernel's module, loaded at first use
	sum                     drvSum    // the word-sum kernel's module, loaded at first use
}

func (d *drvDevice) open(ordinal int) error {
	t := d.t
	if t.init == nil || t.deviceGet == nil || t.primaryCtxRetain == nil || t.ctxSetCurrent == nil {
		return fmt.Errorf("%w: libcuda.so.1 lacks a basic entry point (cuInit, cuDeviceGet, cuDevicePrimaryCtxRetain or cuCtxSetCurrent)", ErrNoDriver)
	}
	if rc := C.drvInit(t); rc != 0 {
		return fmt.Errorf("%w: %w", ErrNoDriver, d.err("cuInit", rc))
	}
	var n C.int
	if rc := C.drvDeviceGetCount(t, &n); rc != 0 {
		return fmt.Errorf("%w: %w", ErrNoDriver, d.err("cuDeviceGetCount", rc))
	}
	if n == 0 {
		return fmt.Errorf("%w: the driver reports no CUDA device", ErrNoDriver)
	}
	if ordinal < 0 || ordinal >= int(n) {
		return fmt.Errorf("cudastream: Open(%d): %w: ordinal out of range, the driver reports %d device(s)", ordinal, ErrInvalidValue, int(n))
	}
	if rc := C.drvDeviceGet(t, C.int(ordinal)); rc != 0 {
		return d.err("cuDeviceGet", rc)
	}
	if rc := C.drvRetainPrimary(t); rc != 0 {
		return d.err("cuDevicePrimaryCtxRetain", rc)
	}
	if err := d.readInfo(ordinal); err != nil {
		C.drvReleasePrimary(t)
		return err
	}
	var least, greatest C.int
	if rc := C.drvPriorityRange(t, &least, &greatest); rc == 0 {
		d.prioLeast, d.prioGreatest = int(least), int(greatest)
	}
	return nil
}

func (d *drvDevice) readInfo(ordinal int) error {
	t := d.t
	in := Info{Ordinal: ordinal, NUMANode: -1, DriverVersion: int(t.driverVersion), BatchCopy: t.batchABI != 0}
	var name [256]C.char
	if rc := C.drvDeviceName(t, &name[0], C.int(len(name))); rc != 0 {
		return d.err("cuDeviceGetName", rc)
	}
	in.Name = C.GoString(&name[0])
	attr := func(a int, dst *int, call string) error {
		var v C.int
		if rc := C.drvAttr(t, C.int(a), &v); rc != 0 {
			return d.err(call, rc)
		}
		*dst = int(v)
		return nil
	}
	for _, a := range []struct {
		attr int
		dst  *int
	}{
		{cuAttrComputeCapMajor, &in.CCMajor},
		{cuAttrComputeCapMinor, &in.CCMinor},
		{cuAttrMultiprocessorCount, &in.SMCount},
		{cuAttrAsyncEngineCount, &in.CopyEngines},
	} {
		if err := attr(a.attr, a.dst, "cuDeviceGetAttribute"); err != nil {
			return err
		}
	}
	var total C.size_t
	if rc := C.drvTotalMem(t, &total); rc != 0 {
		return d.err("cuDeviceTotalMem", rc)
	}
	in.TotalMemBytes = int64(total)
	var bus [64]C.char
	if rc := C.drvPCIBusID(t, &bus[0], C.int(len(bus))); rc == 0 {
		if id, err := drvNormalizeBusID(C.GoString(&bus[0])); err == nil {
			in.PCIBusID = id
		}
	}
	// The driver's HOST_NUMA_ID (CUDA 12.2+) first; sysfs otherwise.
	var node int
	if err := attr(cuAttrHostNUMAID, &node, "cuDeviceGetAttribute"); err == nil && node >= 0 {
		in.NUMANode = node
	}
	if in.PCIBusID != "" {
		f := drvReadPCIFacts(drvSysfsPCIRoot, in.PCIBusID)
		if in.NUMANode < 0 {
			in.NUMANode = f.numaNode
		}
		in.PCIeGen, in.PCIeWidth = f.linkGen, f.linkWidth
	}
	probeNode := in.NUMANode
	if probeNode < 0 {
		probeNode = 0
	}
	var step C.int
	in.HostNUMAAlloc = C.drvProbeHostNUMA(t, C.int(probeNode), &step) == 0
	d.info = in
	return nil
}

// err turns a driver result into an *Error naming the call. It returns nil
// for CUDA_SUCCESS.
func (d *drvDevice) err(call string, rc C.drvResult) error {
	switch {
	case rc == 0:
		return nil
	case rc == C.DRV_MISSING:
		return fmt.Errorf("%s: the driver has no such entry point: %w", call, ErrNotSupported)
	case rc == C.DRV_NOMEM:
		return fmt.Errorf("%s: malloc of the batch descriptors failed: %w", call, ErrOutOfMemory)
	case rc == C.DRV_OUT_OF_RANGE:
		return fmt.Errorf("%s: the copy runs past the end of its allocation (device memory, or for the copy kernel pinned host memory): %w", call, ErrInvalidValue)
	case rc == C.DRV_NO_MODULE:
		return fmt.Errorf("%s: the copy kernel's module is not loaded: %w", call, ErrNotSupported)
	case rc == C.DRV_HOST_UNMAPPED:
		return fmt.Errorf("%s: the host memory is not mapped for the device at its own address (register it with the device first): %w", call, ErrNotRegistered)
	case rc > 0 && rc&C.DRV_NOT_HOST != 0:
		return fmt.Errorf("%s: the host address is in no pinned range known to the driver (%v): %w",
			call, d.err("cuPointerGetAttribute", rc&^C.DRV_NOT_HOST), ErrNotRegistered)
	case rc&C.DRV_NOT_DEVICE != 0:
		// The lookup's error is kept as text, not wrapped: its code (often
		// CUDA_ERROR_NOT_FOUND) would match the wrong sentinel.
		return fmt.Errorf("%s: the device address is in no device allocation (%v): %w",
			call, d.err("cuMemGetAddressRange", rc&^C.DRV_NOT_DEVICE), ErrInvalidValue)
	case rc&C.DRV_CTX_FAILED != 0:
		call = "cuCtxSetCurrent (before " + call + ")"
		rc &^= C.DRV_CTX_FAILED
	}
	e := &Error{Call: call, Code: int(rc)}
	if s := C.drvErrorName(d.t, rc); s != nil {
		e.Name = C.GoString(s)
	} else {
		e.Name = resultName(int(rc))
	}
	if s := C.drvErrorString(d.t, rc); s != nil {
		e.Text = C.GoString(s)
	}
	return e
}

func (d *drvDevice) Info() Info { return d.info }

func (d *drvDevice) usable(call string) error {
	if d.closed.Load() {
		return fmt.Errorf("cudastream: %s: %w: device %d is closed", call, ErrInvalidValue, d.info.Ordinal)
	}
	return nil
}

func (d *drvDevice) MemGetInfo() (free, total int64, err error) {
	if err := d.usable("MemGetInfo"); err != nil {
		return 0, 0, err
	}
	var f, t C.size_t
	if err := d.err("cuMemGetInfo", C.drvMemGetInfo(d.t, &f, &t)); err != nil {
		return 0, 0, err
	}
	return int64(f), int64(t), nil
}

func (d *drvDevice) Alloc(size int64) (DevicePtr, error) {
	if err := d.usable("Alloc"); err != nil {
		return 0, err
	}
	if size <= 0 {
		return 0, fmt.Errorf("cudastream: Alloc(%d): %w: size must be positive", size, ErrInvalidValue)
	}
	var p C.drvCUdeviceptr
	if err := d.err("cuMemAlloc", C.drvMemAlloc(d.t, &p, C.size_t(size))); err != nil {
		return 0, err
	}
	return DevicePtr(p), nil
}

func (d *drvDevice) Free(p DevicePtr) error {
	if err := d.usable("Free"); err != nil {
		return err
	}
	return d.err("cuMemFree", C.drvMemFree(d.t, C.drvCUdeviceptr(p)))
}

func (d *drvDevice) HostRegister(b []byte) error {
	if err := d.usable("HostRegister"); err != nil {
		return err
	}
	if err := drvCheckRegisterLen(len(b)); err != nil {
		return err
	}
	return d.err("cuMemHostRegister", C.drvHostRegister(d.t, C.uint64_t(HostAddr(b)), C.size_t(len(b)), cuMemHostRegisterPortable|cuMemHostRegisterDeviceMap))
}

func (d *drvDevice) HostUnregister(b []byte) error {
	if err := d.usable("HostUnregister"); err != nil {
		return err
	}
	if len(b) == 0 {
		return fmt.Errorf("cudastream: HostUnregister: %w: empty range", ErrInvalidValue)
	}
	return d.err("cuMemHostUnregister", C.drvHostUnregister(d.t, C.uint64_t(HostAddr(b))))
}

func (d *drvDevice) HostAlloc(size int64) ([]byte, error) {
	if err := d.usable("HostAlloc"); err != nil {
		return nil, err
	}
	if size <= 0 {
		return nil, fmt.Errorf("cudastream: HostAlloc(%d): %w: size must be positive", size, ErrInvalidValue)
	}
	var p unsafe.Pointer
	if err := d.err("cuMemHostAlloc", C.drvHostAlloc(d.t, &p, C.size_t(size), cuMemHostAllocPortable|cuMemHostAllocDeviceMap)); err != nil {
		return nil, err
	}
	return unsafe.Slice((*byte)(p), size), nil
}

func (d *drvDevice) HostFree(b []byte) error {
	if err := d.usable("HostFree"); err != nil {
		return err
	}
	if len(b) == 0 {
		return fmt.Errorf("cudastream: HostFree: %w: empty slice", ErrInvalidValue)
	}
	return d.err("cuMemFreeHost", C.drvHostFree(d.t, unsafe.Pointer(unsafe.SliceData(b))))
}

// drvVMMStep names the driver call behind a step number of the C VMM helpers.
func drvVMMStep(step C.int) string {
	switch step {
	case 1:
		return "cuMemGetAllocationGranularity"
	case 2:
		return "cuMemCreate"
	case 3:
		return "cuMemAddressReserve"
	case 4:
		return "cuMemMap"
	case 5:
		return "cuMemSetAccess (device)"
	case 6:
		return "cuMemSetAccess (host NUMA)"
	case 7:
		return "cuMemUnmap"
	case 8:
		return "cuMemAddressFree"
	case 9:
		return "cuMemRelease"
	}
	return "cuMem (VMM)"
}

func (d *drvDevice) HostAllocVMM(size int64, numaNode int) (VMMHost, error) {
	if err := d.usable("HostAllocVMM"); err != nil {
		return nil, err
	}
	if size <= 0 {
		return nil, fmt.Errorf("cudastream: HostAllocVMM(%d): %w: size must be positive", size, ErrInvalidValue)
	}
	if numaNode < 0 {
		numaNode = max(d.info.NUMANode, 0)
	}
	var (
		ptr    C.drvCUdeviceptr
		h      C.drvCUhandle
		mapped C.size_t
		addr   unsafe.Pointer
		step   C.int
	)
	rc := C.drvHostAllocVMM(d.t, C.size_t(size), C.int(numaNode), &ptr, &h, &mapped, &addr, &step)
	if rc != 0 {
		return nil, d.err(drvVMMStep(step), rc)
	}
	v := &drvVMMHost{d: d, ptr: ptr, h: h, mapped: mapped, b: unsafe.Slice((*byte)(addr), size)}
	v.cleanup = runtime.AddCleanup(v, drvFreeLeakedVMM, drvLeakedVMM{t: d.t, ptr: ptr, h: h, mapped: mapped})
	return v, nil
}

type drvLeakedVMM struct {
	t      *C.drvTable
	ptr    C.drvCUdeviceptr
	h      C.drvCUhandle
	mapped C.size_t
}

func drvFreeLeakedVMM(l drvLeakedVMM) {
	var step C.int
	C.drvHostFreeVMM(l.t, l.ptr, l.mapped, l.h, &step)
}

// drvVMMHost is host memory from cuMemCreate(HOST_NUMA), mapped for the CPU
// and the device. Its size is rounded up to the allocation granularity; Bytes
// covers the size asked for.
type drvVMMHost struct {
	d       *drvDevice
	ptr     C.drvCUdeviceptr
	h       C.drvCUhandle
	mapped  C.size_t
	b       []byte
	once    sync.Once
	cleanup runtime.Cleanup
}

func (v *drvVMMHost) Bytes() []byte { return v.b }

func (v *drvVMMHost) Close() error {
	err := fmt.Errorf("cudastream: VMMHost.Close: %w: already closed", ErrInvalidValue)
	v.once.Do(func() {
		v.cleanup.Stop()
		var step C.int
		// The C call sets step: call it before naming the step that failed.
		rc := C.drvHostFreeVMM(v.d.t, v.ptr, v.mapped, v.h, &step)
		err = v.d.err(drvVMMStep(step), rc)
		v.b = nil
	})
	return err
}

func (d *drvDevice) NewStream(priority int) (Stream, error) {
	if err := d.usable("NewStream"); err != nil {
		return nil, err
	}
	// Lower numbers are higher priority; clamp into [greatest, least].
	p := priority
	if d.prioLeast != 0 || d.prioGreatest != 0 {
		p = min(max(p, d.prioGreatest), d.prioLeast)
	}
	var s C.drvCUstream
	if err := d.err("cuStreamCreateWithPriority", C.drvStreamCreate(d.t, &s, cuStreamNonBlocking, C.int(p))); err != nil {
		return nil, err
	}
	b := (*C.drvStreamState)(C.calloc(1, C.sizeof_drvStreamState))
	if b == nil {
		C.drvStreamDestroy(d.t, s)
		return nil, fmt.Errorf("cudastream: NewStream: %w: calloc of the batch descriptors failed", ErrOutOfMemory)
	}
	kopts, _ := KernelCopyOptions{}.withDefaults() // the defaults are valid
	cs := &cuStream{d: d, s: s, st: b, kopts: kopts}
	cs.cleanup = runtime.AddCleanup(cs, drvDestroyLeakedStream, drvLeakedStream{t: d.t, s: s, b: b})
	return cs, nil
}

type drvLeakedStream struct {
	t *C.drvTable
	s C.drvCUstream
	b *C.drvStreamState
}

func drvDestroyLeakedStream(l drvLeakedStream) {
	C.drvStreamDestroy(l.t, l.s)
	C.drvStreamStateFree(l.t, l.b)
}

// cuStream is a non-blocking CUDA stream. Its C-side state (batch descriptor
// arrays that grow on demand, the cache of checked device allocations) is
// guarded by mu.
type cuStream struct {
	d         *drvDevice
	s         C.drvCUstream
	mu        sync.Mutex
	st        *C.drvStreamState
	destroyed atomic.Bool // set under mu
	cleanup   runtime.Cleanup
	kopts     KernelCopyOptions // under mu; defaults filled in
}

// lock takes mu, unless the stream is destroyed.
func (s *cuStream) lock(call string) error {
	s.mu.Lock()
	if s.destroyed.Load() {
		s.mu.Unlock()
		return s.gone(call)
	}
	return nil
}

func (s *cuStream) gone(call string) error {
	return fmt.Errorf("cudastream: Stream.%s: %w: the stream is destroyed", call, ErrInvalidValue)
}

func (s *cuStream) CopyHtoD(dst DevicePtr, src []byte) error {
	if len(src) == 0 {
		return nil
	}
	if err := s.lock("CopyHtoD"); err != nil {
		return err
	}
	rc := C.drvCopyHtoD(s.d.t, s.st, C.drvCUdeviceptr(dst), C.uint64_t(HostAddr(src)), C.size_t(len(src)), s.s)
	s.mu.Unlock()
	if rc != 0 {
		return fmt.Errorf("cudastream: CopyHtoD %d bytes to %#x: %w", len(src), uint64(dst), s.d.err("cuMemcpyHtoDAsync", rc))
	}
	return nil
}

func (s *cuStream) CopyDtoH(dst []byte, src DevicePtr) error {
	if len(dst) == 0 {
		return nil
	}
	if err := s.lock("CopyDtoH"); err != nil {
		return err
	}
	rc := C.drvCopyDtoH(s.d.t, s.st, C.uint64_t(HostAddr(dst)), C.drvCUdeviceptr(src), C.size_t(len(dst)), s.s)
	s.mu.Unlock()
	if rc != 0 {
		return fmt.Errorf("cudastream: CopyDtoH %d bytes from %#x: %w", len(dst), uint64(src), s.d.err("cuMemcpyDtoHAsync", rc))
	}
	return nil
}

func (s *cuStream) CopyDtoD(dst, src DevicePtr, n int64) error {
	if n < 0 {
		return fmt.Errorf("cudastream: CopyDtoD: %w: negative size %d", ErrInvalidValue, n)
	}
	if n == 0 {
		return nil
	}
	if err := s.lock("CopyDtoD"); err != nil {
		return err
	}
	rc := C.drvCopyDtoD(s.d.t, s.st, C.drvCUdeviceptr(dst), C.drvCUdeviceptr(src), C.size_t(n), s.s)
	s.mu.Unlock()
	if rc != 0 {
		return fmt.Errorf("cudastream: CopyDtoD %d bytes from %#x to %#x: %w", n, uint64(src), uint64(dst), s.d.err("cuMemcpyDtoDAsync", rc))
	}
	return nil
}

var _ Copier2D = (*cuStream)(nil)

func (s *cuStream) Copy2D(kind CopyKind, c Copy2D) error {
	if err := checkCopy2D(kind, c); err != nil {
		return err
	}
	if c.Width == 0 || c.Height == 0 {
		return nil
	}
	if err := s.lock("Copy2D"); err != nil {
		return err
	}
	rc := C.drvCopy2DAsync(s.d.t, s.st, C.int(kind), (*C.drvCopy2D)(unsafe.Pointer(&c)), s.s)
	s.mu.Unlock()
	if rc != 0 {
		return fmt.Errorf("cudastream: Copy2D %s of %d rows of %d bytes (dst %#x pitch %d, src %#x pitch %d): %w",
			kind, c.Height, c.Width, c.Dst, c.DstPitch, c.Src, c.SrcPitch, s.d.err("cuMemcpy2DAsync", rc))
	}
	return nil
}

func (s *cuStream) CopyBatch(kind CopyKind, ops []Copy) error {
	if kind >= NumCopyKinds {
		return fmt.Errorf("cudastream: CopyBatch: %w: unknown copy kind %d", ErrInvalidValue, kind)
	}
	for i := range ops {
		if ops[i].Bytes < 0 {
			return fmt.Errorf("cudastream: CopyBatch: %w: descriptor %d has negative size %d", ErrInvalidValue, i, ops[i].Bytes)
		}
	}
	if len(ops) == 0 {
		return nil
	}
	var fail C.size_t
	if err := s.lock("CopyBatch"); err != nil {
		return err
	}
	rc := C.drvCopyBatch(s.d.t, s.st, s.s, C.int(kind), (*C.drvCopy)(unsafe.Pointer(&ops[0])), C.size_t(len(ops)), &fail)
	s.mu.Unlock()
	if rc == 0 {
		return nil
	}
	call := "cuMemcpyBatchAsync"
	if s.d.t.batchABI == 0 {
		call = "cuMemcpy" + kind.String() + "Async"
	}
	err := s.d.err(call, rc)
	if uint64(fail) < uint64(len(ops)) {
		return fmt.Errorf("cudastream: CopyBatch %s: descriptor %d of %d (dst %#x src %#x %d bytes): %w",
			kind, uint64(fail), len(ops), ops[fail].Dst, ops[fail].Src, ops[fail].Bytes, err)
	}
	return fmt.Errorf("cudastream: CopyBatch %s of %d descriptors: %w", kind, len(ops), err)
}

func (s *cuStream) WaitEvent(e Event) error {
	if s.destroyed.Load() {
		return s.gone("WaitEvent")
	}
	ce, ok := e.(*cuEvent)
	if !ok || ce.d != s.d {
		return fmt.Errorf("cudastream: WaitEvent: %w: the event (%T) is not from this device", ErrInvalidValue, e)
	}
	if ce.destroyed.Load() {
		return ce.gone("WaitEvent")
	}
	return s.d.err("cuStreamWaitEvent", C.drvStreamWaitEvent(s.d.t, s.s, ce.e))
}

func (s *cuStream) Query() (bool, error) {
	if s.destroyed.Load() {
		return false, s.gone("Query")
	}
	return drvReady(s.d, "cuStreamQuery", C.drvStreamQuery(s.d.t, s.s))
}

// drvReady maps CUDA_ERROR_NOT_READY to (false, nil).
func drvReady(d *drvDevice, call string, rc C.drvResult) (bool, error) {
	switch rc {
	case 0:
		return true, nil
	case cudaErrorNotReady:
		return false, nil
	}
	return false, d.err(call, rc)
}

func (s *cuStream) Synchronize() error {
	if s.destroyed.Load() {
		return s.gone("Synchronize")
	}
	return s.d.err("cuStreamSynchronize", C.drvStreamSynchronize(s.d.t, s.s))
}

func (s *cuStream) Destroy() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.destroyed.Load() {
		return s.gone("Destroy")
	}
	s.destroyed.Store(true)
	s.cleanup.Stop()
	err := s.d.err("cuStreamDestroy", C.drvStreamDestroy(s.d.t, s.s))
	C.drvStreamStateFree(s.d.t, s.st)
	s.st = nil
	return err
}

func (d *drvDevice) NewEvent(opts EventOptions) (Event, error) {
	if err := d.usable("NewEvent"); err != nil {
		return nil, err
	}
	var flags C.uint
	if !opts.Timing {
		flags |= cuEventDisableTiming
	}
	if opts.BlockingSync {
		flags |= cuEventBlockingSync
	}
	var e C.drvCUevent
	if err := d.err("cuEventCreate", C.drvEventCreate(d.t, &e, flags)); err != nil {
		return nil, err
	}
	ce := &cuEvent{d: d, e: e, timing: opts.Timing}
	ce.cleanup = runtime.AddCleanup(ce, drvDestroyLeakedEvent, drvLeakedEvent{t: d.t, e: e})
	return ce, nil
}

type drvLeakedEvent struct {
	t *C.drvTable
	e C.drvCUevent
}

func drvDestroyLeakedEvent(l drvLeakedEvent) { C.drvEventDestroy(l.t, l.e) }

// cuEvent is a CUDA event.
type cuEvent struct {
	d         *drvDevice
	e         C.drvCUevent
	timing    bool
	destroyed atomic.Bool
	cleanup   runtime.Cleanup
}

func (e *cuEvent) gone(call string) error {
	return fmt.Errorf("cudastream: Event.%s: %w: the event is destroyed", call, ErrInvalidValue)
}

func (e *cuEvent) Record(s Stream) error {
	if e.destroyed.Load() {
		return e.gone("Record")
	}
	cs, ok := s.(*cuStream)
	if !ok || cs.d != e.d {
		return fmt.Errorf("cudastream: Event.Record: %w: the stream (%T) is not from this device", ErrInvalidValue, s)
	}
	if cs.destroyed.Load() {
		return cs.gone("Record")
	}
	return e.d.err("cuEventRecord", C.drvEventRecord(e.d.t, e.e, cs.s))
}

func (e *cuEvent) Query() (bool, error) {
	if e.destroyed.Load() {
		return false, e.gone("Query")
	}
	return drvReady(e.d, "cuEventQuery", C.drvEventQuery(e.d.t, e.e))
}

func (e *cuEvent) Synchronize() error {
	if e.destroyed.Load() {
		return e.gone("Synchronize")
	}
	return e.d.err("cuEventSynchronize", C.drvEventSynchronize(e.d.t, e.e))
}

func (e *cuEvent) Elapsed(start Event) (time.Duration, error) {
	cs, ok := start.(*cuEvent)
	if !ok || cs.d != e.d {
		return 0, fmt.Errorf("cudastream: Event.Elapsed: %w: the start event (%T) is not from this device", ErrInvalidValue, start)
	}
	if e.destroyed.Load() || cs.destroyed.Load() {
		return 0, e.gone("Elapsed")
	}
	if !e.timing || !cs.timing {
		return 0, fmt.Errorf("cudastream: Event.Elapsed: %w: both events need EventOptions.Timing", ErrInvalidValue)
	}
	var ms C.float
	if err := e.d.err("cuEventElapsedTime", C.drvEventElapsed(e.d.t, &ms, cs.e, e.e)); err != nil {
		return 0, err
	}
	return time.Duration(float64(ms) * float64(time.Millisecond)), nil
}

func (e *cuEvent) Destroy() error {
	if e.destroyed.Swap(true) {
		return e.gone("Destroy")
	}
	e.cleanup.Stop()
	return e.d.err("cuEventDestroy", C.drvEventDestroy(e.d.t, e.e))
}

func (d *drvDevice) Close() error {
	d.closeMu.Lock()
	defer d.closeMu.Unlock()
	if d.closed.Swap(true) {
		return fmt.Errorf("cudastream: Device.Close: %w: device %d already closed", ErrInvalidValue, d.info.Ordinal)
	}
	d.cleanup.Stop()
	var errs []error
	if d.kernel.fmaOut != 0 {
		errs = append(errs, d.err("cuMemFree", C.drvMemFree(d.t, C.drvCUdeviceptr(d.kernel.fmaOut))))
	}
	errs = append(errs, d.err("cuModuleUnload", C.drvUnloadCopyModule(d.t)))
	errs = append(errs, d.err("cuModuleUnload (word sums)", C.drvUnloadSumModule(d.t)))
	// The table stays allocated: streams and events may still hold it, and
	// their calls then fail with the driver's error instead of reading freed
	// memory. It is one small struct per Open.
	errs = append(errs, d.err("cuDevicePrimaryCtxRelease", C.drvReleasePrimary(d.t)))
	return errors.Join(errs...)
}
