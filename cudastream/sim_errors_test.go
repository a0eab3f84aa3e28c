package cudastream

import (
	"bytes"
	"errors"
	"testing"
	"time"
)

func TestSimOutOfBounds(t *testing.T) {
	s := newTestSim(t, SimVirtualClock, LinkModel{})
	st := mustStream(t, s, 0)
	p := mustAlloc(t, s, 1000)
	q := mustAlloc(t, s, 1000)
	buf := make([]byte, 1001)
	wantSimError(t, st.CopyHtoD(p, buf), "cuMemcpyHtoDAsync", ErrInvalidValue)
	wantSimError(t, st.CopyDtoH(buf[:10], p+995), "cuMemcpyDtoHAsync", ErrInvalidValue)
	wantSimError(t, st.CopyDtoD(q, p+1, 1000), "cuMemcpyDtoDAsync", ErrInvalidValue)
	wantSimError(t, st.CopyDtoD(q, p, -1), "cuMemcpyDtoDAsync", ErrInvalidValue)
	// Just past an allocation is the guard gap, in no allocation.
	wantSimError(t, st.CopyDtoH(buf[:1], p+1000), "cuMemcpyDtoHAsync", ErrInvalidValue)
	wantSimError(t, st.CopyDtoH(buf[:1], 12345), "cuMemcpyDtoHAsync", ErrInvalidValue)
	// Nothing was enqueued by the failed calls, and the stream still works.
	must(t, st.CopyHtoD(p+999, buf[:1]))
	must(t, st.Synchronize())
}

func TestSimUseAfterFree(t *testing.T) {
	s := newTestSim(t, SimVirtualClock, LinkModel{})
	st := mustStream(t, s, 0)
	p := mustAlloc(t, s, 4096)
	must(t, s.Free(p))
	wantSimError(t, st.CopyHtoD(p, make([]byte, 10)), "cuMemcpyHtoDAsync", ErrIllegalAddress)
	wantSimError(t, st.CopyDtoH(make([]byte, 10), p+100), "cuMemcpyDtoHAsync", ErrIllegalAddress)
	wantSimError(t, s.Free(p), "cuMemFree", ErrInvalidValue)
	wantSimError(t, s.Free(12345), "cuMemFree", ErrInvalidValue)
	q := mustAlloc(t, s, 4096)
	wantSimError(t, s.Free(q+256), "cuMemFree", ErrInvalidValue)
	must(t, st.Synchronize()) // the rejected copies did not fault the stream
}

// TestSimFreeWhileQueued: freeing memory that a queued copy uses faults the
// stream (reported by Query and Synchronize), moves no data, and the stream
// fails later calls; other streams are not affected.
func TestSimFreeWhileQueued(t *testing.T) {
	s := newTestSim(t, SimVirtualClock, LinkModel{HtoDBytesPerSec: 1 << 30})
	st := mustStream(t, s, 0)
	other := mustStream(t, s, 0)
	p := mustAlloc(t, s, 1<<20)
	keep := mustAlloc(t, s, 1<<20)
	must(t, st.CopyHtoD(p, pattern(1<<20, 3)))
	must(t, other.CopyHtoD(keep, pattern(1<<20, 4)))
	must(t, s.Free(p))
	_, err := st.Query()
	wantSimError(t, err, "cuStreamQuery", ErrIllegalAddress)
	wantSimError(t, st.Synchronize(), "cuStreamSynchronize", ErrIllegalAddress)
	wantSimError(t, st.CopyHtoD(keep, make([]byte, 8)), "cuMemcpyHtoDAsync", ErrIllegalAddress)
	must(t, other.Synchronize())
	got := make([]byte, 1<<20)
	must(t, other.CopyDtoH(got, keep))
	must(t, other.Synchronize())
	if !bytes.Equal(got, pattern(1<<20, 4)) {
		t.Fatal("the healthy stream's copy was corrupted")
	}
	// An event recorded on a stream that faults reports the fault.
	st2 := mustStream(t, s, 0)
	r := mustAlloc(t, s, 1<<20)
	e := mustEvent(t, s, false)
	must(t, st2.CopyHtoD(r, make([]byte, 1<<20)))
	must(t, e.Record(st2))
	must(t, s.Free(r))
	wantSimError(t, e.Synchronize(), "cuEventSynchronize", ErrIllegalAddress)
	// A stream waiting on that event inherits the fault.
	st3 := mustStream(t, s, 0)
	must(t, st3.WaitEvent(e))
	wantSimError(t, st3.Synchronize(), "cuStreamSynchronize", ErrIllegalAddress)
}

