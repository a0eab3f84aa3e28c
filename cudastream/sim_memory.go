package cudastream

import "fmt"

// Device memory of the sim: a fake address space where every allocation is
// a []byte. Addresses are handed out upward and never reused, with a guard
// gap after each allocation, so a stale or overrunning address never lands
// in another allocation: it is reported as use after free or as out of
// bounds, never silently accepted.

const (
	simDeviceBase  = 0x7f00_0000_0000 // first device address; never 0
	simAllocAlign  = 256              // cuMemAlloc's alignment
	simGuardBytes  = 256              // unmapped gap after each allocation
	simMaxRegister = 512 << 30        // the driver refuses registrations this big (r580)
)

type simAlloc struct {
	addr     uint64
	size     int64
	rounded  int64  // size rounded up to simAllocAlign, counted against capacity
	data     []byte // nil with TimingOnly, and after Free
	freed    bool
	inflight int // queued copy spans touching it
}

type simHostKind uint8

const (
	simHostRegistered simHostKind = iota // HostRegister
	simHostAllocated                     // HostAlloc
	simHostVMM                           // HostAllocVMM
)

func (k simHostKind) String() string {
	switch k {
	case simHostRegistered:
		return "HostRegister"
	case simHostAllocated:
		return "HostAlloc"
	}
	return "HostAllocVMM"
}

// simHostRange is pinned host memory: [start, start+len(buf)).
type simHostRange struct {
	start    uint64
	buf      []byte
	kind     simHostKind
	gone     bool // unregistered or freed
	inflight int
}

func (r *simHostRange) end() uint64 { return r.start + uint64(len(r.buf)) }

type simMemory struct {
	capacity int64
	used     int64
	next     uint64
	allocs   []*simAlloc     // sorted by addr (addresses only grow); freed ones stay
	hosts    []*simHostRange // sorted by start, live ranges only
}

func (m *simMemory) init(capacity int64) {
	m.capacity = capacity
	m.next = simDeviceBase
}

// findAlloc returns the allocation whose [addr, addr+size) holds a, or the
// index where it would be and nil.
func (m *simMemory) findAlloc(a uint64) *simAlloc {
	lo, hi := 0, len(m.allocs) // first index with addr > a
	for lo < hi {
		mid := int(uint(lo+hi) >> 1)
		if m.allocs[mid].addr <= a {
			lo = mid + 1
		} else {
			hi = mid
		}
	}
	if lo == 0 {
		return nil
	}
	al := m.allocs[lo-1]
	if a-al.addr >= uint64(al.size) {
		return nil
	}
	return al
}

// resolve checks that [p, p+n) lies inside one live allocation.
func (m *simMemory) resolve(call string, p DevicePtr, n int64) (*simAlloc, int64, error) {
	al := m.findAlloc(uint64(p))
	if al == nil {
		return nil, 0, simError(call, cudaErrorInvalidValue, "device address %#x is not in any allocation", uint64(p))
	}
	if al.freed {
		return nil, 0, simError(call, cudaErrorIllegalAddress, "device address %#x is in allocation %#x, already freed", uint64(p), al.addr)
	}
	off := int64(uint64(p) - al.addr)
	if n > al.size-off {
		return nil, 0, simError(call, cudaErrorInvalidValue, "copy of %d bytes at device address %#x runs past the end of allocation %#x (%d bytes, offset %d)", n, uint64(p), al.addr, al.size, off)
	}
	return al, off, nil
}

// findHost returns the live pinned range holding [a, a+n), or nil.
func (m *simMemory) findHost(a uint64, n int64) *simHostRange {
	lo, hi := 0, len(m.hosts)
	for lo < hi {
		mid := int(uint(lo+hi) >> 1)
		if m.hosts[mid].start <= a {
			lo = mid + 1
		} else {
			hi = mid
		}
	}
	if lo == 0 {
		return nil
	}
	r := m.hosts[lo-1]
	if a >= r.end() || uint64(n) > r.end()-a {
		return nil
	}
	return r
}

