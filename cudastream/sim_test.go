package cudastream

import (
	"bytes"
	"errors"
	"strings"
	"testing"
	"time"
)

var _ Device = (*Sim)(nil)

const simTestMem = 64 << 20

func newTestSim(t testing.TB, clock SimClockKind, link LinkModel) *Sim {
	t.Helper()
	s, err := NewSim(SimConfig{MemoryBytes: simTestMem, Link: link, Clock: clock})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := s.Close(); err != nil {
			t.Errorf("Close: %v", err)
		}
	})
	return s
}

func mustStream(t testing.TB, s *Sim, prio int) Stream {
	t.Helper()
	st, err := s.NewStream(prio)
	if err != nil {
		t.Fatal(err)
	}
	return st
}

func mustEvent(t testing.TB, s *Sim, timing bool) Event {
	t.Helper()
	e, err := s.NewEvent(EventOptions{Timing: timing})
	if err != nil {
		t.Fatal(err)
	}
	return e
}

func mustAlloc(t testing.TB, s *Sim, n int64) DevicePtr {
	t.Helper()
	p, err := s.Alloc(n)
	if err != nil {
		t.Fatal(err)
	}
	return p
}

func must(t testing.TB, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}

func pattern(n int, seed byte) []byte {
	b := make([]byte, n)
	for i := range b {
		b[i] = seed + byte(i*7)
	}
	return b
}

// wantSimError checks that err is a *Error from call that matches sentinel.
func wantSimError(t *testing.T, err error, call string, sentinel error) {
	t.Helper()
	if !errors.Is(err, sentinel) {
		t.Fatalf("error %v: want errors.Is(%v)", err, sentinel)
	}
	var e *Error
	if !errors.As(err, &e) {
		t.Fatalf("error %v (%T) is not an *Error", err, err)
	}
	if e.Call != call {
		t.Fatalf("error %v names call %q, want %q", err, e.Call, call)
	}
}

func TestSimConfigErrorsNameTheField(t *testing.T) {
	good := SimConfig{MemoryBytes: 1 << 20}
	cases := []struct {
		field string
		edit  func(*SimConfig)
	}{
		{"MemoryBytes", func(c *SimConfig) { c.MemoryBytes = 0 }},
		{"MemoryBytes", func(c *SimConfig) { c.MemoryBytes = -5 }},
		{"Clock", func(c *SimConfig) { c.Clock = NumSimClockKinds }},
		{"Info.TotalMemBytes", func(c *SimConfig) { c.Info.TotalMemBytes = 7 }},
		{"Info.SMCount", func(c *SimConfig) { c.Info.SMCount = -1 }},
		{"Info.CopyEngines", func(c *SimConfig) { c.Info.CopyEngines = -1 }},
		{"Link.HtoDBytesPerSec", func(c *SimConfig) { c.Link.HtoDBytesPerSec = -1 }},
		{"Link.DtoHBytesPerSec", func(c *SimConfig) { c.Link.DtoHBytesPerSec = nan() }},
		{"Link.DtoDBytesPerSec", func(c *SimConfig) { c.Link.DtoDBytesPerSec = inf() }},
		{"Link.PageableHtoDBytesPerSec", func(c *SimConfig) { c.Link.PageableHtoDBytesPerSec = -2 }},
		{"Link.PageableDtoHBytesPerSec", func(c *SimConfig) { c.Link.PageableDtoHBytesPerSec = -2 }},
		{"Link.CopyLatency", func(c *SimConfig) { c.Link.CopyLatency = -1 }},
		{"Link.DescriptorCost", func(c *SimConfig) { c.Link.DescriptorCost = -1 }},
		{"Link.EventCost", func(c *SimConfig) { c.Link.EventCost = -1 }},
		{"Link.Engines[DtoH]", func(c *SimConfig) { c.Link.Engines[DeviceToHost] = -1 }},
		{"Link.Engines[HtoD]", func(c *SimConfig) { c.Link.Engines[HostToDevice] = simMaxEngines + 1 }},
	}
	for _, tc := range cases {
		cfg := good
		tc.edit(&cfg)
		s, err := NewSim(cfg)
		if err == nil {
			s.Close()
			t.Errorf("%s: NewSim accepted a bad value", tc.field)
			continue
		}
		if !strings.Contains(err.Error(), "SimConfig."+tc.field+":") {
			t.Errorf("%s: error %q does not name the field", tc.field, err)
		}
		if !errors.Is(err, ErrInvalidValue) {
			t.Errorf("%s: error %q does not match ErrInvalidValue", tc.field, err)
		}
	}
}

func nan() float64 { z := 0.0; return z / z }
func inf() float64 { z := 0.0; return 1 / z }

