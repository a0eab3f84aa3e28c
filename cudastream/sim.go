package cudastream

import (
	"fmt"
	"sync"
	"time"
)

// SimClockKind selects the sim's clock.
type SimClockKind uint8

const (
	// SimWallClock: copies take their modelled time in real (or
	// synctest-faked) time.
	SimWallClock SimClockKind = iota
	// SimVirtualClock: time advances only through Advance, AdvanceTo and
	// Synchronize, without sleeping.
	SimVirtualClock
	NumSimClockKinds
)

func (k SimClockKind) String() string {
	switch k {
	case SimWallClock:
		return "wall"
	case SimVirtualClock:
		return "virtual"
	}
	return fmt.Sprintf("SimClockKind(%d)", uint8(k))
}

// SimConfig configures NewSim.
type SimConfig struct {
	// MemoryBytes is the device memory capacity: Alloc fails with
	// ErrOutOfMemory once the allocations (each rounded up to 256 bytes)
	// would exceed it. Example: 1<<30 for a 1 GiB device.
	MemoryBytes int64
	// TimingOnly makes device memory unbacked: allocations and copies are
	// checked and timed as usual, but no bytes are stored or moved. Use it to
	// replay traces against a device larger than this machine's memory.
	TimingOnly bool
	// Info overrides the reported facts. When Info.Name is empty every field
	// takes the sim's defaults (an H200-like device); otherwise Info is
	// reported as given, except TotalMemBytes (MemoryBytes) and Simulated
	// (true).
	Info Info
	// Link is the link model; the zero value is instantaneous. See H200Link.
	Link LinkModel
	// Clock selects wall or virtual time.
	Clock SimClockKind
}

// Clock is the sim's time source.
type Clock interface {
	// Now is the time since the sim started.
	Now() time.Duration
}

// Sim is the simulated device. It implements Device in pure Go: device
// memory is host memory (a []byte per Alloc, at a fake address), streams are
// ordered queues, events are completion markers, and a LinkModel says how
// long each copy takes. What follows is its contract; the copy engine and
// trace replay rely on it.
//
// The timeline. Every operation enqueued on a stream (a copy, an event
// record, a wait on an event) gets a modelled start and end on the sim's
// clock:
//
//	start = max(enqueue time,
//	            end of the previous operation on the same stream,
//	            completion time of the event waited on (wait operations),
//	            time the earliest engine of the copy's direction is free (copies))
//	end   = start + cost
//
// cost is CopyLatency + descriptors*DescriptorCost + bytes/bandwidth for a
// copy (see LinkModel), EventCost for an event record and zero for a wait.
// Enqueue time is the clock's Now at the call. The copy engines of one direction are shared
// by all streams: when several streams' copies wait for the same engine, the
// one on the higher-priority stream (lower number) goes first, then the one
// enqueued first. HtoD, DtoH and DtoD have separate engines and overlap.
//
// Decisions are made in time order, as a discrete-event simulation, and
// lazily: the start of an operation is fixed only once the clock has reached
// it and the timeline is observed (Query, Synchronize, Advance, EventTime, or
// the wall clock's executor). A copy enqueued later at the same instant
// therefore queues behind one that has already started, whatever its
// priority; before that, priority decides.
//
// The data of a copy moves when the copy ends on the clock (so the bytes a
// copy reads are those in memory at its modelled end): copies retire in
// order of end time, ties by enqueue order. An operation is complete (Query
// says true) once it has retired.
//
// The clocks. With SimWallClock, the clock is the time since NewSim (time.Now, so
// testing/synctest fakes it) and a goroutine retires operations when the
// clock reaches their end: copies really take the modelled time. With
// SimVirtualClock, time moves only when asked: Advance and AdvanceTo move it
// forward, and Synchronize on a stream or event moves it to the completion
// time of the work it waits for (a sleep that costs nothing). Query never
// moves the virtual clock, so polling Query alone never sees work complete
// that needs time; poll with Advance. The virtual clock is deterministic: the
// same calls in the same order give the same times and the same bytes.
// EventTime reads an event's modelled completion time, which is how an
// offline replay measures transfers on the modelled link.
//
// The checks. The sim rejects what a real driver would, with the same error classes:
// copies outside an allocation (ErrInvalidValue), copies touching freed
// memory (ErrIllegalAddress; a Free while queued copies still touch the
// allocation faults those streams, reported by their next Query or
// Synchronize, and the stream fails every later call, as CUDA's sticky
// errors do), unknown pointers, overlapping registrations, registrations of
// 512 GiB or more, and CopyBatch descriptors whose host side is not in
// registered (HostRegister), HostAlloc'd or HostAllocVMM'd memory
// (ErrNotRegistered). The last check exists because the sim can only reach
// host memory through slices it was given: turning an arbitrary address back
// into memory would need pointer arithmetic that go vet rejects. kvtier's
// copy engine batches only from pinned memory, so this matches its use.
// Single copies take slices and accept pageable memory, modelled at the
// pageable bandwidth.
//
// All methods of a Sim, its streams and its events may be called from any
// goroutine; one mutex serializes them. On the wall clock the executor
// copies bytes while holding it, so very large copies delay other calls.
type Sim struct {
	link       LinkModel
	info       Info
	timingOnly bool
	virtual    bool
	start      time.Time // wall clock origin

	mu   sync.Mutex
	cond sync.Cond // broadcast when operations retire (wall clock)

	now    time.Duration // virtual clock
	seq    uint64        // enqueue counter
	closed bool

	streams      []*simStream
	nextStreamID int
	engines      [NumCopyKinds][]time.Duration // free time of each engine
	opPool       []*simOp
	markerPool   []*simMarker

	mem   simMemory
	stats SimLinkStats

	// Wall clock executor.
	kick chan struct{}
	stop chan struct{}
	done chan struct{}
}

