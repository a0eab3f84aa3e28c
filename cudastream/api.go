// Package cudastream is kvtier's device layer: the CUDA driver API reached from
// Go with no CUDA toolkit, header or library at build time, and a pure-Go
// simulated device with the same interface.
//
// Two implementations of Device exist:
//
//   - Open(ordinal) loads libcuda.so.1 at run time (dlopen), resolves each entry
//     point through cuGetProcAddress at a fixed CUDA version, and drives the real
//     GPU. Built with CGO_ENABLED=0, or on a machine without the driver, Open
//     returns an error that matches ErrNoDriver.
//   - NewSim(SimConfig) returns a simulated device: device memory is host
//     memory, a stream is an ordered queue, an event is a completion marker, and
//     an optional link model makes copies take realistic time, on the wall clock
//     or on a virtual clock. Every package above this one is tested on it.
//
// What the package promises:
//
//   - Every driver call's result is checked; a failure is an *Error naming the
//     call and the CUresult, and errors.Is matches it against the sentinels below.
//   - A missing driver entry point disables that feature (ErrNotSupported); it
//     never crashes.
//   - The CUDA context is made current inside each call that needs it, so
//     methods may be called from any goroutine.
//   - Asynchronous copies only enqueue work. The memory they read or write MUST
//     stay valid and unmodified until an event recorded after the copy has
//     completed (design.md, invariants 2 and 3).
package cudastream

import (
	"errors"
	"fmt"
	"time"
	"unsafe"
)

// DevicePtr is an address in device memory (a CUdeviceptr).
type DevicePtr uint64

// CopyKind is the direction of a copy.
type CopyKind uint8

const (
	HostToDevice CopyKind = iota
	DeviceToHost
	DeviceToDevice
	NumCopyKinds
)

func (k CopyKind) String() string {
	switch k {
	case HostToDevice:
		return "HtoD"
	case DeviceToHost:
		return "DtoH"
	case DeviceToDevice:
		return "DtoD"
	}
	return "CopyKind(?)"
}

// Copy is one descriptor of a batched copy. Dst and Src are addresses: a
// DevicePtr for device memory, HostAddr(b) for host memory. The struct holds no
// Go pointers, so a slice of descriptors is cheap for the garbage collector and
// can be reused from one batch to the next.
type Copy struct {
	Dst, Src uint64
	Bytes    int64
}

// Copy2D is one strided copy: Height rows of Width bytes, row i from
// Src+i*SrcPitch to Dst+i*DstPitch. Addresses are as in Copy. One strided
// copy is one DMA descriptor, however many rows it has: the copy engines
// walk the pitches themselves.
type Copy2D struct {
	Dst, Src           uint64
	DstPitch, SrcPitch int64
	Width, Height      int64
}

// Copier2D is an optional capability of a Stream: strided copies
// (cuMemcpy2DAsync). Both devices implement it; test for it with a type
// assertion. Ownership is as for CopyBatch: the memory MUST stay valid and
// unmodified until an event recorded after the call has completed. Host
// memory SHOULD be pinned (the simulator requires it to be, as for
// CopyBatch). The device side is checked before anything is enqueued, and
// an empty copy (no rows, or rows of no bytes) enqueues nothing.
type Copier2D interface {
	Copy2D(kind CopyKind, c Copy2D) error
}

// checkCopy2D checks what every implementation of Copy2D checks before it
// looks at addresses.
func checkCopy2D(kind CopyKind, c Copy2D) error {
	switch {
	case kind >= NumCopyKinds:
		return fmt.Errorf("cudastream: Copy2D: %w: unknown copy kind %d", ErrInvalidValue, kind)
	case c.Width < 0 || c.Height < 0:
		return fmt.Errorf("cudastream: Copy2D: %w: negative width %d or height %d", ErrInvalidValue, c.Width, c.Height)
	case c.Height > 1 && (c.DstPitch < c.Width || c.SrcPitch < c.Width):
		return fmt.Errorf("cudastream: Copy2D: %w: pitches %d (dst) and %d (src) must be at least the width %d", ErrInvalidValue, c.DstPitch, c.SrcPitch, c.Width)
	}
	return nil
}

// HostAddr returns the address of b's first byte, for use in a Copy. b MUST
// stay alive (and, for pinned memory, registered) until the copy completes.
func HostAddr(b []byte) uint64 {
	return uint64(uintptr(unsafe.Pointer(unsafe.SliceData(b))))
}

// Device is one GPU (or its simulation).
type Device interface {
	// Info reports the device's facts, read once at Open.
	Info() Info
	// MemGetInfo reports free and total device memory now.
	MemGetInfo() (free, total int64, err error)

	// Alloc allocates size bytes of device memory (cuMemAlloc).
	Alloc(size int64) (DevicePtr, error)
	// Free releases memory returned by Alloc.
	Free(p DevicePtr) error

	// HostRegister page-locks caller memory and maps it for DMA
	// (cuMemHostRegister, flag PORTABLE). b must not be 512 GiB or more: the
	// driver refuses such calls (design.md); register in chunks.
	HostRegister(b []byte) error
	// HostUnregister undoes HostRegister for exactly the same range.
	HostUnregister(b []byte) error

	// HostAlloc allocates pinned host memory with cuMemHostAlloc (the baseline
	// the pinned allocator is measured against). Free it with HostFree.
	HostAlloc(size int64) ([]byte, error)
	HostFree(b []byte) error

	// HostAllocVMM allocates pinned host memory through the virtual memory
	// management API: cuMemCreate with a HOST_NUMA location, cuMemMap and
	// cuMemSetAccess. numaNode < 0 means the device's node. Close the result.
	HostAllocVMM(size int64, numaNode int) (VMMHost, error)

	// NewStream creates a non-blocking stream. Lower priority numbers run first
	// (CUDA's convention); 0 is the default priority.
	NewStream(priority int) (Stream, error)
	// NewEvent creates an event. Timing is off unless opts.Timing is set,
	// since timing events cost more to record.
	NewEvent(opts EventOptions) (Event, error)

	// Close releases the device. Streams, events and memory must be released
	// first; Close does not wait for work in flight.
	Close() error
}

