package cudastream

import (
	"bytes"
	"math/rand/v2"
	"testing"
	"testing/synctest"
	"time"
)

const gib = 1 << 30

// eventTime records e on st and returns its modelled completion time.
func eventTime(t *testing.T, s *Sim, st Stream) time.Duration {
	t.Helper()
	e := mustEvent(t, s, false)
	must(t, e.Record(st))
	must(t, e.Synchronize())
	d, ok := s.EventTime(e)
	if !ok {
		t.Fatal("EventTime unknown after Synchronize")
	}
	return d
}

func TestSimVirtualExactTimes(t *testing.T) {
	link := LinkModel{HtoDBytesPerSec: 50 * gib, DtoHBytesPerSec: 50 * gib, DtoDBytesPerSec: 50 * gib, CopyLatency: 3 * time.Microsecond}
	s, err := NewSim(SimConfig{MemoryBytes: 4 * gib, TimingOnly: true, Clock: SimVirtualClock, Link: link})
	must(t, err)
	defer s.Close()
	st := mustStream(t, s, 0)
	a, b := mustAlloc(t, s, gib), mustAlloc(t, s, gib)
	must(t, st.CopyDtoD(b, a, gib))
	must(t, st.Synchronize())
	if got, want := s.Clock().Now(), 20*time.Millisecond+3*time.Microsecond; got != want {
		t.Fatalf("1 GiB at 50 GiB/s: Synchronize moved the clock to %v, want %v", got, want)
	}
	// The next copy starts at the current time, not at zero.
	must(t, st.CopyDtoD(b, a, gib/2))
	if got, want := eventTime(t, s, st), 30*time.Millisecond+6*time.Microsecond; got != want {
		t.Fatalf("second copy ends at %v, want %v", got, want)
	}
	st2 := s.LinkStats()
	if st2.Copies[DeviceToDevice] != 2 || st2.Bytes[DeviceToDevice] != gib+gib/2 || st2.Busy[DeviceToDevice] != 30*time.Millisecond+6*time.Microsecond || st2.Copies[HostToDevice] != 0 {
		t.Fatalf("LinkStats = %+v", st2)
	}
}

// TestSimEnginesQueueAndOverlap: copies of one direction on two streams share
// the engine and queue; HtoD and DtoH run at once; two engines overlap.
func TestSimEnginesQueueAndOverlap(t *testing.T) {
	const n = 16 << 20 // 312.5 us at 50 GiB/s
	const lat = 3 * time.Microsecond
	const d = 312500*time.Nanosecond + lat
	link := LinkModel{HtoDBytesPerSec: 50 * gib, DtoHBytesPerSec: 50 * gib, CopyLatency: lat}
	run := func(t *testing.T, link LinkModel, second CopyKind) (time.Duration, time.Duration) {
		s := newTestSim(t, SimVirtualClock, link)
		s1, s2 := mustStream(t, s, 0), mustStream(t, s, 0)
		p, q := mustAlloc(t, s, n), mustAlloc(t, s, n)
		buf1, buf2 := make([]byte, n), make([]byte, n)
		must(t, s1.CopyHtoD(p, buf1))
		if second == HostToDevice {
			must(t, s2.CopyHtoD(q, buf2))
		} else {
			must(t, s2.CopyDtoH(buf2, q))
		}
		e1, e2 := mustEvent(t, s, false), mustEvent(t, s, false)
		must(t, e1.Record(s1))
		must(t, e2.Record(s2))
		must(t, e1.Synchronize())
		must(t, e2.Synchronize())
		t1, _ := s.EventTime(e1)
		t2, _ := s.EventTime(e2)
		return t1, t2
	}
	if t1, t2 := run(t, link, HostToDevice); t1 != d || t2 != 2*d {
		t.Errorf("two HtoD on two streams end at %v and %v, want %v and %v (queued on one engine)", t1, t2, d, 2*d)
	}
	if t1, t2 := run(t, link, DeviceToHost); t1 != d || t2 != d {
		t.Errorf("HtoD and DtoH end at %v and %v, want both at %v (overlap)", t1, t2, d)
	}
	link.Engines[HostToDevice] = 2
	if t1, t2 := run(t, link, HostToDevice); t1 != d || t2 != d {
		t.Errorf("two HtoD with two engines end at %v and %v, want both at %v", t1, t2, d)
	}
}