// hostSlice returns the bytes of [a, a+n) from a pinned range.
func (m *simMemory) hostSlice(call string, a uint64, n int64) (*simHostRange, []byte, error) {
	r := m.findHost(a, n)
	if r == nil {
		return nil, nil, simError(call, cudaErrorNotRegistered, "host range [%#x, +%d) is not inside registered, HostAlloc'd or VMM host memory (the sim batches only from pinned memory)", a, n)
	}
	off := a - r.start
	return r, r.buf[off : off+uint64(n) : off+uint64(n)], nil
}

// addHost inserts r, failing if it overlaps a live range.
func (m *simMemory) addHost(call string, r *simHostRange) error {
	i := 0
	for i < len(m.hosts) && m.hosts[i].start < r.start {
		i++
	}
	if i > 0 && m.hosts[i-1].end() > r.start {
		o := m.hosts[i-1]
		return simError(call, cudaErrorAlreadyRegistered, "host range [%#x, +%d) overlaps %s range [%#x, +%d)", r.start, len(r.buf), o.kind, o.start, len(o.buf))
	}
	if i < len(m.hosts) && m.hosts[i].start < r.end() {
		o := m.hosts[i]
		return simError(call, cudaErrorAlreadyRegistered, "host range [%#x, +%d) overlaps %s range [%#x, +%d)", r.start, len(r.buf), o.kind, o.start, len(o.buf))
	}
	m.hosts = append(m.hosts, nil)
	copy(m.hosts[i+1:], m.hosts[i:])
	m.hosts[i] = r
	return nil
}

// removeHost removes the live range starting at the slice b, of kind k.
func (m *simMemory) removeHost(call string, b []byte, k simHostKind, code int) (*simHostRange, error) {
	a := HostAddr(b)
	for i, r := range m.hosts {
		if r.start != a || len(b) == 0 {
			continue
		}
		if r.kind != k {
			return nil, simError(call, code, "host range [%#x, +%d) came from %s, not %s", a, len(b), r.kind, k)
		}
		if len(r.buf) != len(b) {
			return nil, simError(call, cudaErrorInvalidValue, "host range at %#x has %d bytes, the call passed %d", a, len(r.buf), len(b))
		}
		m.hosts = append(m.hosts[:i], m.hosts[i+1:]...)
		r.gone = true
		return r, nil
	}
	return nil, simError(call, code, "host range [%#x, +%d) was not obtained from %s", a, len(b), k)
}

// Alloc allocates size bytes of device memory, 256-byte aligned.
func (s *Sim) Alloc(size int64) (DevicePtr, error) {
	const call = "cuMemAlloc"
	s.mu.Lock()
	defer s.mu.Unlock()
	if err := s.usable(call); err != nil {
		return 0, err
	}
	if size <= 0 {
		return 0, simError(call, cudaErrorInvalidValue, "size %d bytes: must be > 0", size)
	}
	m := &s.mem
	rounded := (size + simAllocAlign - 1) &^ (simAllocAlign - 1)
	if rounded < size || rounded > m.capacity-m.used {
		return 0, simError(call, cudaErrorOutOfMemory, "%d bytes requested, %d of %d free", size, m.capacity-m.used, m.capacity)
	}
	al := &simAlloc{addr: m.next, size: size, rounded: rounded}
	if !s.timingOnly {
		al.data = make([]byte, size)
	}
	m.next += uint64(rounded) + simGuardBytes
	m.used += rounded
	m.allocs = append(m.allocs, al)
	return DevicePtr(al.addr), nil
}

// Free releases an allocation. If queued copies still touch it, their
// streams fault with ErrIllegalAddress (reported by their next Query or
// Synchronize) and those copies move no data.
func (s *Sim) Free(p DevicePtr) error {
	const call = "cuMemFree"
	s.mu.Lock()
	defer s.mu.Unlock()
	if err := s.usable(call); err != nil {
		return err
	}
	al := s.mem.findAlloc(uint64(p))
	if al == nil || al.addr != uint64(p) {
		return simError(call, cudaErrorInvalidValue, "device address %#x was not returned by Alloc", uint64(p))
	}
	if al.freed {
		return simError(call, cudaErrorInvalidValue, "device address %#x already freed", uint64(p))
	}
	al.freed = true
	al.data = nil
	s.mem.used -= al.rounded
	if al.inflight > 0 {
		s.faultQueued(al, nil, fmt.Sprintf("allocation %#x freed by cuMemFree while a queued copy still used it", al.addr))
	}
	return nil
}