var _ Device = (*Sim)(nil)

// NewSim returns a simulated device. A config error names the field and
// matches ErrInvalidValue. With the wall clock it starts the executor
// goroutine: the caller MUST Close the sim to stop it.
func NewSim(cfg SimConfig) (*Sim, error) {
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	s := &Sim{
		link:       cfg.Link,
		timingOnly: cfg.TimingOnly,
		virtual:    cfg.Clock == SimVirtualClock,
		start:      time.Now(),
	}
	s.cond.L = &s.mu
	for k := range s.engines {
		s.engines[k] = make([]time.Duration, s.link.engines(CopyKind(k)))
	}
	s.mem.init(cfg.MemoryBytes)
	s.info = cfg.Info
	if s.info.Name == "" {
		s.info = Info{
			Name:          "kvtier simulated device",
			CCMajor:       9,
			CCMinor:       0,
			SMCount:       132,
			CopyEngines:   s.link.engines(HostToDevice) + s.link.engines(DeviceToHost),
			PCIBusID:      "0000:00:00.0",
			NUMANode:      -1,
			DriverVersion: 13000,
			BatchCopy:     true,
			HostNUMAAlloc: true,
		}
	}
	s.info.TotalMemBytes = cfg.MemoryBytes
	s.info.Simulated = true
	if !s.virtual {
		s.kick = make(chan struct{}, 1)
		s.stop = make(chan struct{})
		s.done = make(chan struct{})
		go s.execute()
	}
	return s, nil
}

func (c *SimConfig) validate() error {
	if c.MemoryBytes <= 0 {
		return simConfigError("MemoryBytes", "must be > 0, got %d", c.MemoryBytes)
	}
	if c.Clock >= NumSimClockKinds {
		return simConfigError("Clock", "must be SimWallClock or SimVirtualClock, got %v", c.Clock)
	}
	if c.Info.TotalMemBytes != 0 && c.Info.TotalMemBytes != c.MemoryBytes {
		return simConfigError("Info.TotalMemBytes", "must be 0 or equal MemoryBytes (%d), got %d", c.MemoryBytes, c.Info.TotalMemBytes)
	}
	if c.Info.SMCount < 0 {
		return simConfigError("Info.SMCount", "must be >= 0, got %d", c.Info.SMCount)
	}
	if c.Info.CopyEngines < 0 {
		return simConfigError("Info.CopyEngines", "must be >= 0, got %d", c.Info.CopyEngines)
	}
	return c.Link.validate()
}

// simConfigError names the bad SimConfig field; it matches ErrInvalidValue.
func simConfigError(field, format string, args ...any) error {
	return fmt.Errorf("cudastream: SimConfig.%s: %s: %w", field, fmt.Sprintf(format, args...), ErrInvalidValue)
}