func TestSimPriority(t *testing.T) {
	const n = 1 << 20
	link := LinkModel{HtoDBytesPerSec: gib} // 1 MiB: 976563 ns
	const d = 976563 * time.Nanosecond
	cases := []struct {
		name         string
		lowPrio      int
		observeFirst bool // let the low-priority copy start before the others arrive
		want         [3]time.Duration
	}{
		// All three wait at time 0: the high-priority copy goes first.
		{"contended at start", 1, false, [3]time.Duration{2 * d, 3 * d, d}},
		// X1 has started; when it ends, Y (high) passes X2 though X2 was enqueued first.
		{"contended at engine release", 1, true, [3]time.Duration{d, 3 * d, 2 * d}},
		// Same priority: first come, first served.
		{"equal priority", 0, true, [3]time.Duration{d, 2 * d, 3 * d}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			s := newTestSim(t, SimVirtualClock, link)
			low, high := mustStream(t, s, tc.lowPrio), mustStream(t, s, 0)
			p := mustAlloc(t, s, 3*n)
			buf := make([]byte, n)
			ev := [3]Event{mustEvent(t, s, false), mustEvent(t, s, false), mustEvent(t, s, false)}
			must(t, low.CopyHtoD(p, buf)) // X1
			must(t, ev[0].Record(low))
			if tc.observeFirst {
				if done, err := low.Query(); done || err != nil {
					t.Fatalf("Query = %v, %v", done, err)
				}
			}
			must(t, low.CopyHtoD(p+n, buf)) // X2
			must(t, ev[1].Record(low))
			must(t, high.CopyHtoD(p+2*n, buf)) // Y
			must(t, ev[2].Record(high))
			for i, e := range ev {
				must(t, e.Synchronize())
				if got, _ := s.EventTime(e); got != tc.want[i] {
					t.Errorf("copy %d ends at %v, want %v", i, got, tc.want[i])
				}
			}
		})
	}
}

// TestSimEventAcrossStreams: B waits on A's event and sees A's data. Without
// the wait, the timeline shows B's read finishing before A's write, and the
// bytes B read are the stale ones.
func TestSimEventAcrossStreams(t *testing.T) {
	const n = 1 << 20
	link := LinkModel{HtoDBytesPerSec: gib, DtoHBytesPerSec: 4 * gib}
	for _, wait := range []bool{true, false} {
		s := newTestSim(t, SimVirtualClock, link)
		a, b := mustStream(t, s, 0), mustStream(t, s, 0)
		p := mustAlloc(t, s, n)
		data := pattern(n, 9)
		got := make([]byte, n)
		ea, eb := mustEvent(t, s, false), mustEvent(t, s, false)
		must(t, a.CopyHtoD(p, data))
		must(t, ea.Record(a))
		if wait {
			must(t, b.WaitEvent(ea))
		}
		must(t, b.CopyDtoH(got, p))
		must(t, eb.Record(b))
		must(t, eb.Synchronize())
		must(t, ea.Synchronize())
		ta, _ := s.EventTime(ea)
		tb, _ := s.EventTime(eb)
		if wait {
			if !bytes.Equal(got, data) {
				t.Error("with WaitEvent, B did not see A's data")
			}
			if want := ta + 244141*time.Nanosecond; tb != want { // 2^20 B at 4 GiB/s
				t.Errorf("with WaitEvent, B ends at %v, want %v", tb, want)
			}
		} else {
			if tb >= ta {
				t.Errorf("without WaitEvent, B ends at %v, not before A at %v", tb, ta)
			}
			if !bytes.Equal(got, make([]byte, n)) {
				t.Error("without WaitEvent, B read A's data although its copy ended first")
			}
		}
	}
}

// TestSimDataMovesAtModelledEnd: on the virtual clock a copy's bytes appear
// when the clock reaches its end, and Query never moves the clock.
func TestSimDataMovesAtModelledEnd(t *testing.T) {
	s := newTestSim(t, SimVirtualClock, LinkModel{HtoDBytesPerSec: 1e9, DtoHBytesPerSec: 1e9})
	st := mustStream(t, s, 0)
	p := mustAlloc(t, s, 1000)
	must(t, st.CopyHtoD(p, pattern(1000, 5))) // [0, 1us]
	got := make([]byte, 1000)
	must(t, st.CopyDtoH(got, p)) // [1us, 2us]
	for range 3 {
		if done, err := st.Query(); done || err != nil {
			t.Fatalf("Query = %v, %v before the clock moved", done, err)
		}
	}
	must(t, s.AdvanceTo(2*time.Microsecond-1))
	if done, _ := st.Query(); done || got[1] != 0 {
		t.Fatalf("done=%v, data %v before the copy's end", done, got[:2])
	}
	must(t, s.Advance(1))
	if done, _ := st.Query(); !done || !bytes.Equal(got, pattern(1000, 5)) {
		t.Fatalf("done=%v, data wrong at the copy's end", done)
	}
}

