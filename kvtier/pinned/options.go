package pinned

import (
	"fmt"
	"slices"
)

// Sizes used throughout.
const (
	KiB = int64(1) << 10
	MiB = int64(1) << 20
	GiB = int64(1) << 30

	smallPageBytes = 4 * KiB
	hugePageBytes  = 2 * MiB

	// DefaultChunkBytes is the unit of registration. Registration holds the
	// process's mmap lock for reading and the Go runtime needs it for
	// writing to grow the heap, so a call must stay short: 1 GiB registers
	// in about 50 ms at the H200's 19.5 GiB/s (design.md).
	DefaultChunkBytes = 1 * GiB
	// MaxChunkBytes: the r580 driver refuses cuMemHostRegister calls of
	// 512 GiB or more (design.md); chunks stay below it.
	MaxChunkBytes = 512*GiB - hugePageBytes
	// MaxSizeBytes bounds a region: 1 PiB and above is refused as absurd
	// before physical memory is even looked at.
	MaxSizeBytes = int64(1) << 50

	// stripeBytes is the unit of work a toucher claims: small enough that
	// the first chunk is ready soon after the start (all touchers work on
	// the leading chunk together), large enough that claiming costs nothing.
	stripeBytes = 8 * MiB
)

// PageMode is the page size backing a region.
type PageMode uint8

const (
	// PagesDefault is PagesTHP. Measured on the H200 (design.md),
	// cuMemHostRegister runs at 33.7 GiB/s on THP memory against 19.5 on
	// 4 KiB pages, and the touch+register pipeline reached 29 GiB/s with THP
	// against 16 with 4 KiB pages: registration, the serial step, does 512
	// times fewer pages.
	PagesDefault PageMode = iota
	// Pages4K: ordinary 4 KiB pages.
	Pages4K
	// PagesTHP: transparent huge pages (MADV_HUGEPAGE on a 2 MiB aligned
	// mapping). Works when /sys/kernel/mm/transparent_hugepage/enabled is
	// "madvise" or "always"; with "never" the kernel silently uses 4 KiB
	// pages, which Stats.PageNote reports.
	PagesTHP
	// PagesHugeTLB: 2 MiB pages from the hugetlb pool (MAP_HUGETLB). Without
	// a pool large enough Alloc fails with ErrNoHugeTLBPool, unless
	// Options.FallbackIfNoHugeTLB names another mode.
	PagesHugeTLB
	NumPageModes
)

func (m PageMode) String() string {
	switch m {
	case PagesDefault:
		return "default"
	case Pages4K:
		return "4KiB"
	case PagesTHP:
		return "THP"
	case PagesHugeTLB:
		return "hugetlb"
	}
	return fmt.Sprintf("PageMode(%d)", uint8(m))
}

// resolve turns PagesDefault into the mode it stands for.
func (m PageMode) resolve() PageMode {
	if m == PagesDefault {
		return PagesTHP
	}
	return m
}

// alignBytes is the alignment chunks (and the mapping) keep in this mode.
func (m PageMode) alignBytes() int64 {
	if m == Pages4K {
		return smallPageBytes
	}
	return hugePageBytes
}

// FaultMethod is how the pages are faulted in before registration.
type FaultMethod uint8

const (
	// FaultDefault is FaultTouch: on the H200, 16 threads touching one byte
	// per page faulted 19 GiB/s against 7.5 GiB/s for MADV_POPULATE_WRITE
	// (design.md).
	FaultDefault FaultMethod = iota
	// FaultTouch writes one byte to every 4 KiB page (every 2 MiB page for
	// hugetlb).
	FaultTouch
	// FaultPopulateWrite asks the kernel with madvise(MADV_POPULATE_WRITE)
	// (Linux 5.14+) for each stripe.
	FaultPopulateWrite
	NumFaultMethods
)

func (f FaultMethod) String() string {
	switch f {
	case FaultDefault:
		return "default"
	case FaultTouch:
		return "touch"
	case FaultPopulateWrite:
		return "populate-write"
	}
	return fmt.Sprintf("FaultMethod(%d)", uint8(f))
}

func (f FaultMethod) resolve() FaultMethod {
	if f == FaultDefault {
		return FaultTouch
	}
	return f
}

// CPUPlan places the pipeline's threads. The zero plan (Touch == nil) means
// derive everything from the machine; a plan with Touch set is used as given.
type CPUPlan struct {
	// Register is the CPU of the registering goroutine.
	Register int
	// Touch lists the touchers' CPUs, one toucher per entry (a CPU may
	// repeat). For example {Register: 15, Touch: []int{0, 1, 2, 3}} runs
	// four touchers on CPUs 0-3 and registers on CPU 15.
	Touch []int
}