func TestSimInfo(t *testing.T) {
	s := newTestSim(t, SimVirtualClock, LinkModel{})
	in := s.Info()
	if !in.Simulated || in.TotalMemBytes != simTestMem || in.Name == "" || in.NUMANode != -1 || !in.BatchCopy {
		t.Fatalf("default Info %+v", in)
	}
	o, err := NewSim(SimConfig{MemoryBytes: 1 << 20, Info: Info{Name: "x", SMCount: 7}})
	must(t, err)
	defer o.Close()
	if in := o.Info(); in.Name != "x" || in.SMCount != 7 || in.TotalMemBytes != 1<<20 || !in.Simulated || in.NUMANode != 0 {
		t.Fatalf("overridden Info %+v", in)
	}
}

func TestSimMemoryAccounting(t *testing.T) {
	s := newTestSim(t, SimVirtualClock, LinkModel{})
	p := mustAlloc(t, s, 1000)
	if p == 0 || p%simAllocAlign != 0 {
		t.Fatalf("Alloc returned %#x: want non-zero, 256-aligned", p)
	}
	free, total, err := s.MemGetInfo()
	must(t, err)
	if total != simTestMem || free != simTestMem-1024 {
		t.Fatalf("MemGetInfo = %d, %d; want %d, %d", free, total, simTestMem-1024, simTestMem)
	}
	_, err = s.Alloc(simTestMem)
	wantSimError(t, err, "cuMemAlloc", ErrOutOfMemory)
	for _, n := range []int64{0, -1} {
		_, err = s.Alloc(n)
		wantSimError(t, err, "cuMemAlloc", ErrInvalidValue)
	}
	must(t, s.Free(p))
	if free, _, _ := s.MemGetInfo(); free != simTestMem {
		t.Fatalf("free after Free = %d, want %d", free, simTestMem)
	}
	q := mustAlloc(t, s, simTestMem) // the whole device fits again
	if q == p {
		t.Fatalf("address %#x reused", q)
	}
}

// TestSimStreamOrdering: dependent copies on one stream land in order, on
// both clocks and with a link where later copies are shorter than earlier
// ones.
func TestSimStreamOrdering(t *testing.T) {
	for _, clock := range []SimClockKind{SimVirtualClock, SimWallClock} {
		for _, link := range []LinkModel{{}, {HtoDBytesPerSec: 1 << 30, DtoHBytesPerSec: 4 << 30, DtoDBytesPerSec: 64 << 30, CopyLatency: time.Microsecond}} {
			t.Run(clock.String(), func(t *testing.T) {
				s := newTestSim(t, clock, link)
				st := mustStream(t, s, 0)
				const n = 64 << 10
				a, b := mustAlloc(t, s, n), mustAlloc(t, s, n)
				one, two := pattern(n, 1), pattern(n, 2)
				got := make([]byte, n)
				must(t, st.CopyHtoD(a, one))
				must(t, st.CopyDtoD(b, a, n)) // b = one
				must(t, st.CopyHtoD(a, two))  // a = two, must not reach b
				must(t, st.CopyDtoD(a+100, b, 1000))
				must(t, st.CopyDtoH(got, a))
				must(t, st.Synchronize())
				want := append([]byte(nil), two...)
				copy(want[100:1100], one[:1000])
				if !bytes.Equal(got, want) {
					t.Fatal("copies on one stream landed out of order")
				}
				if done, err := st.Query(); err != nil || !done {
					t.Fatalf("Query after Synchronize = %v, %v", done, err)
				}
			})
		}
	}
}

func TestSimZeroByteCopies(t *testing.T) {
	s := newTestSim(t, SimVirtualClock, LinkModel{})
	st := mustStream(t, s, 0)
	must(t, st.CopyHtoD(0, nil))
	must(t, st.CopyDtoH(nil, 0))
	must(t, st.CopyDtoD(0, 0, 0))
	must(t, st.Synchronize())
}

func TestSimClose(t *testing.T) {
	s, err := NewSim(SimConfig{MemoryBytes: 1 << 20})
	must(t, err)
	st := mustStream(t, s, 0)
	must(t, s.Close())
	_, err = s.Alloc(10)
	wantSimError(t, err, "cuMemAlloc", ErrInvalidValue)
	wantSimError(t, st.Synchronize(), "cuStreamSynchronize", ErrInvalidValue)
	if err := s.Close(); err == nil {
		t.Fatal("second Close succeeded")
	}
}

// TestSimDestroyedStreamFinishesItsWork: Destroy returns at once and the
// work already enqueued still runs.
func TestSimDestroyedStreamFinishesItsWork(t *testing.T) {
	s := newTestSim(t, SimVirtualClock, LinkModel{HtoDBytesPerSec: 1 << 30, DtoHBytesPerSec: 1 << 30})
	st := mustStream(t, s, 0)
	p := mustAlloc(t, s, 4096)
	got := make([]byte, 4096)
	e := mustEvent(t, s, false)
	must(t, st.CopyHtoD(p, pattern(4096, 3)))
	must(t, st.CopyDtoH(got, p))
	must(t, e.Record(st))
	must(t, st.Destroy())
	must(t, e.Synchronize())
	if !bytes.Equal(got, pattern(4096, 3)) {
		t.Fatal("work of a destroyed stream did not complete")
	}
	if n := len(s.streams); n != 0 {
		t.Fatalf("%d streams still tracked after the destroyed one drained", n)
	}
}
