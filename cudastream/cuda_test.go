package cudastream_test

import (
	"bytes"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"slices"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"kvtier.dev/internal/gputest"

	// The GPU tests are outside the package: export_test.go says why.
	. "kvtier.dev/cudastream"
)

// The tests named TestCu* that open a device run on a real GPU. Without a
// driver they skip, unless KVTIER_REQUIRE_GPU=1 says a GPU must be there.
// Build them here and run them on the GPU machine:
//
//	go test -c -o .gpu/cudastream.test ./cudastream
//	KVTIER_REQUIRE_GPU=1 ./.gpu/cudastream.test -test.v

// cuRandom fills b from a seeded generator, 8 bytes at a time.
func cuRandom(r *rand.Rand, b []byte) {
	i := 0
	for ; i+8 <= len(b); i += 8 {
		v := r.Uint64()
		b[i], b[i+1], b[i+2], b[i+3] = byte(v), byte(v>>8), byte(v>>16), byte(v>>24)
		b[i+4], b[i+5], b[i+6], b[i+7] = byte(v>>32), byte(v>>40), byte(v>>48), byte(v>>56)
	}
	for ; i < len(b); i++ {
		b[i] = byte(r.Uint32())
	}
}

func cuMust(t *testing.T, what string, err error) {
	t.Helper()
	if err != nil {
		t.Fatalf("%s: %v", what, err)
	}
}

// ---- without a GPU ----

func TestCuOpenNoDriver(t *testing.T) {
	d, err := Open(0)
	if err == nil {
		d.Close()
		t.Skip("a driver and device are present; the no-driver path is not reachable here")
	}
	if !errors.Is(err, ErrNoDriver) {
		t.Fatalf("Open(0) without a driver = %v, want an error matching ErrNoDriver", err)
	}
	if msg := err.Error(); !strings.Contains(msg, "libcuda") && !strings.Contains(msg, "device") {
		t.Errorf("error %q does not say what is missing", msg)
	}
}

func TestCuOpenBadOrdinal(t *testing.T) {
	d, err := Open(-1)
	if err == nil {
		d.Close()
		t.Fatal("Open(-1) succeeded")
	}
	if !errors.Is(err, ErrNoDriver) && !errors.Is(err, ErrInvalidValue) {
		t.Fatalf("Open(-1) = %v, want ErrNoDriver or ErrInvalidValue", err)
	}
}

func TestCuErrorFormatAndIs(t *testing.T) {
	e := &Error{Call: "cuMemcpyHtoDAsync", Code: 1, Name: "CUDA_ERROR_INVALID_VALUE", Text: "invalid argument"}
	if got, want := e.Error(), "cuMemcpyHtoDAsync: CUDA_ERROR_INVALID_VALUE (1): invalid argument"; got != want {
		t.Errorf("Error() = %q, want %q", got, want)
	}
	wrapped := fmt.Errorf("cudastream: CopyBatch HtoD: descriptor 3 of 10: %w", e)
	if !errors.Is(wrapped, ErrInvalidValue) || errors.Is(wrapped, ErrOutOfMemory) {
		t.Errorf("errors.Is on a wrapped INVALID_VALUE is wrong")
	}
	var got *Error
	if !errors.As(wrapped, &got) || got.Code != 1 {
		t.Errorf("errors.As lost the *Error")
	}
	for code, want := range map[int]error{
		2: ErrOutOfMemory, 100: ErrNoDriver, 600: ErrNotReady, 700: ErrIllegalAddress,
		712: ErrAlreadyRegistered, 713: ErrNotRegistered, 801: ErrNotSupported, 500: ErrNotSupported,
	} {
		if !errors.Is(&Error{Call: "x", Code: code}, want) {
			t.Errorf("code %d does not match %v", code, want)
		}
	}
	if errors.Is(&Error{Call: "x", Code: 999}, ErrInvalidValue) {
		t.Errorf("CUDA_ERROR_UNKNOWN matched ErrInvalidValue")
	}
}

// ---- on a GPU ----

func TestCuInfo(t *testing.T) {
	d := gputest.Device(t)
	in := d.Info()
	t.Logf("device: %+v", in)
	if in.Name == "" || in.SMCount <= 0 || in.TotalMemBytes <= 0 || in.CCMajor <= 0 || in.DriverVersion < 12000 {
		t.Errorf("implausible Info: %+v", in)
	}
	if in.Simulated {
		t.Errorf("Open returned a simulated device")
	}
	free, total, err := d.MemGetInfo()
	cuMust(t, "MemGetInfo", err)
	if free <= 0 || free > total || total != in.TotalMemBytes {
		t.Errorf("MemGetInfo = %d free of %d, Info total %d", free, total, in.TotalMemBytes)
	}
}

// cuRoundTrip copies host -> device -> host for each size at unaligned
// offsets and compares byte for byte, and checks the bytes around the
// destination window were left alone.
func cuRoundTrip(t *testing.T, d Device, src, dst []byte, dev DevicePtr) {
	s, err := d.NewStream(0)
	cuMust(t, "NewStream", err)
	defer s.Destroy()
	r := rand.New(rand.NewPCG(1, 2))
	sizes := []int{1, 2, 3, 7, 15, 4095, 4096, 4097, 65537, 1<<20 + 13, 16<<20 + 5, 256 << 20}
	for i, n := range sizes {
		so, do, ho := 1+i%7, 3+i%5, 5+i%3
		cuRandom(r, src[so:so+n])
		for j := range dst[:ho+n+8] {
			dst[j] = 0xA5
		}
		cuMust(t, "CopyHtoD", s.CopyHtoD(dev+DevicePtr(do), src[so:so+n]))
		cuMust(t, "CopyDtoH", s.CopyDtoH(dst[ho:ho+n], dev+DevicePtr(do)))
		cuMust(t, "Synchronize", s.Synchronize())
		if !bytes.Equal(dst[ho:ho+n], src[so:so+n]) {
			t.Fatalf("size %d (src+%d dev+%d dst+%d): data differs", n, so, do, ho)
		}
		for j := 0; j < ho; j++ {
			if dst[j] != 0xA5 {
				t.Fatalf("size %d: byte %d before the window changed", n, j)
			}
		}
		for j := ho + n; j < ho+n+8; j++ {
			if dst[j] != 0xA5 {
				t.Fatalf("size %d: byte %d after the window changed", n, j)
			}
		}
	}
}

