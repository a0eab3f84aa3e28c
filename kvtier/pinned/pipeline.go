package pinned

import (
	"context"
	"errors"
	"fmt"
	"runtime"
	"sync"
	"sync/atomic"
	"time"
	"unsafe"

	"kvtier.dev/internal/invariants"
	"kvtier.dev/kvtier/pinned/internal/sys"
)

// faultWork is the touchers' shared queue. The region is cut into stripes,
// claimed in address order from one counter, so all touchers work on the
// leading chunk together and it is ready for registration early; a chunk is
// faulted when its last stripe is.
type faultWork struct {
	stripe    int64 // bytes per stripe
	perChunk  int64 // stripe slots per chunk (the last chunk may use fewer)
	slots     int64 // perChunk * chunks
	next      atomic.Int64
	pending   []atomic.Int64  // stripes left per chunk
	touched   []chan struct{} // closed when chunk i is faulted
	stripesIn atomic.Int64    // stripes left in the region
	touchEnd  time.Time       // written by the toucher that finishes the last stripe

	stop     atomic.Bool
	failOnce sync.Once
	failed   chan struct{}
	err      error // read after failed closes
}

func newFaultWork(p *plan) *faultWork {
	w := &faultWork{
		stripe:  min(stripeBytes, p.chunkBytes),
		pending: make([]atomic.Int64, p.chunks),
		touched: make([]chan struct{}, p.chunks),
		failed:  make(chan struct{}),
	}
	w.perChunk = (p.chunkBytes + w.stripe - 1) / w.stripe
	w.slots = w.perChunk * int64(p.chunks)
	var total int64
	for i := range p.chunks {
		n := (p.chunk(i).LengthBytes + w.stripe - 1) / w.stripe
		w.pending[i].Store(n)
		w.touched[i] = make(chan struct{})
		total += n
	}
	w.stripesIn.Store(total)
	return w
}

func (w *faultWork) fail(err error) {
	w.failOnce.Do(func() {
		w.err = err
		w.stop.Store(true)
		close(w.failed)
	})
}

// run is the pipeline: touchers fault stripes while this goroutine, locked
// to the registering CPU, registers chunks in order as each is faulted.
func (s *state) run(ctx context.Context, cpus CPUPlan) {
	runtime.LockOSThread() // never unlocked: the thread and its affinity die with the goroutine
	defer close(s.done)
	defer s.cancel(errPipelineDone)

	w := newFaultWork(&s.p)
	t0 := time.Now()
	var wg sync.WaitGroup
	for _, cpu := range cpus.Touch {
		wg.Go(func() { s.toucher(w, cpu) })
	}
	busy, waited, err := s.registerLoop(ctx, cpus.Register, w)
	w.stop.Store(true)
	wg.Wait()
	end := time.Now()

	s.mu.Lock()
	if !w.touchEnd.IsZero() {
		s.stats.TouchTime = w.touchEnd.Sub(t0)
	}
	s.stats.RegisterBusyTime, s.stats.RegisterWaitTime = busy, waited
	if err == nil {
		s.stats.TotalTime = end.Sub(s.start)
	}
	s.mu.Unlock()
	s.err = err
}

// errPipelineDone releases the pipeline's context once it has finished.
var errPipelineDone = errors.New("pinned: pipeline finished")

// toucher faults stripes until none are left or the pipeline stops.
func (s *state) toucher(w *faultWork, cpu int) {
	runtime.LockOSThread() // never unlocked: the thread and its affinity die with the goroutine
	if err := sys.PinThreadToCPU(cpu); err != nil {
		w.fail(fmt.Errorf("pinned: %s: toucher: %w", StagePin, err))
		return
	}
	for !w.stop.Load() {
		g := w.next.Add(1) - 1
		if g >= w.slots {
			return
		}
		ci := int(g / w.perChunk)
		c := s.p.chunk(ci)
		off := c.OffsetBytes + (g%w.perChunk)*w.stripe
		if off >= c.OffsetBytes+c.LengthBytes {
			continue // an unused slot of a short last chunk
		}
		n := min(w.stripe, c.OffsetBytes+c.LengthBytes-off)
		if err := s.fault(off, n); err != nil {
			w.fail(&ChunkError{Index: ci, Chunks: s.p.chunks, OffsetBytes: c.OffsetBytes, LengthBytes: c.LengthBytes, Stage: StageFault, Err: err})
			return
		}
		s.faulted.Add(n)
		if w.pending[ci].Add(-1) == 0 {
			close(w.touched[ci])
		}
		if w.stripesIn.Add(-1) == 0 {
			w.touchEnd = time.Now()
		}
	}
}