func TestSimUnregisterWhileQueued(t *testing.T) {
	s := newTestSim(t, SimVirtualClock, LinkModel{HtoDBytesPerSec: 1 << 30})
	st := mustStream(t, s, 0)
	p := mustAlloc(t, s, 4096)
	host := make([]byte, 4096)
	must(t, s.HostRegister(host))
	must(t, st.CopyBatch(HostToDevice, []Copy{{Dst: uint64(p), Src: HostAddr(host), Bytes: 4096}}))
	must(t, s.HostUnregister(host))
	wantSimError(t, st.Synchronize(), "cuStreamSynchronize", ErrIllegalAddress)
}

func TestSimHostRegistration(t *testing.T) {
	s := newTestSim(t, SimVirtualClock, LinkModel{})
	buf := make([]byte, 1<<16)
	must(t, s.HostRegister(buf[4096:8192]))
	wantSimError(t, s.HostRegister(buf[4096:8192]), "cuMemHostRegister", ErrAlreadyRegistered)
	wantSimError(t, s.HostRegister(buf[0:4097]), "cuMemHostRegister", ErrAlreadyRegistered)
	wantSimError(t, s.HostRegister(buf[8191:9000]), "cuMemHostRegister", ErrAlreadyRegistered)
	wantSimError(t, s.HostRegister(buf[5000:6000]), "cuMemHostRegister", ErrAlreadyRegistered)
	wantSimError(t, s.HostRegister(nil), "cuMemHostRegister", ErrInvalidValue)
	must(t, s.HostRegister(buf[0:4096]))    // adjacent below
	must(t, s.HostRegister(buf[8192:9000])) // adjacent above
	wantSimError(t, s.HostUnregister(buf[100:200]), "cuMemHostUnregister", ErrNotRegistered)
	wantSimError(t, s.HostUnregister(buf[4096:5000]), "cuMemHostUnregister", ErrInvalidValue)
	must(t, s.HostUnregister(buf[4096:8192]))
	wantSimError(t, s.HostUnregister(buf[4096:8192]), "cuMemHostUnregister", ErrNotRegistered)
	must(t, s.HostRegister(buf[4096:8192])) // free again

	h, err := s.HostAlloc(1000)
	must(t, err)
	wantSimError(t, s.HostRegister(h[10:20]), "cuMemHostRegister", ErrAlreadyRegistered)
	wantSimError(t, s.HostUnregister(h), "cuMemHostUnregister", ErrNotRegistered)
	wantSimError(t, s.HostFree(buf[0:4096]), "cuMemFreeHost", ErrInvalidValue)
	must(t, s.HostFree(h))
	wantSimError(t, s.HostFree(h), "cuMemFreeHost", ErrInvalidValue)
	_, err = s.HostAlloc(-1)
	wantSimError(t, err, "cuMemHostAlloc", ErrInvalidValue)

	v, err := s.HostAllocVMM(4096, -1)
	must(t, err)
	if len(v.Bytes()) != 4096 {
		t.Fatalf("VMM host memory has %d bytes", len(v.Bytes()))
	}
	must(t, v.Close())
	wantSimError(t, v.Close(), "cuMemRelease", ErrInvalidValue)
	_, err = s.HostAllocVMM(4096, -2)
	wantSimError(t, err, "cuMemCreate", ErrInvalidValue)
}

func TestSimBatchNeedsPinnedHostMemory(t *testing.T) {
	s := newTestSim(t, SimVirtualClock, LinkModel{})
	st := mustStream(t, s, 0)
	p := mustAlloc(t, s, 8192)
	pinned, err := s.HostAlloc(4096)
	must(t, err)
	pageable := make([]byte, 4096)
	cases := []struct {
		name string
		kind CopyKind
		ops  []Copy
		want error
	}{
		{"pageable source", HostToDevice, []Copy{{Dst: uint64(p), Src: HostAddr(pinned), Bytes: 8}, {Dst: uint64(p), Src: HostAddr(pageable), Bytes: 8}}, ErrNotRegistered},
		{"pageable destination", DeviceToHost, []Copy{{Dst: HostAddr(pageable), Src: uint64(p), Bytes: 8}}, ErrNotRegistered},
		{"runs past pinned range", HostToDevice, []Copy{{Dst: uint64(p), Src: HostAddr(pinned) + 4000, Bytes: 100}}, ErrNotRegistered},
		{"device out of bounds", HostToDevice, []Copy{{Dst: uint64(p) + 8190, Src: HostAddr(pinned), Bytes: 8}}, ErrInvalidValue},
		{"negative size", DeviceToDevice, []Copy{{Dst: uint64(p), Src: uint64(p), Bytes: -1}}, ErrInvalidValue},
		{"bad kind", NumCopyKinds, []Copy{{Dst: uint64(p), Src: uint64(p), Bytes: 1}}, ErrInvalidValue},
	}
	for _, tc := range cases {
		err := st.CopyBatch(tc.kind, tc.ops)
		if err == nil {
			t.Errorf("%s: accepted", tc.name)
			continue
		}
		wantSimError(t, err, "cuMemcpyBatchAsync", tc.want)
	}
	if done, err := st.Query(); !done || err != nil {
		t.Fatalf("rejected batches left work behind: %v, %v", done, err)
	}
	// As on the device: an empty batch and zero-sized descriptors, even at
	// addresses that are not valid, are no-ops.
	for _, ops := range [][]Copy{nil, {{Dst: 1, Src: 2}, {Dst: 3, Src: 4}}} {
		if err := st.CopyBatch(DeviceToDevice, ops); err != nil {
			t.Errorf("CopyBatch(%v) = %v, want nil", ops, err)
		}
	}
	if done, err := st.Query(); !done || err != nil {
		t.Fatalf("no-op batches left work behind: %v, %v", done, err)
	}
}