// VMMHost is pinned host memory from the VMM path.
type VMMHost interface {
	Bytes() []byte
	Close() error
}

// EventOptions configures NewEvent.
type EventOptions struct {
	// Timing makes the event usable with Elapsed.
	Timing bool
	// BlockingSync makes Synchronize sleep instead of spin.
	BlockingSync bool
}

// Stream is an ordered queue of work on the device.
type Stream interface {
	// CopyHtoD enqueues a copy of src into device memory at dst.
	CopyHtoD(dst DevicePtr, src []byte) error
	// CopyDtoH enqueues a copy of len(dst) bytes from device memory at src.
	CopyDtoH(dst []byte, src DevicePtr) error
	// CopyDtoD enqueues a device-to-device copy of n bytes.
	CopyDtoD(dst, src DevicePtr, n int64) error
	// CopyBatch enqueues many copies of one kind. It uses cuMemcpyBatchAsync
	// where the driver has it and a loop of single copies otherwise; the
	// result is the same. ops may be reused once CopyBatch returns. Every
	// descriptor is checked before any is enqueued, so a bad one enqueues
	// nothing; descriptors of zero bytes are no-ops (their addresses are
	// not checked), and an empty ops enqueues nothing.
	CopyBatch(kind CopyKind, ops []Copy) error
	// WaitEvent makes later work on this stream wait until e completes,
	// without blocking the host (cuStreamWaitEvent).
	WaitEvent(e Event) error
	// Query reports whether all work enqueued so far has completed.
	Query() (bool, error)
	// Synchronize blocks until all work enqueued so far has completed.
	Synchronize() error
	// Destroy releases the stream after its work completes.
	Destroy() error
}

// Event marks a point in a stream.
type Event interface {
	// Record captures the work enqueued on s so far.
	Record(s Stream) error
	// Query reports whether the captured work has completed. An event never
	// recorded counts as complete, as in CUDA.
	Query() (bool, error)
	// Synchronize blocks until the captured work has completed.
	Synchronize() error
	// Elapsed returns the time from start to this event. Both must have been
	// created with Timing and have completed.
	Elapsed(start Event) (time.Duration, error)
	// Destroy releases the event.
	Destroy() error
}

// Info holds a device's facts. Fields that could not be read are zero, with
// NUMANode -1.
type Info struct {
	Ordinal       int
	Name          string
	CCMajor       int // compute capability, major
	CCMinor       int
	SMCount       int
	TotalMemBytes int64
	CopyEngines   int    // CU_DEVICE_ATTRIBUTE_ASYNC_ENGINE_COUNT
	PCIBusID      string // as "0000:3b:00.0"
	NUMANode      int    // -1 when unknown
	PCIeGen       int    // current link generation (sysfs)
	PCIeWidth     int    // current link width (sysfs)
	DriverVersion int    // as cuDriverGetVersion: 13000 is CUDA 13.0
	BatchCopy     bool   // cuMemcpyBatchAsync is available
	HostNUMAAlloc bool   // cuMemCreate with a HOST_NUMA location works
	Simulated     bool
}

// Sentinels. errors.Is(err, ErrX) holds for every error of that class,
// including *Error values from the driver.
var (
	// ErrNoDriver: libcuda.so.1 could not be loaded, the build has no cgo, or
	// no device exists.
	ErrNoDriver = errors.New("cudastream: no CUDA driver")
	// ErrNotSupported: the driver lacks the entry point or the feature.
	ErrNotSupported = errors.New("cudastream: not supported")
	// ErrInvalidValue: an argument was out of range (CUDA_ERROR_INVALID_VALUE
	// and the simulator's bounds checks).
	ErrInvalidValue = errors.New("cudastream: invalid value")
	// ErrOutOfMemory: an allocation failed (CUDA_ERROR_OUT_OF_MEMORY).
	ErrOutOfMemory = errors.New("cudastream: out of memory")
	// ErrNotRegistered: host memory that had to be registered was not
	// (CUDA_ERROR_HOST_MEMORY_NOT_REGISTERED).
	ErrNotRegistered = errors.New("cudastream: host memory not registered")
	// ErrAlreadyRegistered: CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED.
	ErrAlreadyRegistered = errors.New("cudastream: host memory already registered")
	// ErrNotReady: the work has not completed (CUDA_ERROR_NOT_READY).
	ErrNotReady = errors.New("cudastream: not ready")
	// ErrIllegalAddress: a copy or kernel touched memory it may not
	// (CUDA_ERROR_ILLEGAL_ADDRESS; the simulator's use-after-free).
	ErrIllegalAddress = errors.New("cudastream: illegal address")
)