func TestCuRoundTripPinned(t *testing.T) {
	d := gputest.Device(t)
	const n = 256<<20 + 64
	dev, err := d.Alloc(n)
	cuMust(t, "Alloc", err)
	defer d.Free(dev)
	src := gputest.HostAlloc(t, d, n)
	dst := gputest.HostAlloc(t, d, n)
	cuRoundTrip(t, d, src, dst, dev)
}

func TestCuRoundTripPageable(t *testing.T) {
	d := gputest.Device(t)
	const n = 256<<20 + 64
	dev, err := d.Alloc(n)
	cuMust(t, "Alloc", err)
	defer d.Free(dev)
	cuRoundTrip(t, d, make([]byte, n), make([]byte, n), dev)
}

func cuBatch(t *testing.T, d Device, src, dst []byte) {
	const count = 10000
	r := rand.New(rand.NewPCG(3, 4))
	ops := make([]Copy, count)
	back := make([]Copy, count)
	type span struct{ off, n int }
	spans := make([]span, count)
	off := 0
	for i := range spans {
		n := 1 + r.IntN(4096)
		off += r.IntN(64) // gaps, and unaligned starts
		spans[i] = span{off, n}
		off += n
	}
	if off > len(src) {
		t.Fatalf("test layout needs %d bytes", off)
	}
	dev, err := d.Alloc(int64(off))
	cuMust(t, "Alloc", err)
	defer d.Free(dev)
	cuRandom(r, src[:off])
	clear(dst[:off])
	for i, sp := range spans {
		ops[i] = Copy{Dst: uint64(dev) + uint64(sp.off), Src: HostAddr(src[sp.off:]), Bytes: int64(sp.n)}
		back[i] = Copy{Dst: HostAddr(dst[sp.off:]), Src: uint64(dev) + uint64(sp.off), Bytes: int64(sp.n)}
	}
	s, err := d.NewStream(0)
	cuMust(t, "NewStream", err)
	defer s.Destroy()
	cuMust(t, "CopyBatch HtoD", s.CopyBatch(HostToDevice, ops))
	cuMust(t, "CopyBatch DtoH", s.CopyBatch(DeviceToHost, back))
	cuMust(t, "Synchronize", s.Synchronize())
	for i, sp := range spans {
		if !bytes.Equal(dst[sp.off:sp.off+sp.n], src[sp.off:sp.off+sp.n]) {
			t.Fatalf("descriptor %d (%d bytes at %d): data differs", i, sp.n, sp.off)
		}
		gapEnd := off
		if i+1 < len(spans) {
			gapEnd = spans[i+1].off
		}
		for j := sp.off + sp.n; j < gapEnd; j++ {
			if dst[j] != 0 {
				t.Fatalf("byte %d in the gap after descriptor %d was written", j, i)
			}
		}
	}
}

func TestCuBatch10000(t *testing.T) {
	d := gputest.Device(t)
	t.Logf("BatchCopy (cuMemcpyBatchAsync) = %v, driver %d", d.Info().BatchCopy, d.Info().DriverVersion)
	const n = 64 << 20
	src := gputest.HostAlloc(t, d, n)
	dst := gputest.HostAlloc(t, d, n)
	t.Run("pinned", func(t *testing.T) { cuBatch(t, d, src, dst) })
	t.Run("pageable", func(t *testing.T) { cuBatch(t, d, make([]byte, n), make([]byte, n)) })
}

func TestCuBatchZeroAndBadInput(t *testing.T) {
	d := gputest.Device(t)
	s, err := d.NewStream(0)
	cuMust(t, "NewStream", err)
	defer s.Destroy()
	cuMust(t, "empty batch", s.CopyBatch(HostToDevice, nil))
	if err := s.CopyBatch(NumCopyKinds, []Copy{{Bytes: 1}}); !errors.Is(err, ErrInvalidValue) {
		t.Errorf("bad kind: %v", err)
	}
	if err := s.CopyBatch(DeviceToDevice, []Copy{{Bytes: 4}, {Bytes: -1}}); !errors.Is(err, ErrInvalidValue) || !strings.Contains(err.Error(), "descriptor 1") {
		t.Errorf("negative size: %v", err)
	}
	// Zero-sized descriptors are no-ops, even with addresses that are not valid.
	cuMust(t, "zero-sized batch", s.CopyBatch(DeviceToDevice, []Copy{{Dst: 1, Src: 2}, {Dst: 3, Src: 4}}))
	cuMust(t, "Synchronize", s.Synchronize())
}

func TestCuStreamsOrderedByEvent(t *testing.T) {
	d := gputest.Device(t)
	const n = 256 << 20
	src := gputest.HostAlloc(t, d, n)
	out := gputest.HostAlloc(t, d, n)
	a, err := d.Alloc(n)
	cuMust(t, "Alloc", err)
	defer d.Free(a)
	b, err := d.Alloc(n)
	cuMust(t, "Alloc", err)
	defer d.Free(b)
	sa, err := d.NewStream(0)
	cuMust(t, "NewStream", err)
	defer sa.Destroy()
	sb, err := d.NewStream(-100) // clamped to the highest priority
	cuMust(t, "NewStream", err)
	defer sb.Destroy()
	ev, err := d.NewEvent(EventOptions{})
	cuMust(t, "NewEvent", err)
	defer ev.Destroy()
	if ok, err := ev.Query(); !ok || err != nil {
		t.Errorf("never-recorded event: Query = %v, %v; want true, nil", ok, err)
	}

	r := rand.New(rand.NewPCG(5, 6))
	for round := range 3 {
		cuRandom(r, src)
		cuMust(t, "CopyHtoD", sa.CopyHtoD(a, src)) // long: ~5 ms at 50 GiB/s
		cuMust(t, "Record", ev.Record(sa))
		cuMust(t, "WaitEvent", sb.WaitEvent(ev))
		cuMust(t, "CopyDtoD", sb.CopyDtoD(b, a, n))
		cuMust(t, "CopyDtoH", sb.CopyDtoH(out, b))
		cuMust(t, "Synchronize", sb.Synchronize())
		if ok, err := ev.Query(); !ok || err != nil {
			t.Fatalf("event after the waiting stream finished: Query = %v, %v", ok, err)
		}
		if ok, err := sa.Query(); !ok || err != nil {
			t.Fatalf("stream A after the waiting stream finished: Query = %v, %v", ok, err)
		}
		if !bytes.Equal(out, src) {
			t.Fatalf("round %d: stream B did not see stream A's copy", round)
		}
	}
}