// Chunk is one unit of registration.
type Chunk struct {
	Index       int
	OffsetBytes int64
	LengthBytes int64
}

// Options configures Alloc. The zero value is the recommended setting: THP,
// touch faulting, 1 GiB chunks, threads derived from the machine, mlock
// registration, no NUMA binding, VMA naming where the kernel has it, and
// Alloc returning once the whole region is registered.
type Options struct {
	// Registrar registers each chunk for DMA. nil means MlockRegistrar.
	// Pass a cudastream.Device to pin for the GPU.
	Registrar Registrar

	// Pages is the page size; see PageMode.
	Pages PageMode
	// FallbackIfNoHugeTLB is the mode used when Pages is PagesHugeTLB and
	// the pool cannot hold the region. The zero value (PagesDefault) means
	// no fallback: Alloc fails with ErrNoHugeTLBPool.
	FallbackIfNoHugeTLB PageMode

	// Fault is how pages are faulted in; see FaultMethod.
	Fault FaultMethod

	// ChunkBytes is the registration unit: 0 means DefaultChunkBytes. It
	// must be a multiple of 4 KiB (of 2 MiB for THP and hugetlb, so that
	// chunk boundaries never split a huge page) and below MaxChunkBytes.
	// The region's last chunk may be shorter.
	//
	// Each chunk is a separate registration, and the driver refuses a copy
	// that spans two registrations (CUDA_ERROR_INVALID_VALUE, measured on the
	// H200). A caller that carves the region into slots sets ChunkMultiple.
	ChunkBytes int64
	// ChunkMultiple, when positive, makes every chunk boundary fall on a
	// multiple of ChunkMultiple bytes from the region's start, so that no
	// slot of that size straddles two registrations. Example: a host tier of
	// 5 MiB slots sets ChunkMultiple = 5 MiB; with THP pages the chunk
	// becomes the largest multiple of lcm(5 MiB, 2 MiB) = 10 MiB not above
	// ChunkBytes (at least one such multiple).
	ChunkMultiple int64

	// Touchers is how many faulting goroutines to run; 0 means derive it:
	// enough to stay ahead of registration on this machine, and no more
	// (extra touchers take memory bandwidth and core time from the
	// registering thread). Ignored when CPUs.Touch is set.
	Touchers int
	// CPUs places the threads; the zero value derives the plan from the
	// CPU topology in sysfs.
	CPUs CPUPlan

	// NUMANodes binds chunk i to node NUMANodes[i % len(NUMANodes)] with
	// mbind before its pages are faulted, so they are first-touched where
	// they should live. Pass the GPU's node: []int{dev.Info().NUMANode}.
	// nil, a machine with one node, or a list of only -1 (unknown) binds
	// nothing, and Stats.NUMANote says why.
	NUMANodes []int

	// NoVMANames turns off per-chunk VMA names (PR_SET_VMA_ANON_NAME).
	NoVMANames bool

	// Background makes Alloc return as soon as the region is mapped and
	// the pipeline started. Use WaitReady, Wait or OnChunk to learn when
	// bytes are usable. On failure the pipeline stops and Wait returns the
	// error, but the registered prefix stays registered and mapped until
	// Close, since the caller may be using it. The caller MUST call Close.
	Background bool

	// OnChunk is called, from the registering goroutine, after each chunk
	// is registered, in order. It MUST return quickly (registration waits)
	// and MUST NOT call the Region's Close.
	OnChunk func(Chunk)
	// Progress is called, from the registering goroutine, after each chunk
	// is registered, with the bytes faulted and registered so far. It MUST
	// return quickly.
	Progress func(faultedBytes, registeredBytes int64)
}

// plan is Options validated and resolved against size.
type plan struct {
	size       int64
	chunkBytes int64
	chunks     int
	pages      PageMode
	fallback   PageMode
	fault      FaultMethod
	reg        Registrar
}

// chunk returns chunk i's extent.
func (p *plan) chunk(i int) Chunk {
	off := int64(i) * p.chunkBytes
	return Chunk{Index: i, OffsetBytes: off, LengthBytes: min(p.chunkBytes, p.size-off)}
}