// TestSimPageableAndBatchCosts checks the H200 preset's arithmetic.
func TestSimPageableAndBatchCosts(t *testing.T) {
	link := H200Link()
	const n = 1 << 20
	s := newTestSim(t, SimVirtualClock, link)
	st := mustStream(t, s, 0)
	p := mustAlloc(t, s, n)
	pageable := make([]byte, n)
	pinned, err := s.HostAlloc(n)
	must(t, err)
	cost := func(bw float64, descs int) time.Duration {
		return link.CopyLatency + time.Duration(descs)*link.DescriptorCost + time.Duration(float64(n)/bw*1e9+0.5) + link.EventCost
	}
	start := s.Clock().Now()
	must(t, st.CopyHtoD(p, pageable))
	if got, want := eventTime(t, s, st)-start, cost(5.4*gib, 0); got != want {
		t.Errorf("pageable HtoD took %v, want %v", got, want)
	}
	start = s.Clock().Now()
	must(t, st.CopyHtoD(p, pinned))
	if got, want := eventTime(t, s, st)-start, cost(49.4*gib, 0); got != want {
		t.Errorf("pinned HtoD took %v, want %v", got, want)
	}
	start = s.Clock().Now()
	must(t, st.CopyDtoH(pageable, p))
	if got, want := eventTime(t, s, st)-start, cost(10.5*gib, 0); got != want {
		t.Errorf("pageable DtoH took %v, want %v", got, want)
	}
	ops := make([]Copy, 16)
	for i := range ops {
		ops[i] = Copy{Dst: HostAddr(pinned) + uint64(i*n/16), Src: uint64(p) + uint64(i*n/16), Bytes: n / 16}
	}
	start = s.Clock().Now()
	must(t, st.CopyBatch(DeviceToHost, ops))
	if got, want := eventTime(t, s, st)-start, cost(51.4*gib, 16); got != want {
		t.Errorf("16-descriptor DtoH batch took %v, want %v", got, want)
	}
}

// TestSimBatch10000 moves 10,000 scattered descriptors host to device and
// back, and checks every byte and the modelled time.
func TestSimBatch10000(t *testing.T) {
	const descs, size = 10000, 100
	link := H200Link()
	s, err := NewSim(SimConfig{MemoryBytes: simTestMem, Clock: SimVirtualClock, Link: link})
	must(t, err)
	defer s.Close()
	st := mustStream(t, s, 0)
	src := pattern(descs*size, 11)
	must(t, s.HostRegister(src))
	dst, err := s.HostAlloc(descs * size)
	must(t, err)
	p := mustAlloc(t, s, descs*size)
	rng := rand.New(rand.NewPCG(1, 2))
	perm := rng.Perm(descs)
	ops := make([]Copy, descs)
	for i, j := range perm { // host block i -> device block j
		ops[i] = Copy{Dst: uint64(p) + uint64(j*size), Src: HostAddr(src[i*size:]), Bytes: size}
	}
	must(t, st.CopyBatch(HostToDevice, ops))
	for i, j := range perm { // device block j -> host block i
		ops[i] = Copy{Dst: HostAddr(dst[i*size:]), Src: uint64(p) + uint64(j*size), Bytes: size}
	}
	must(t, st.CopyBatch(DeviceToHost, ops))
	end := eventTime(t, s, st)
	if !bytes.Equal(dst, src) {
		t.Fatal("10,000-descriptor round trip corrupted data")
	}
	each := 2*link.CopyLatency + 2*descs*link.DescriptorCost + link.EventCost
	total := float64(descs * size)
	bw := time.Duration(total/(49.4*gib)*1e9+0.5) + time.Duration(total/(51.4*gib)*1e9+0.5)
	if want := each + bw; end != want {
		t.Fatalf("two 10,000-descriptor batches end at %v, want %v", end, want)
	}
	must(t, s.HostUnregister(src))
}