func TestCuElapsed(t *testing.T) {
	d := gputest.Device(t)
	s, err := d.NewStream(0)
	cuMust(t, "NewStream", err)
	defer s.Destroy()
	const n = 64 << 20
	host := gputest.HostAlloc(t, d, n)
	dev, err := d.Alloc(n)
	cuMust(t, "Alloc", err)
	defer d.Free(dev)

	start, err := d.NewEvent(EventOptions{Timing: true})
	cuMust(t, "NewEvent", err)
	defer start.Destroy()
	end, err := d.NewEvent(EventOptions{Timing: true, BlockingSync: true})
	cuMust(t, "NewEvent", err)
	defer end.Destroy()
	plain, err := d.NewEvent(EventOptions{})
	cuMust(t, "NewEvent", err)
	defer plain.Destroy()

	cuMust(t, "Record", start.Record(s))
	cuMust(t, "CopyHtoD", s.CopyHtoD(dev, host))
	cuMust(t, "Record", end.Record(s))
	cuMust(t, "Record", plain.Record(s))
	cuMust(t, "Synchronize", end.Synchronize())
	el, err := end.Elapsed(start)
	cuMust(t, "Elapsed", err)
	if el <= 0 {
		t.Errorf("Elapsed = %v for a 64 MiB copy", el)
	}
	t.Logf("64 MiB HtoD: %v (%.1f GiB/s)", el, float64(n)/(1<<30)/el.Seconds())
	if _, err := plain.Elapsed(start); !errors.Is(err, ErrInvalidValue) {
		t.Errorf("Elapsed on an event without timing = %v, want ErrInvalidValue", err)
	}
	if _, err := end.Elapsed(plain); !errors.Is(err, ErrInvalidValue) {
		t.Errorf("Elapsed from an event without timing = %v, want ErrInvalidValue", err)
	}
}

func TestCuRegisterMmap(t *testing.T) {
	d := gputest.Device(t)
	const n = 64<<20 + 4096
	m, err := unix.Mmap(-1, 0, n, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_PRIVATE|unix.MAP_ANONYMOUS)
	cuMust(t, "mmap", err)
	defer unix.Munmap(m)
	cuRandom(rand.New(rand.NewPCG(7, 8)), m)
	if err := d.HostUnregister(m); !errors.Is(err, ErrNotRegistered) {
		t.Errorf("unregister of memory never registered = %v, want ErrNotRegistered", err)
	}
	cuMust(t, "HostRegister", d.HostRegister(m))
	if err := d.HostRegister(m); !errors.Is(err, ErrAlreadyRegistered) {
		t.Errorf("second register = %v, want ErrAlreadyRegistered", err)
	}
	dev, err := d.Alloc(n)
	cuMust(t, "Alloc", err)
	defer d.Free(dev)
	s, err := d.NewStream(0)
	cuMust(t, "NewStream", err)
	defer s.Destroy()
	want := bytes.Clone(m)
	cuMust(t, "CopyHtoD", s.CopyHtoD(dev, m))
	cuMust(t, "Synchronize", s.Synchronize())
	clear(m)
	cuMust(t, "CopyDtoH", s.CopyDtoH(m[1:], dev+1))
	cuMust(t, "Synchronize", s.Synchronize())
	if m[0] != 0 || !bytes.Equal(m[1:], want[1:]) {
		t.Fatalf("copy through registered mmap memory differs")
	}
	cuMust(t, "HostUnregister", d.HostUnregister(m))
}

func TestCuRegisterTooLarge(t *testing.T) {
	d := gputest.Device(t)
	// Address space only: PROT_NONE and NORESERVE, never touched.
	m, err := unix.Mmap(-1, 0, 512<<30, unix.PROT_NONE, unix.MAP_PRIVATE|unix.MAP_ANONYMOUS|unix.MAP_NORESERVE)
	if err != nil {
		t.Skipf("cannot reserve 512 GiB of address space: %v", err)
	}
	defer unix.Munmap(m)
	err = d.HostRegister(m)
	if !errors.Is(err, ErrInvalidValue) || !strings.Contains(err.Error(), "512 GiB") {
		t.Fatalf("HostRegister(512 GiB) = %v, want our ErrInvalidValue naming the limit", err)
	}
	var de *Error
	if errors.As(err, &de) {
		t.Fatalf("HostRegister(512 GiB) reached the driver: %v", err)
	}
}

func TestCuHostAllocVMM(t *testing.T) {
	d := gputest.Device(t)
	if !d.Info().HostNUMAAlloc {
		t.Skip("the driver refused cuMemCreate with a HOST_NUMA location at Open")
	}
	const n = 3<<20 + 1 // not a multiple of the granularity
	v, err := d.HostAllocVMM(n, -1)
	cuMust(t, "HostAllocVMM", err)
	b := v.Bytes()
	if len(b) != n {
		t.Fatalf("len(Bytes()) = %d, want %d", len(b), n)
	}
	cuRandom(rand.New(rand.NewPCG(9, 10)), b) // the CPU writes it
	want := bytes.Clone(b)
	dev, err := d.Alloc(n)
	cuMust(t, "Alloc", err)
	defer d.Free(dev)
	s, err := d.NewStream(0)
	cuMust(t, "NewStream", err)
	defer s.Destroy()
	out := make([]byte, n)
	cuMust(t, "CopyHtoD", s.CopyHtoD(dev, b))
	cuMust(t, "CopyDtoH", s.CopyDtoH(out, dev))
	cuMust(t, "Synchronize", s.Synchronize())
	if !bytes.Equal(out, want) {
		t.Fatal("VMM host memory -> device -> host differs")
	}
	clear(b)
	cuMust(t, "CopyDtoH into VMM", s.CopyDtoH(b, dev))
	cuMust(t, "Synchronize", s.Synchronize())
	if !bytes.Equal(b, want) { // the CPU reads it
		t.Fatal("device -> VMM host memory differs")
	}
	cuMust(t, "Close", v.Close())
	if err := v.Close(); !errors.Is(err, ErrInvalidValue) {
		t.Errorf("second Close = %v, want ErrInvalidValue", err)
	}
}