func TestSimEventErrors(t *testing.T) {
	s := newTestSim(t, SimVirtualClock, LinkModel{HtoDBytesPerSec: 1 << 30})
	st := mustStream(t, s, 0)
	plain, timed, timed2 := mustEvent(t, s, false), mustEvent(t, s, true), mustEvent(t, s, true)
	if done, err := plain.Query(); !done || err != nil {
		t.Fatalf("never-recorded event: Query = %v, %v; want complete", done, err)
	}
	must(t, plain.Synchronize())
	must(t, st.WaitEvent(plain)) // no-op
	_, err := timed.Elapsed(timed2)
	wantSimError(t, err, "cuEventElapsedTime", ErrInvalidValue) // not recorded
	must(t, plain.Record(st))
	must(t, timed.Record(st))
	_, err = timed.Elapsed(plain)
	wantSimError(t, err, "cuEventElapsedTime", ErrInvalidValue) // no timing
	p := mustAlloc(t, s, 1<<20)
	must(t, st.CopyHtoD(p, make([]byte, 1<<20)))
	must(t, timed2.Record(st))
	_, err = timed2.Elapsed(timed)
	wantSimError(t, err, "cuEventElapsedTime", ErrNotReady)
	must(t, timed2.Synchronize())
	d, err := timed2.Elapsed(timed)
	must(t, err)
	if want := 976563 * time.Nanosecond; d != want { // 2^20 B / 2^30 B/s = 976562.5 ns, rounded
		t.Fatalf("Elapsed = %v, want %v", d, want)
	}

	other := newTestSim(t, SimVirtualClock, LinkModel{})
	foreign := mustStream(t, other, 0)
	wantSimError(t, plain.Record(foreign), "cuEventRecord", ErrInvalidValue)
	wantSimError(t, foreign.WaitEvent(plain), "cuStreamWaitEvent", ErrInvalidValue)

	must(t, plain.Destroy())
	wantSimError(t, plain.Destroy(), "cuEventDestroy", ErrInvalidValue)
	_, err = plain.Query()
	wantSimError(t, err, "cuEventQuery", ErrInvalidValue)
	must(t, st.Destroy())
	wantSimError(t, st.CopyHtoD(p, make([]byte, 1)), "cuMemcpyHtoDAsync", ErrInvalidValue)
	wantSimError(t, st.Destroy(), "cuStreamDestroy", ErrInvalidValue)
}

func TestSimAdvanceErrors(t *testing.T) {
	v := newTestSim(t, SimVirtualClock, LinkModel{})
	if err := v.Advance(-1); !errors.Is(err, ErrInvalidValue) {
		t.Fatalf("Advance(-1) = %v", err)
	}
	must(t, v.AdvanceTo(time.Second))
	if err := v.AdvanceTo(time.Millisecond); !errors.Is(err, ErrInvalidValue) {
		t.Fatalf("AdvanceTo backwards = %v", err)
	}
	if got := v.Clock().Now(); got != time.Second {
		t.Fatalf("Now = %v, want 1s", got)
	}
	w := newTestSim(t, SimWallClock, LinkModel{})
	if err := w.Advance(time.Second); !errors.Is(err, ErrNotSupported) {
		t.Fatalf("Advance on the wall clock = %v", err)
	}
	if err := w.AdvanceTo(time.Second); !errors.Is(err, ErrNotSupported) {
		t.Fatalf("AdvanceTo on the wall clock = %v", err)
	}
}