// simScript runs a seeded random mix of copies, events and waits on three
// streams and returns every event's completion time.
func simScript(t *testing.T, seed uint64) []time.Duration {
	s := newTestSim(t, SimVirtualClock, H200Link())
	rng := rand.New(rand.NewPCG(seed, 7))
	streams := []Stream{mustStream(t, s, 0), mustStream(t, s, -1), mustStream(t, s, 0)}
	const n = 1 << 20
	p := mustAlloc(t, s, 4*n)
	host, err := s.HostAlloc(4 * n)
	must(t, err)
	var events []Event
	for range 300 {
		st := streams[rng.IntN(len(streams))]
		off := rng.IntN(3 * n)
		size := 1 + rng.IntN(n)
		switch rng.IntN(6) {
		case 0:
			must(t, st.CopyHtoD(p+DevicePtr(off), host[off:off+size]))
		case 1:
			must(t, st.CopyDtoH(host[off:off+size], p+DevicePtr(off)))
		case 2:
			must(t, st.CopyDtoD(p+DevicePtr(rng.IntN(3*n)), p+DevicePtr(off), int64(rng.IntN(n))))
		case 3:
			e := mustEvent(t, s, false)
			must(t, e.Record(st))
			events = append(events, e)
		case 4:
			if len(events) > 0 {
				must(t, st.WaitEvent(events[rng.IntN(len(events))]))
			}
		case 5:
			must(t, s.Advance(time.Duration(rng.IntN(200))*time.Microsecond))
		}
	}
	times := make([]time.Duration, len(events))
	for i, e := range events {
		must(t, e.Synchronize())
		times[i], _ = s.EventTime(e)
	}
	return times
}

func TestSimVirtualDeterministic(t *testing.T) {
	a, b := simScript(t, 42), simScript(t, 42)
	if len(a) == 0 {
		t.Fatal("script recorded no events")
	}
	for i := range a {
		if a[i] != b[i] {
			t.Fatalf("event %d: %v in one run, %v in the other", i, a[i], b[i])
		}
	}
}

// TestSimWallClockTakesModelledTime uses the real clock, as a lower bound
// only: a copy modelled at 50 ms cannot complete sooner.
func TestSimWallClockTakesModelledTime(t *testing.T) {
	s := newTestSim(t, SimWallClock, LinkModel{HtoDBytesPerSec: 20 << 20}) // 1 MiB: 50 ms
	st := mustStream(t, s, 0)
	p := mustAlloc(t, s, 1<<20)
	data := pattern(1<<20, 3)
	start := time.Now()
	must(t, st.CopyHtoD(p, data))
	if done, _ := st.Query(); done {
		t.Fatal("a 50 ms copy completed at once")
	}
	must(t, st.Synchronize())
	if el := time.Since(start); el < 50*time.Millisecond {
		t.Fatalf("a copy modelled at 50 ms completed in %v", el)
	}
}

// TestSimWallClockOverlap runs on synctest's fake clock: exact times, no
// sleeping.
func TestSimWallClockOverlap(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		const n = 1 << 20
		link := LinkModel{HtoDBytesPerSec: 10 << 20, DtoHBytesPerSec: 10 << 20} // 1 MiB: 100 ms
		s := newTestSim(t, SimWallClock, link)
		a, b, c := mustStream(t, s, 0), mustStream(t, s, 0), mustStream(t, s, 0)
		p, q, r := mustAlloc(t, s, n), mustAlloc(t, s, n), mustAlloc(t, s, n)
		up, down, up2 := pattern(n, 1), make([]byte, n), pattern(n, 2)
		start := time.Now()
		must(t, a.CopyHtoD(p, up))
		must(t, b.CopyDtoH(down, q))
		must(t, a.Synchronize())
		must(t, b.Synchronize())
		if el := time.Since(start); el != 100*time.Millisecond {
			t.Fatalf("HtoD and DtoH of 100 ms each took %v together, want 100ms", el)
		}
		start = time.Now()
		must(t, a.CopyHtoD(p, up))
		must(t, c.CopyHtoD(r, up2))
		e := mustEvent(t, s, false)
		must(t, e.Record(c))
		must(t, e.Synchronize())
		if el := time.Since(start); el != 200*time.Millisecond {
			t.Fatalf("two HtoD of 100 ms each took %v, want 200ms (one engine)", el)
		}
		must(t, a.Synchronize())
		got := make([]byte, n)
		must(t, a.CopyDtoH(got, r))
		must(t, a.Synchronize())
		if !bytes.Equal(got, up2) {
			t.Fatal("bytes copied on the wall clock are wrong")
		}
	})
}