func TestCuBadInput(t *testing.T) {
	d := gputest.Device(t)
	if _, err := d.Alloc(0); !errors.Is(err, ErrInvalidValue) {
		t.Errorf("Alloc(0) = %v", err)
	}
	if _, err := d.HostAlloc(-1); !errors.Is(err, ErrInvalidValue) {
		t.Errorf("HostAlloc(-1) = %v", err)
	}
	if err := d.HostRegister(nil); !errors.Is(err, ErrInvalidValue) {
		t.Errorf("HostRegister(nil) = %v", err)
	}
	s, err := d.NewStream(0)
	cuMust(t, "NewStream", err)
	e, err := d.NewEvent(EventOptions{})
	cuMust(t, "NewEvent", err)
	cuMust(t, "Destroy", s.Destroy())
	if err := s.Destroy(); !errors.Is(err, ErrInvalidValue) {
		t.Errorf("second Destroy = %v", err)
	}
	if err := s.CopyHtoD(0, make([]byte, 8)); !errors.Is(err, ErrInvalidValue) {
		t.Errorf("copy on a destroyed stream = %v", err)
	}
	if err := e.Record(s); !errors.Is(err, ErrInvalidValue) {
		t.Errorf("record on a destroyed stream = %v", err)
	}
	cuMust(t, "Event.Destroy", e.Destroy())
	if _, err := e.Query(); !errors.Is(err, ErrInvalidValue) {
		t.Errorf("query of a destroyed event = %v", err)
	}
}

// The tests below pass invalid addresses to the driver. They come last: a
// driver that faulted asynchronously would poison the shared primary context.

func TestCuBatchBadPointer(t *testing.T) {
	d := gputest.Device(t)
	s, err := d.NewStream(0)
	cuMust(t, "NewStream", err)
	defer s.Destroy()
	const n = 16 << 12
	dev, err := d.Alloc(n)
	cuMust(t, "Alloc", err)
	defer d.Free(dev)
	host := bytes.Repeat([]byte{0xAA}, n)
	ops := make([]Copy, 16)
	for i := range ops {
		ops[i] = Copy{Dst: HostAddr(host[i*4096:]), Src: uint64(dev) + uint64(i*4096), Bytes: 4096}
	}
	ops[5].Src = 0xdead_0000_0000
	err = s.CopyBatch(DeviceToHost, ops)
	t.Logf("batch with an invalid device pointer: %v", err)
	if !errors.Is(err, ErrInvalidValue) || !strings.Contains(err.Error(), "descriptor 5 ") {
		t.Fatalf("batch with an invalid device pointer at 5 = %v, want ErrInvalidValue naming descriptor 5", err)
	}
	ops[5].Src = uint64(dev) + n - 100 // runs 3996 bytes past the end
	err = s.CopyBatch(DeviceToHost, ops)
	t.Logf("batch with a descriptor past the end: %v", err)
	if !errors.Is(err, ErrInvalidValue) || !strings.Contains(err.Error(), "descriptor 5 ") {
		t.Fatalf("batch running past the end at 5 = %v, want ErrInvalidValue naming descriptor 5", err)
	}
	cuMust(t, "Synchronize", s.Synchronize())
	if !bytes.Equal(host, bytes.Repeat([]byte{0xAA}, n)) {
		t.Fatal("a refused batch still copied some of its descriptors")
	}
}

func TestCuInvalidPointer(t *testing.T) {
	d := gputest.Device(t)
	s, err := d.NewStream(0)
	cuMust(t, "NewStream", err)
	defer s.Destroy()
	buf := make([]byte, 4096)
	bad := DevicePtr(0xdead_0000_0000)
	for _, c := range []struct {
		what string
		err  error
	}{
		{"DtoH from an invalid pointer", s.CopyDtoH(buf, bad)},
		{"HtoD to an invalid pointer", s.CopyHtoD(bad, buf)},
		{"DtoD from an invalid pointer", s.CopyDtoD(bad, bad, 4096)},
	} {
		t.Logf("%s: %v", c.what, c.err)
		if !errors.Is(c.err, ErrInvalidValue) {
			t.Errorf("%s = %v, want ErrInvalidValue", c.what, c.err)
		}
	}
	dev, err := d.Alloc(4096)
	cuMust(t, "Alloc", err)
	if err := s.CopyHtoD(dev+1, buf); !errors.Is(err, ErrInvalidValue) || !strings.Contains(err.Error(), "past the end") {
		t.Errorf("copy running one byte past the allocation = %v, want ErrInvalidValue", err)
	}
	cuMust(t, "CopyHtoD", s.CopyHtoD(dev, buf))
	cuMust(t, "Synchronize", s.Synchronize())
	cuMust(t, "Free", d.Free(dev))
	if err := s.CopyHtoD(dev, buf); !errors.Is(err, ErrInvalidValue) {
		t.Errorf("copy into freed device memory = %v, want ErrInvalidValue", err)
	}
	cuMust(t, "Synchronize", s.Synchronize())
}

// ---- the copy kernel ----

func cuKernelCopier(t *testing.T, s Stream) KernelCopier {
	t.Helper()
	kc, ok := s.(KernelCopier)
	if !ok {
		t.Fatalf("%T does not implement KernelCopier", s)
	}
	return kc
}