// HostRegister records b as pinned memory (cuMemHostRegister).
func (s *Sim) HostRegister(b []byte) error {
	const call = "cuMemHostRegister"
	s.mu.Lock()
	defer s.mu.Unlock()
	if err := s.usable(call); err != nil {
		return err
	}
	if len(b) == 0 {
		return simError(call, cudaErrorInvalidValue, "empty host range")
	}
	if int64(len(b)) >= simMaxRegister {
		return simError(call, cudaErrorInvalidValue, "host range of %d bytes: the driver refuses 512 GiB or more in one call; register in chunks", len(b))
	}
	return s.mem.addHost(call, &simHostRange{start: HostAddr(b), buf: b, kind: simHostRegistered})
}

// HostUnregister undoes HostRegister for exactly the same range.
func (s *Sim) HostUnregister(b []byte) error {
	const call = "cuMemHostUnregister"
	s.mu.Lock()
	defer s.mu.Unlock()
	if err := s.usable(call); err != nil {
		return err
	}
	r, err := s.mem.removeHost(call, b, simHostRegistered, cudaErrorNotRegistered)
	if err != nil {
		return err
	}
	if r.inflight > 0 {
		s.faultQueued(nil, r, fmt.Sprintf("host range %#x unregistered while a queued copy still used it", r.start))
	}
	return nil
}

// HostAlloc returns size bytes of pinned host memory.
func (s *Sim) HostAlloc(size int64) ([]byte, error) {
	return s.hostAlloc("cuMemHostAlloc", size, simHostAllocated)
}

func (s *Sim) hostAlloc(call string, size int64, kind simHostKind) ([]byte, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if err := s.usable(call); err != nil {
		return nil, err
	}
	if size <= 0 || size >= simMaxRegister {
		return nil, simError(call, cudaErrorInvalidValue, "size %d bytes: must be in (0, 512 GiB)", size)
	}
	b := make([]byte, size)
	if err := s.mem.addHost(call, &simHostRange{start: HostAddr(b), buf: b, kind: kind}); err != nil {
		return nil, err
	}
	return b, nil
}

// HostFree frees memory from HostAlloc.
func (s *Sim) HostFree(b []byte) error {
	return s.hostFree("cuMemFreeHost", b, simHostAllocated)
}

func (s *Sim) hostFree(call string, b []byte, kind simHostKind) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if err := s.usable(call); err != nil {
		return err
	}
	r, err := s.mem.removeHost(call, b, kind, cudaErrorInvalidValue)
	if err != nil {
		return err
	}
	if r.inflight > 0 {
		s.faultQueued(nil, r, fmt.Sprintf("pinned host memory %#x freed while a queued copy still used it", r.start))
	}
	return nil
}

// HostAllocVMM returns pinned host memory as the VMM path would; numaNode is
// checked (>= -1) and otherwise ignored.
func (s *Sim) HostAllocVMM(size int64, numaNode int) (VMMHost, error) {
	if numaNode < -1 {
		return nil, simError("cuMemCreate", cudaErrorInvalidValue, "NUMA node %d", numaNode)
	}
	b, err := s.hostAlloc("cuMemCreate", size, simHostVMM)
	if err != nil {
		return nil, err
	}
	return &simVMMHost{sim: s, b: b}, nil
}

type simVMMHost struct {
	sim *Sim
	b   []byte
}

func (v *simVMMHost) Bytes() []byte { return v.b }

func (v *simVMMHost) Close() error { return v.sim.hostFree("cuMemRelease", v.b, simHostVMM) }
