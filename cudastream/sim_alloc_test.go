package cudastream

import (
	"testing"
	"time"
)

// TestSimHotPathAllocatesNothing: once warmed, enqueueing copies, recording
// and waiting on events, and completing them allocates nothing.
func TestSimHotPathAllocatesNothing(t *testing.T) {
	if testing.CoverMode() != "" {
		t.Skip("coverage counters allocate")
	}
	s := newTestSim(t, SimVirtualClock, H200Link())
	a, b := mustStream(t, s, 0), mustStream(t, s, 1)
	p := mustAlloc(t, s, 1<<20)
	host, err := s.HostAlloc(1 << 20)
	must(t, err)
	pageable := make([]byte, 4096)
	e := mustEvent(t, s, true)
	ops := make([]Copy, 64)
	for i := range ops {
		ops[i] = Copy{Dst: uint64(p) + uint64(i*4096), Src: HostAddr(host[i*4096:]), Bytes: 4096}
	}
	step := func() {
		_ = a.CopyHtoD(p, host[:4096])
		_ = a.CopyHtoD(p, pageable)
		_ = a.CopyBatch(HostToDevice, ops)
		_ = e.Record(a)
		_ = b.WaitEvent(e)
		_ = b.CopyDtoH(host[8192:12288], p)
		_ = b.CopyDtoD(p+8192, p, 4096)
		_, _ = a.Query()
		_ = s.Advance(time.Microsecond)
		_ = b.Synchronize()
		_ = e.Synchronize()
	}
	for range 10 {
		step()
	}
	if n := testing.AllocsPerRun(200, step); n != 0 {
		t.Fatalf("%v allocations per round of copies", n)
	}
}