// cuKernelRoundTrip scatters count random-sized pieces (with unaligned
// starts, sizes and gaps) from src into device memory with the copy kernel,
// back into dst, and device to device, and compares byte for byte.
func cuKernelRoundTrip(t *testing.T, d Device, src, dst []byte, count, maxPiece int, opts KernelCopyOptions) {
	r := rand.New(rand.NewPCG(uint64(count), uint64(maxPiece)))
	type span struct{ hoff, doff, n int }
	spans := make([]span, count)
	hoff := 0
	for i := range spans {
		n := 1 + r.IntN(maxPiece)
		if r.IntN(4) != 0 {
			n = (n + 15) &^ 15 // most pieces aligned, as KV blocks are
		}
		if r.IntN(4) == 0 {
			hoff += 1 + r.IntN(15) // unaligned start
		}
		spans[i] = span{hoff: hoff, n: n}
		hoff += n + r.IntN(64)
	}
	if hoff > len(src) {
		t.Fatalf("test layout needs %d host bytes, have %d", hoff, len(src))
	}
	// Scatter on the device in a random order.
	perm := r.Perm(count)
	doff := 0
	for _, i := range perm {
		if r.IntN(3) != 0 {
			doff = (doff + 15) &^ 15
		}
		spans[i].doff = doff
		doff += spans[i].n + r.IntN(32)
	}
	dev, err := d.Alloc(int64(2 * doff))
	cuMust(t, "Alloc", err)
	defer d.Free(dev)
	cuRandom(r, src[:hoff])
	for i := range dst[:hoff] {
		dst[i] = 0x5A
	}
	up := make([]Copy, count)
	dd := make([]Copy, count)
	down := make([]Copy, count)
	for i, sp := range spans {
		up[i] = Copy{Dst: uint64(dev) + uint64(sp.doff), Src: HostAddr(src[sp.hoff:]), Bytes: int64(sp.n)}
		dd[i] = Copy{Dst: uint64(dev) + uint64(doff+sp.doff), Src: uint64(dev) + uint64(sp.doff), Bytes: int64(sp.n)}
		down[i] = Copy{Dst: HostAddr(dst[sp.hoff:]), Src: uint64(dev) + uint64(doff+sp.doff), Bytes: int64(sp.n)}
	}
	s, err := d.NewStream(0)
	cuMust(t, "NewStream", err)
	defer s.Destroy()
	kc := cuKernelCopier(t, s)
	cuMust(t, "SetKernelCopyOptions", kc.SetKernelCopyOptions(opts))
	cuMust(t, "CopyKernel HtoD", kc.CopyKernel(HostToDevice, up))
	cuMust(t, "CopyKernel DtoD", kc.CopyKernel(DeviceToDevice, dd))
	cuMust(t, "CopyKernel DtoH", kc.CopyKernel(DeviceToHost, down))
	cuMust(t, "Synchronize", s.Synchronize())
	for i, sp := range spans {
		if !bytes.Equal(dst[sp.hoff:sp.hoff+sp.n], src[sp.hoff:sp.hoff+sp.n]) {
			t.Fatalf("piece %d (%d bytes, host+%d, device+%d): data differs", i, sp.n, sp.hoff, sp.doff)
		}
		end := hoff
		if i+1 < len(spans) {
			end = spans[i+1].hoff
		}
		for j := sp.hoff + sp.n; j < end; j++ {
			if dst[j] != 0x5A {
				t.Fatalf("byte %d in the gap after piece %d was written", j, i)
			}
		}
	}
}

func TestCuCopyKernel(t *testing.T) {
	d := gputest.Device(t)
	const n = 160 << 20
	src := gputest.HostAlloc(t, d, n)
	// The destination is registered mmap memory: the other kind of pinned
	// memory the engine uses.
	dst := gputest.HostRegistered(t, d, n)
	for _, c := range []struct {
		name          string
		count, maxLen int
		opts          KernelCopyOptions
	}{
		{"16KiB-ish x5000 default", 5000, 16 << 10, KernelCopyOptions{}},
		{"small x20000 ring wraps", 20000, 2048, KernelCopyOptions{CTAs: 7, ThreadsPerCTA: 96}},
		{"2MiB-ish x40 pieces split", 40, 2 << 20, KernelCopyOptions{PieceBytes: 4096 + 16}},
		{"one byte x3", 3, 1, KernelCopyOptions{CTAs: 1, ThreadsPerCTA: 32}},
		{"descriptors read over the link, small ring wraps", 20000, 2048, KernelCopyOptions{MappedDescriptors: true, Launches: 3, PiecesPerLaunch: 1000}},
	} {
		t.Run(c.name, func(t *testing.T) { cuKernelRoundTrip(t, d, src, dst, c.count, c.maxLen, c.opts) })
	}
}

func TestCuCopyKernelBadInput(t *testing.T) {
	d := gputest.Device(t)
	s, err := d.NewStream(0)
	cuMust(t, "NewStream", err)
	defer s.Destroy()
	kc := cuKernelCopier(t, s)
	const n = 16 << 12
	dev, err := d.Alloc(n)
	cuMust(t, "Alloc", err)
	defer d.Free(dev)
	pinned := gputest.HostAlloc(t, d, n)
	for i := range pinned {
		pinned[i] = 0xAA
	}
	ops := make([]Copy, 16)
	reset := func() {
		for i := range ops {
			ops[i] = Copy{Dst: HostAddr(pinned[i*4096:]), Src: uint64(dev) + uint64(i*4096), Bytes: 4096}
		}
	}
	pageable := make([]byte, 4096)
	for _, c := range []struct {
		what string
		bad  func()
		want error
	}{
		{"an invalid device pointer", func() { ops[5].Src = 0xdead_0000_0000 }, ErrInvalidValue},
		{"a device range past the end", func() { ops[5].Src = uint64(dev) + n - 100 }, ErrInvalidValue},
		{"pageable host memory", func() { ops[5].Dst = HostAddr(pageable) }, ErrNotRegistered},
		{"a host range past the pinned allocation", func() { ops[5].Dst = HostAddr(pinned[n-100:]) }, ErrInvalidValue},
		{"a negative size", func() { ops[5].Bytes = -1 }, ErrInvalidValue},
	} {
		reset()
		c.bad()
		err := kc.CopyKernel(DeviceToHost, ops)
		t.Logf("%s: %v", c.what, err)
		if !errors.Is(err, c.want) || !strings.Contains(err.Error(), "descriptor 5 ") {
			t.Errorf("CopyKernel with %s at 5 = %v, want %v naming descriptor 5", c.what, err, c.want)
		}
	}
	if err := kc.CopyKernel(NumCopyKinds, ops); !errors.Is(err, ErrInvalidValue) {
		t.Errorf("CopyKernel of an unknown kind = %v, want ErrInvalidValue", err)
	}
	cuMust(t, "Synchronize", s.Synchronize())
	if !bytes.Equal(pinned, bytes.Repeat([]byte{0xAA}, n)) {
		t.Fatal("a refused kernel copy still copied some of its descriptors")
	}
	for _, o := range []KernelCopyOptions{{CTAs: -1}, {ThreadsPerCTA: 33}, {ThreadsPerCTA: 2048}, {PieceBytes: 100}, {PieceBytes: 4097},
		{Launches: -1}, {Launches: 1025}, {PiecesPerLaunch: 63}, {PiecesPerLaunch: 1<<16 + 1}} {
		if err := kc.SetKernelCopyOptions(o); !errors.Is(err, ErrInvalidValue) {
			t.Errorf("SetKernelCopyOptions(%+v) = %v, want ErrInvalidValue", o, err)
		}
	}
	// The stream still works after every refusal.
	reset()
	cuMust(t, "CopyKernel", kc.CopyKernel(DeviceToHost, ops))
	cuMust(t, "Synchronize", s.Synchronize())
	// Its descriptor ring now exists, and its shape is fixed.
	if err := kc.SetKernelCopyOptions(KernelCopyOptions{Launches: 8}); !errors.Is(err, ErrInvalidValue) {
		t.Errorf("SetKernelCopyOptions(Launches: 8) after the ring was built = %v, want ErrInvalidValue", err)
	}
	cuMust(t, "SetKernelCopyOptions", kc.SetKernelCopyOptions(KernelCopyOptions{CTAs: 3}))
}