// TestSimNextEvent: NextEvent names each time the timeline changes on its
// own (a start held back by a busy engine, then each end), so that stepping
// the virtual clock to it observes each copy complete at its modelled end,
// and reports false once nothing is queued.
func TestSimNextEvent(t *testing.T) {
	link := LinkModel{HtoDBytesPerSec: 50 * gib, DtoHBytesPerSec: 50 * gib, DtoDBytesPerSec: 50 * gib, CopyLatency: 3 * time.Microsecond}
	s, err := NewSim(SimConfig{MemoryBytes: 4 * gib, TimingOnly: true, Clock: SimVirtualClock, Link: link})
	must(t, err)
	defer s.Close()
	if at, ok := s.NextEvent(); ok {
		t.Fatalf("idle sim: NextEvent = %v, true; want false", at)
	}
	s1, s2 := mustStream(t, s, 0), mustStream(t, s, 0)
	a, b := mustAlloc(t, s, gib), mustAlloc(t, s, gib)
	must(t, s1.CopyDtoD(b, a, gib/2)) // 10 ms + 3 us on the one engine
	must(t, s2.CopyDtoD(a, b, gib/2)) // waits for the engine
	e1, e2 := mustEvent(t, s, false), mustEvent(t, s, false)
	must(t, e1.Record(s1))
	must(t, e2.Record(s2))
	one := 10*time.Millisecond + 3*time.Microsecond
	var ends []time.Duration
	for {
		at, ok := s.NextEvent()
		if !ok {
			break
		}
		if now := s.Clock().Now(); at <= now {
			t.Fatalf("NextEvent = %v, not after the clock's %v", at, now)
		}
		must(t, s.AdvanceTo(at))
		for i, e := range []Event{e1, e2} {
			done, err := e.Query()
			must(t, err)
			if done && len(ends) == i {
				ends = append(ends, at)
			}
		}
	}
	if len(ends) != 2 || ends[0] != one || ends[1] != 2*one {
		t.Fatalf("events observed complete at %v, want [%v %v]: the second copy queues for the engine (EventCost 0)", ends, one, 2*one)
	}
}

// A TimingOnly batch keeps one span per memory it touches, not one per
// descriptor (10,000 descriptors from two registered ranges into one
// allocation: two spans), and costs as many descriptors as it has; the
// merged spans still track their memory (unregistering one while the
// batch is queued faults the stream).
func TestSimTimingOnlyBatchSpans(t *testing.T) {
	const descs, size = 10000, 4096
	link := H200Link()
	s, err := NewSim(SimConfig{MemoryBytes: descs * size, TimingOnly: true, Clock: SimVirtualClock, Link: link})
	must(t, err)
	defer s.Close()
	p := mustAlloc(t, s, descs*size)
	host := make([]byte, descs*size)
	a, b := host[:descs*size/2], host[descs*size/2:]
	must(t, s.HostRegister(a))
	must(t, s.HostRegister(b))
	ops := make([]Copy, descs)
	for i := range ops {
		ops[i] = Copy{Dst: uint64(p) + uint64(i*size), Src: HostAddr(host[i*size:]), Bytes: size}
	}
	st := mustStream(t, s, 0)
	must(t, st.CopyBatch(HostToDevice, ops))
	ss := st.(*simStream)
	s.mu.Lock()
	spans := len(ss.q[ss.head].spans)
	s.mu.Unlock()
	if spans != 2 {
		t.Fatalf("a TimingOnly batch of %d descriptors over two host ranges keeps %d spans, want 2", descs, spans)
	}
	total := float64(descs * size)
	bw := time.Duration(total/(49.4*gib)*1e9 + 0.5)
	if end, want := eventTime(t, s, st), link.CopyLatency+descs*link.DescriptorCost+bw+link.EventCost; end != want {
		t.Fatalf("the batch ends at %v, want %v (every descriptor priced)", end, want)
	}
	must(t, st.CopyBatch(HostToDevice, ops))
	must(t, s.HostUnregister(b))
	wantSimError(t, st.Synchronize(), "cuStreamSynchronize", ErrIllegalAddress)
	must(t, s.HostUnregister(a))
}