// fault makes [off, off+n) resident and writable.
func (s *state) fault(off, n int64) error {
	p := unsafe.Add(s.base, off)
	if s.p.fault == FaultPopulateWrite {
		return sys.Madvise(p, uintptr(n), sys.MADV_POPULATE_WRITE)
	}
	step := smallPageBytes
	if s.stats.PageMode == PagesHugeTLB {
		step = hugePageBytes
	}
	touchPages(p, n, step)
	return nil
}

// touchPages writes a zero byte to each page: the write fault allocates the
// page (the read fault would map the shared zero page instead).
func touchPages(p unsafe.Pointer, n, step int64) {
	for o := int64(0); o < n; o += step {
		*(*byte)(unsafe.Add(p, o)) = 0
	}
}

// registerLoop registers chunk after chunk, in order, each as soon as it is
// faulted. It returns the time spent in HostRegister and waiting.
func (s *state) registerLoop(ctx context.Context, cpu int, w *faultWork) (busy, waited time.Duration, err error) {
	if err := sys.PinThreadToCPU(cpu); err != nil {
		return 0, 0, fmt.Errorf("pinned: %s: registering goroutine: %w", StagePin, err)
	}
	for ci := range s.p.chunks {
		c := s.p.chunk(ci)
		chunkErr := func(st Stage, e error) error {
			return &ChunkError{Index: ci, Chunks: s.p.chunks, OffsetBytes: c.OffsetBytes, LengthBytes: c.LengthBytes, Stage: st, Err: e}
		}
		tw := time.Now()
		select {
		case <-w.touched[ci]:
		case <-w.failed:
			return busy, waited, w.err
		case <-ctx.Done():
			return busy, waited, chunkErr(StageWait, context.Cause(ctx))
		}
		waited += time.Since(tw)
		if ctx.Err() != nil {
			return busy, waited, chunkErr(StageWait, context.Cause(ctx))
		}
		b := s.slice(c)
		if invariants.Enabled {
			s.assertResident(c)
		}
		invariants.Check(s.ready.Load() == c.OffsetBytes && c.OffsetBytes+c.LengthBytes <= s.p.size,
			"chunk %d at %d+%d does not follow the ready prefix %d of %d", ci, c.OffsetBytes, c.LengthBytes, s.ready.Load(), s.p.size)
		tr := time.Now()
		err := s.p.reg.HostRegister(b)
		busy += time.Since(tr)
		if err != nil {
			return busy, waited, chunkErr(StageRegister, err)
		}
		s.registered = ci + 1
		s.ready.Store(c.OffsetBytes + c.LengthBytes)
		close(s.chunkReady[ci])
		if s.onChunk != nil {
			s.onChunk(c)
		}
		if s.progress != nil {
			s.progress(s.faulted.Load(), s.ready.Load())
		}
	}
	return busy, waited, nil
}

// assertResident checks, with mincore, that every page of c is resident.
func (s *state) assertResident(c Chunk) {
	page := smallPageBytes
	n, err := sys.ResidentPages(unsafe.Add(s.base, c.OffsetBytes), uintptr(c.LengthBytes), uintptr(page))
	invariants.Check(err == nil, "mincore on chunk %d: %v", c.Index, err)
	want := int((c.LengthBytes + page - 1) / page)
	invariants.Check(n == want, "chunk %d has %d of %d pages resident before registration", c.Index, n, want)
}