// TestCuCopyMethodsPerf measures, for 16 KiB and 64 KiB blocks scattered on
// the device and contiguous on the host, each way of issuing them: a loop of
// single copies, cuMemcpyBatchAsync with its attribute variants and without
// the per-descriptor range check, and the copy kernel over a grid of CTA
// and thread counts. It logs a table (run with -test.v); it fails only if
// a method fails.
func TestCuCopyMethodsPerf(t *testing.T) {
	d := gputest.Device(t)
	if os.Getenv("KVTIER_GPU_PERF") != "1" {
		t.Skip("set KVTIER_GPU_PERF=1 to measure")
	}
	const total = 256 << 20
	host := gputest.HostAlloc(t, d, total)
	dev, err := d.Alloc(4 * total)
	cuMust(t, "Alloc", err)
	defer d.Free(dev)
	s, err := d.NewStream(0)
	cuMust(t, "NewStream", err)
	defer s.Destroy()
	kc := cuKernelCopier(t, s)
	defer SetBatchTuning(d, 0, 0, true, true)
	for _, bs := range []int{16 << 10, 64 << 10} {
		n := total / bs
		perm := rand.New(rand.NewPCG(1, uint64(bs))).Perm(4 * n)[:n]
		up := make([]Copy, n)
		down := make([]Copy, n)
		for i, b := range perm {
			up[i] = Copy{Dst: uint64(dev) + uint64(b*bs), Src: HostAddr(host[i*bs:]), Bytes: int64(bs)}
			down[i] = Copy{Dst: up[i].Src, Src: up[i].Dst, Bytes: int64(bs)}
		}
		type method struct {
			name string
			run  func(kind CopyKind, ops []Copy) error
		}
		batch := func(order int, flags uint, hints, check bool) func(CopyKind, []Copy) error {
			return func(kind CopyKind, ops []Copy) error {
				SetBatchTuning(d, order, flags, hints, check)
				return s.CopyBatch(kind, ops)
			}
		}
		methods := []method{
			{"loop of single copies", func(kind CopyKind, ops []Copy) error {
				SetBatchTuning(d, 0, 0, true, true)
				for i := range ops {
					if err := s.CopyBatch(kind, ops[i:i+1]); err != nil {
						return err
					}
				}
				return nil
			}},
			{"batch STREAM hints check", batch(1, 0, true, true)},
			{"batch STREAM hints nocheck", batch(1, 0, true, false)},
			{"batch STREAM nohints check", batch(1, 0, false, true)},
			{"batch ANY hints check", batch(3, 0, true, true)},
			{"batch STREAM overlap-flag", batch(1, 1, true, true)},
		}
		for _, ctas := range []int{8, 16, 32, 64, 132, 264} {
			for _, th := range []int{256, 512, 1024} {
				o := KernelCopyOptions{CTAs: ctas, ThreadsPerCTA: th}
				methods = append(methods, method{fmt.Sprintf("kernel ctas=%d threads=%d", ctas, th), func(kind CopyKind, ops []Copy) error {
					if err := kc.SetKernelCopyOptions(o); err != nil {
						return err
					}
					return kc.CopyKernel(kind, ops)
				}})
			}
		}
		for _, m := range methods {
			for _, kind := range []CopyKind{HostToDevice, DeviceToHost} {
				ops := up
				if kind == DeviceToHost {
					ops = down
				}
				var gibs, issue []float64
				for r := 0; r < 4; r++ {
					start := time.Now()
					if err := m.run(kind, ops); err != nil {
						t.Fatalf("%s %s: %v", m.name, kind, err)
					}
					issued := time.Since(start)
					cuMust(t, "Synchronize", s.Synchronize())
					el := time.Since(start)
					if r > 0 {
						gibs = append(gibs, float64(total)/el.Seconds()/(1<<30))
						issue = append(issue, float64(issued.Microseconds()))
					}
				}
				slices.Sort(gibs)
				slices.Sort(issue)
				t.Logf("PERF bs=%dKiB %s %-36s %7.2f GiB/s (min %.2f max %.2f), issue %8.0f us for %d descriptors",
					bs>>10, kind, m.name, gibs[1], gibs[0], gibs[2], issue[1], n)
			}
		}
	}
	// Data check of the kernel after all that: one more round trip.
	cuMust(t, "SetKernelCopyOptions", kc.SetKernelCopyOptions(KernelCopyOptions{}))
}