// Info reports the configured facts.
func (s *Sim) Info() Info { return s.info }

// MemGetInfo reports free and total device memory.
func (s *Sim) MemGetInfo() (free, total int64, err error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if err := s.usable("cuMemGetInfo"); err != nil {
		return 0, 0, err
	}
	return s.mem.capacity - s.mem.used, s.mem.capacity, nil
}

// Clock returns the sim's clock.
func (s *Sim) Clock() Clock { return simClock{s} }

type simClock struct{ s *Sim }

func (c simClock) Now() time.Duration {
	c.s.mu.Lock()
	defer c.s.mu.Unlock()
	return c.s.nowLocked()
}

func (s *Sim) nowLocked() time.Duration {
	if s.virtual {
		return s.now
	}
	return time.Since(s.start)
}

// Advance moves the virtual clock forward by d and retires the work that
// ends by then. It fails with ErrNotSupported on the wall clock.
func (s *Sim) Advance(d time.Duration) error {
	if d < 0 {
		return fmt.Errorf("cudastream: sim Advance(%v): negative duration: %w", d, ErrInvalidValue)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if !s.virtual {
		return fmt.Errorf("cudastream: sim Advance: the wall clock cannot be advanced: %w", ErrNotSupported)
	}
	s.now += d
	s.advanceLocked(s.now)
	return nil
}

// AdvanceTo moves the virtual clock to t (a time since the sim started) and
// retires the work that ends by then. t before the current time is an error.
func (s *Sim) AdvanceTo(t time.Duration) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if !s.virtual {
		return fmt.Errorf("cudastream: sim AdvanceTo: the wall clock cannot be advanced: %w", ErrNotSupported)
	}
	if t < s.now {
		return fmt.Errorf("cudastream: sim AdvanceTo(%v): the clock is already at %v: %w", t, s.now, ErrInvalidValue)
	}
	s.now = t
	s.advanceLocked(s.now)
	return nil
}

// NextEvent returns the next time at which the timeline changes on its own
// (an operation starts or ends after the clock's current time), and false
// when nothing is queued. A discrete-event replay that drives the virtual
// clock advances to it, so that it observes every completion at its modelled
// time: AdvanceTo(t) then Query.
func (s *Sim) NextEvent() (time.Duration, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.advanceLocked(s.nowLocked())
	return s.nextEventLocked()
}

// EventTime returns the modelled completion time of the work e captured (a
// time since the sim started), and whether it is known yet. It is known once
// the work has started on the timeline (always after e.Synchronize); it may
// lie after Clock().Now(). An event never recorded reports (0, false).
func (s *Sim) EventTime(e Event) (time.Duration, bool) {
	ev, ok := e.(*simEvent)
	if !ok || ev.sim != s {
		return 0, false
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	s.advanceLocked(s.nowLocked())
	if ev.marker == nil || !ev.marker.known {
		return 0, false
	}
	return ev.marker.time, true
}

// SimLinkStats sums the copies whose start is fixed on the timeline, per
// direction (indexed by CopyKind).
type SimLinkStats struct {
	Copies [NumCopyKinds]int64         // copy operations (a batch counts once)
	Bytes  [NumCopyKinds]int64         // bytes moved or, with TimingOnly, modelled
	Busy   [NumCopyKinds]time.Duration // summed engine time, latencies included
}

// LinkStats returns the link's totals so far, after fixing every start up to
// the clock's current time. Busy divided by the elapsed time and the engine
// count is the engines' utilization.
func (s *Sim) LinkStats() SimLinkStats {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.advanceLocked(s.nowLocked())
	return s.stats
}

// Close stops the sim. Work in flight is abandoned; later calls fail.
func (s *Sim) Close() error {
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		return simError("cuDevicePrimaryCtxRelease", cudaErrorInvalidValue, "sim device already closed")
	}
	s.closed = true
	s.cond.Broadcast()
	s.mu.Unlock()
	if !s.virtual {
		close(s.stop)
		<-s.done
	}
	return nil
}

// usable fails once the sim is closed. Called with s.mu held.
func (s *Sim) usable(call string) error {
	if s.closed {
		return simError(call, cudaErrorInvalidValue, "sim device is closed")
	}
	return nil
}