// validate checks everything that can be checked without touching the
// machine's memory, and fills in defaults. physBytes is the machine's RAM.
func validate(size int64, o *Options, physBytes uint64) (plan, error) {
	p := plan{size: size, reg: o.Registrar}
	if p.reg == nil {
		p.reg = MlockRegistrar{}
	}
	if o.Pages >= NumPageModes {
		return p, fmt.Errorf("%w: Pages = %d, want one of default, 4KiB, THP, hugetlb", ErrInvalidOptions, o.Pages)
	}
	if o.FallbackIfNoHugeTLB >= NumPageModes || o.FallbackIfNoHugeTLB == PagesHugeTLB {
		return p, fmt.Errorf("%w: FallbackIfNoHugeTLB = %v, want default (none), 4KiB or THP", ErrInvalidOptions, o.FallbackIfNoHugeTLB)
	}
	if o.Fault >= NumFaultMethods {
		return p, fmt.Errorf("%w: Fault = %d, want one of default, touch, populate-write", ErrInvalidOptions, o.Fault)
	}
	p.pages, p.fallback, p.fault = o.Pages.resolve(), o.FallbackIfNoHugeTLB, o.Fault.resolve()

	switch {
	case size <= 0:
		return p, fmt.Errorf("%w: %d bytes: must be positive", ErrInvalidSize, size)
	case size >= MaxSizeBytes:
		return p, fmt.Errorf("%w: %d bytes: absurd (1 PiB or more)", ErrInvalidSize, size)
	case physBytes > 0 && uint64(size) > physBytes:
		return p, fmt.Errorf("%w: %d bytes is more than the machine's physical memory (%d bytes)", ErrInvalidSize, size, physBytes)
	case size%smallPageBytes != 0:
		return p, fmt.Errorf("%w: %d bytes is not a multiple of the %d-byte page", ErrInvalidSize, size, smallPageBytes)
	case p.pages == PagesHugeTLB && size%hugePageBytes != 0 && p.fallback == PagesDefault:
		return p, fmt.Errorf("%w: %d bytes is not a multiple of the %d-byte hugetlb page", ErrInvalidSize, size, hugePageBytes)
	}

	p.chunkBytes = o.ChunkBytes
	if p.chunkBytes == 0 {
		p.chunkBytes = DefaultChunkBytes
	}
	align := p.pages.alignBytes()
	switch {
	case p.chunkBytes < 0:
		return p, fmt.Errorf("%w: ChunkBytes = %d: must not be negative", ErrInvalidOptions, p.chunkBytes)
	case p.chunkBytes > MaxChunkBytes:
		return p, fmt.Errorf("%w: ChunkBytes = %d: must be below 512 GiB (the driver's limit per registration)", ErrInvalidOptions, p.chunkBytes)
	case p.chunkBytes%align != 0:
		return p, fmt.Errorf("%w: ChunkBytes = %d: must be a multiple of %d bytes for %v pages", ErrInvalidOptions, p.chunkBytes, align, p.pages)
	}
	if m := o.ChunkMultiple; m != 0 {
		if m < 0 || m >= MaxChunkBytes {
			return p, fmt.Errorf("%w: ChunkMultiple = %d: want 0 (none) or a positive size below 512 GiB", ErrInvalidOptions, m)
		}
		unit := lcm(m, align)
		if unit > MaxChunkBytes {
			return p, fmt.Errorf("%w: ChunkMultiple = %d: lcm with the %d-byte page alignment is %d bytes, past the 512 GiB registration limit", ErrInvalidOptions, m, align, unit)
		}
		p.chunkBytes = max(p.chunkBytes/unit, 1) * unit
	}
	p.chunkBytes = min(p.chunkBytes, size)
	p.chunks = int((size + p.chunkBytes - 1) / p.chunkBytes)

	if o.Touchers < 0 || o.Touchers > 4096 {
		return p, fmt.Errorf("%w: Touchers = %d: want 0 (derive) to 4096", ErrInvalidOptions, o.Touchers)
	}
	if o.CPUs.Touch != nil {
		if len(o.CPUs.Touch) == 0 {
			return p, fmt.Errorf("%w: CPUs.Touch is empty: want nil (derive) or at least one CPU", ErrInvalidOptions)
		}
		for _, c := range append([]int{o.CPUs.Register}, o.CPUs.Touch...) {
			if c < 0 || c >= 8192 {
				return p, fmt.Errorf("%w: CPUs names CPU %d: out of range", ErrInvalidOptions, c)
			}
		}
	}
	for i, n := range o.NUMANodes {
		if n < -1 || n >= 1024 {
			return p, fmt.Errorf("%w: NUMANodes[%d] = %d: want a node number or -1 (unknown)", ErrInvalidOptions, i, n)
		}
	}
	return p, nil
}

// checkCPUs verifies an explicit plan against the CPUs the process may use.
func checkCPUs(cp CPUPlan, allowed []int) error {
	for _, c := range append([]int{cp.Register}, cp.Touch...) {
		if !slices.Contains(allowed, c) {
			return fmt.Errorf("%w: CPUs names CPU %d, which this process may not run on (allowed: %v)", ErrInvalidOptions, c, allowed)
		}
	}
	return nil
}

func gcd(a, b int64) int64 {
	for b != 0 {
		a, b = b, a%b
	}
	return a
}

func lcm(a, b int64) int64 { return a / gcd(a, b) * b }