// TestCuCopy2D: a strided copy on the GPU moves its rows both ways, leaves
// the gaps between host rows alone, and is refused, enqueuing nothing,
// when its device side runs past the allocation or its pitch is short.
func TestCuCopy2D(t *testing.T) {
	d := gputest.Device(t)
	s, err := d.NewStream(0)
	cuMust(t, "NewStream", err)
	defer s.Destroy()
	c2 := s.(Copier2D)
	const rows, width, pitch = 256, 64 << 10, 2 << 20
	dev, err := d.Alloc(rows * width)
	cuMust(t, "Alloc", err)
	defer d.Free(dev)
	host := gputest.HostAlloc(t, d, rows*pitch)
	back := gputest.HostAlloc(t, d, rows*pitch)
	rng := rand.New(rand.NewPCG(7, 7))
	for i := range host {
		host[i] = byte(rng.Uint32())
	}
	clear(back)
	cuMust(t, "Copy2D HtoD", c2.Copy2D(HostToDevice, Copy2D{Dst: uint64(dev), Src: HostAddr(host), DstPitch: width, SrcPitch: pitch, Width: width, Height: rows}))
	cuMust(t, "Copy2D DtoH", c2.Copy2D(DeviceToHost, Copy2D{Dst: HostAddr(back), Src: uint64(dev), DstPitch: pitch, SrcPitch: width, Width: width, Height: rows}))
	cuMust(t, "Synchronize", s.Synchronize())
	gap := make([]byte, pitch-width)
	for i := range rows {
		if !bytes.Equal(host[i*pitch:i*pitch+width], back[i*pitch:i*pitch+width]) {
			t.Fatalf("row %d differs after a strided round trip", i)
		}
		if !bytes.Equal(back[i*pitch+width:(i+1)*pitch], gap) {
			t.Fatalf("the gap after row %d was written", i)
		}
	}
	for _, c := range []Copy2D{
		{Dst: uint64(dev), Src: HostAddr(host), DstPitch: width, SrcPitch: pitch, Width: width, Height: rows + 1},
		{Dst: uint64(dev), Src: HostAddr(host), DstPitch: width - 1, SrcPitch: pitch, Width: width, Height: 2},
	} {
		if err := c2.Copy2D(HostToDevice, c); err == nil {
			t.Errorf("Copy2D(%+v) was accepted", c)
		}
	}
	if err := c2.Copy2D(NumCopyKinds, Copy2D{Width: 1, Height: 1}); !errors.Is(err, ErrInvalidValue) {
		t.Errorf("Copy2D of an unknown kind = %v, want ErrInvalidValue", err)
	}
	cuMust(t, "Synchronize", s.Synchronize())
}

// TestCuIssueCosts logs what each call the gather path makes per chunk
// costs the submitting thread (run with -test.v): a 16 MiB copy as a batch
// of one descriptor and as a single copy, a copy-kernel launch of 1,024
// device-to-device pieces with its descriptors copied or read over the
// link, an event record and a stream wait. The device stays busy behind a
// long FMA kernel, so that nothing waits for completion. It fails only if
// a call fails.
func TestCuIssueCosts(t *testing.T) {
	d := gputest.Device(t)
	ft := newCuFMATimer(t, d)
	defer ft.close()
	s, err := d.NewStream(0)
	cuMust(t, "NewStream", err)
	defer s.Destroy()
	gate, err := d.NewEvent(EventOptions{})
	cuMust(t, "NewEvent", err)
	defer gate.Destroy()
	const chunk, pieces = 16 << 20, 1024
	host := gputest.HostAlloc(t, d, chunk)
	dev, err := d.Alloc(4 * chunk)
	cuMust(t, "Alloc", err)
	defer d.Free(dev)
	kc := s.(KernelCopier)
	ops := make([]Copy, pieces)
	for i := range ops {
		ops[i] = Copy{Dst: uint64(dev) + uint64(chunk) + uint64(i*(chunk/pieces)), Src: uint64(dev) + uint64(i*(chunk/pieces)), Bytes: chunk / pieces}
	}
	const n = 32
	for _, mapped := range []bool{false, true} {
		cuMust(t, "SetKernelCopyOptions", kc.SetKernelCopyOptions(KernelCopyOptions{Launches: 128, PiecesPerLaunch: 2048, MappedDescriptors: mapped}))
		cuMust(t, "LaunchFMA", ft.launch(4, 1<<22))
		cuMust(t, "Record", gate.Record(ft.s))
		cuMust(t, "WaitEvent", s.WaitEvent(gate))
		for _, c := range []struct {
			name string
			call func() error
		}{
			{"CopyBatch of one 16 MiB descriptor", func() error {
				return s.CopyBatch(HostToDevice, []Copy{{Dst: uint64(dev), Src: HostAddr(host), Bytes: chunk}})
			}},
			{"CopyHtoD of 16 MiB", func() error { return s.CopyHtoD(dev, host) }},
			{fmt.Sprintf("CopyKernel of %d pieces (descriptors read over the link: %v)", pieces, mapped), func() error { return kc.CopyKernel(DeviceToDevice, ops) }},
			{"Event.Record", func() error { return gate.Record(s) }},
			{"Stream.WaitEvent", func() error { return s.WaitEvent(gate) }},
		} {
			start := time.Now()
			for range n {
				cuMust(t, c.name, c.call())
			}
			t.Logf("PERF issue %-70s %7.1f us per call", c.name, time.Since(start).Seconds()*1e6/n)
		}
		cuMust(t, "Synchronize", s.Synchronize())
	}
}

// TestCuKernelLaunchesQueue: copy-kernel launches that wait on the device
// for other work (a long FMA kernel on another stream) do not block the
// host while the stream's descriptor ring has free slots. With 64 slots,
// 32 launches queue at once; with the default 4, the fifth waits on the
// host for the FMA kernel. The bytes of every queued launch land.
func TestCuKernelLaunchesQueue(t *testing.T) {
	d := gputest.Device(t)
	ft := newCuFMATimer(t, d)
	defer ft.close()
	gate, err := d.NewEvent(EventOptions{})
	cuMust(t, "NewEvent", err)
	defer gate.Destroy()
	const n, piece = 32, 64 << 10
	src, err := d.Alloc(n * piece)
	cuMust(t, "Alloc", err)
	defer d.Free(src)
	dst, err := d.Alloc(n * piece)
	cuMust(t, "Alloc", err)
	defer d.Free(dst)
	want := bytes.Repeat([]byte{0x5A}, n*piece)
	for _, launches := range []int{64, 0} {
		s, err := d.NewStream(0)
		cuMust(t, "NewStream", err)
		kc := s.(KernelCopier)
		cuMust(t, "SetKernelCopyOptions", kc.SetKernelCopyOptions(KernelCopyOptions{Launches: launches, PiecesPerLaunch: 64}))
		fill, err := d.NewStream(0)
		cuMust(t, "NewStream", err)
		cuMust(t, "CopyHtoD", fill.CopyHtoD(src, want))
		cuMust(t, "Synchronize", fill.Synchronize())
		fill.Destroy()
		// The FMA kernel runs for about 100 ms; the copies wait for it.
		cuMust(t, "LaunchFMA", ft.launch(4, 1<<22))
		cuMust(t, "Record", gate.Record(ft.s))
		cuMust(t, "WaitEvent", s.WaitEvent(gate))
		start := time.Now()
		for i := range n {
			op := []Copy{{Dst: uint64(dst) + uint64(i*piece), Src: uint64(src) + uint64(i*piece), Bytes: piece}}
			cuMust(t, "CopyKernel", kc.CopyKernel(DeviceToDevice, op))
		}
		issue := time.Since(start)
		fma := ft.elapsed(t)
		cuMust(t, "Synchronize", s.Synchronize())
		got := make([]byte, n*piece)
		cuMust(t, "CopyDtoH", s.CopyDtoH(got, dst))
		cuMust(t, "Synchronize", s.Synchronize())
		if !bytes.Equal(got, want) {
			t.Errorf("launches %d: queued kernel copies did not land", launches)
		}
		t.Logf("launches %d: %d queued copies issued in %v behind a %v kernel", launches, n, issue, fma)
		switch {
		case launches == 64 && issue > fma/4:
			t.Errorf("with 64 slots, %d launches took %v to issue behind a %v kernel: they waited on the host", n, issue, fma)
		case launches == 0 && issue < fma/2:
			t.Errorf("with the default 4 slots, %d launches issued in %v behind a %v kernel: the test cannot see a wait", n, issue, fma)
		}
		cuMust(t, "Destroy", s.Destroy())
		zero := make([]byte, n*piece)
		z, err := d.NewStream(0)
		cuMust(t, "NewStream", err)
		cuMust(t, "CopyHtoD", z.CopyHtoD(dst, zero))
		cuMust(t, "Synchronize", z.Synchronize())
		z.Destroy()
	}
}

func TestCuLaunchFMA(t *testing.T) {
	d := gputest.Device(t)
	ft := newCuFMATimer(t, d)
	defer ft.close()
	for _, bad := range [][2]int{{4, -1}, {0, 1}, {65, 1}} {
		if err := ft.cl.LaunchFMA(bad[0], bad[1]); !errors.Is(err, ErrInvalidValue) {
			t.Errorf("LaunchFMA(%d, %d) = %v, want ErrInvalidValue", bad[0], bad[1], err)
		}
	}
	// The first launch loads the kernel (lazy loading: 112 ms on the
	// H200 once, against 5 ms for four times the work after it).
	cuMust(t, "LaunchFMA", ft.launch(4, 1<<10))
	ft.elapsed(t)
	var prev time.Duration
	for _, iters := range []int{1 << 16, 1 << 18} {
		cuMust(t, "LaunchFMA", ft.launch(4, iters))
		el := ft.elapsed(t)
		t.Logf("LaunchFMA(%d): %v", iters, el)
		if el <= prev {
			t.Errorf("LaunchFMA(%d) took %v, not longer than a quarter of the work (%v)", iters, el, prev)
		}
		prev = el
	}
}

// cuFMATimer times kvtier_fma launches on a stream of its own, between two
// timing events.
type cuFMATimer struct {
	s      Stream
	cl     ComputeLoader
	e0, e1 Event
}

// newCuFMATimer makes the timer's stream and events; the caller MUST
// close it before closing d.
func newCuFMATimer(t *testing.T, d Device) *cuFMATimer {
	t.Helper()
	s, err := d.NewStream(0)
	cuMust(t, "NewStream", err)
	ft := &cuFMATimer{s: s}
	var ok bool
	if ft.cl, ok = s.(ComputeLoader); !ok {
		s.Destroy()
		t.Fatalf("%T does not implement ComputeLoader", s)
	}
	for _, e := range []*Event{&ft.e0, &ft.e1} {
		if *e, err = d.NewEvent(EventOptions{Timing: true}); err != nil {
			ft.close()
			t.Fatalf("NewEvent: %v", err)
		}
	}
	return ft
}

// close destroys the timer's events and stream.
func (ft *cuFMATimer) close() {
	for _, e := range []Event{ft.e0, ft.e1} {
		if e != nil {
			e.Destroy()
		}
	}
	ft.s.Destroy()
}

// launch enqueues one timed launch of ctasPerSM CTAs per SM.
func (ft *cuFMATimer) launch(ctasPerSM, iters int) error {
	if err := ft.e0.Record(ft.s); err != nil {
		return err
	}
	if err := ft.cl.LaunchFMA(ctasPerSM, iters); err != nil {
		return err
	}
	return ft.e1.Record(ft.s)
}

// elapsed waits for the last launch and returns how long it ran.
func (ft *cuFMATimer) elapsed(t *testing.T) time.Duration {
	t.Helper()
	cuMust(t, "Synchronize", ft.e1.Synchronize())
	el, err := ft.e1.Elapsed(ft.e0)
	cuMust(t, "Elapsed", err)
	return el
}

// TestCuRangeCacheAfterFree: a stream checks each copy against the
// device allocation it lands in, from a small cache that every free
// empties. Allocations of new sizes, made after frees, often reuse the
// freed addresses; every copy of a whole allocation must pass its check.
// Before the cache was refilled from its first slot after a free, a stale
// range there answered for a new, larger allocation at the same address
// (the codec's GPU test: "the copy runs past the end of its allocation").
func TestCuRangeCacheAfterFree(t *testing.T) {
	d := gputest.Device(t)
	s, err := d.NewStream(0)
	cuMust(t, "NewStream", err)
	defer s.Destroy()
	for round := 1; round <= 6; round++ {
		var ptrs []DevicePtr
		for i := range 3 {
			n := int64(round*16<<10 + i*4096)
			p, err := d.Alloc(n)
			cuMust(t, "Alloc", err)
			ptrs = append(ptrs, p)
			buf := make([]byte, n)
			if err := s.CopyHtoD(p, buf); err != nil {
				t.Fatalf("round %d, allocation %d (%d bytes at %#x): %v", round, i, n, uint64(p), err)
			}
		}
		cuMust(t, "Synchronize", s.Synchronize())
		for _, p := range ptrs {
			cuMust(t, "Free", d.Free(p))
		}
	}
}
