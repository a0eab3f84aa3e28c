package pinned

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"os"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"
	"unsafe"

	"kvtier.dev/kvtier/pinned/internal/sys"
)

// Region owns one pinned mapping: its pages, its registration and its
// address range. The caller MUST call Close when done; using Bytes after
// Close is a use-after-free that crashes the process.
type Region struct {
	s *state
}

// state is everything a Region owns. It is separate from Region so that a
// cleanup attached to the Region (a safety net for a forgotten Close) can
// release it.
type state struct {
	p     plan
	start time.Time

	base     unsafe.Pointer // the region's first byte
	mapBase  unsafe.Pointer // what to munmap (the region, after trimming)
	mapBytes uintptr

	onChunk  func(Chunk)
	progress func(faultedBytes, registeredBytes int64)

	chunkReady []chan struct{} // closed once chunk i is registered
	ready      atomic.Int64    // leading bytes registered
	faulted    atomic.Int64
	registered int // chunks registered; owned by the pipeline until done closes

	done   chan struct{} // closed when the pipeline has stopped
	err    error         // the pipeline's failure; read after done
	cancel context.CancelCauseFunc

	mu    sync.Mutex
	stats Stats

	closed    atomic.Bool
	closeOnce sync.Once
	closeErr  error
}

// Alloc returns a region of size bytes, page-locked and registered with
// opts.Registrar, chunk by chunk. size must be a multiple of 4 KiB (of
// 2 MiB for hugetlb pages), positive, below 1 PiB and no more than physical
// memory. ctx bounds the whole allocation, the background part included.
//
// Unless opts.Background is set, Alloc returns once every chunk is
// registered, or fails having released everything, with a *ChunkError
// naming the chunk, the stage and the cause.
func Alloc(ctx context.Context, size int64, opts Options) (*Region, error) {
	start := time.Now()
	phys, err := sys.PhysicalMemoryBytes()
	if err != nil {
		return nil, fmt.Errorf("pinned: %w", err)
	}
	p, err := validate(size, &opts, phys)
	if err != nil {
		return nil, err
	}
	allowed, err := sys.AllowedCPUs()
	if err != nil {
		return nil, fmt.Errorf("pinned: %w", err)
	}
	cpus, cpuNote := opts.CPUs, "as given in Options.CPUs"
	if cpus.Touch != nil {
		if err := checkCPUs(cpus, allowed); err != nil {
			return nil, err
		}
	}
	nodes, numaNote, err := chooseNodes(opts.NUMANodes)
	if err != nil {
		return nil, err
	}
	if err := context.Cause(ctx); ctx.Err() != nil {
		return nil, fmt.Errorf("pinned: allocation of %d bytes not started: %w", size, err)
	}

	s := &state{
		p: p, start: start, onChunk: opts.OnChunk, progress: opts.Progress,
		chunkReady: make([]chan struct{}, p.chunks),
		done:       make(chan struct{}),
	}
	for i := range s.chunkReady {
		s.chunkReady[i] = make(chan struct{})
	}
	s.stats = Stats{
		SizeBytes: size, ChunkBytes: p.chunkBytes, Chunks: p.chunks,
		PageModeAsked: opts.Pages, Fault: p.fault,
		NUMANote: numaNote,
	}
	if err := s.mapRegion(); err != nil {
		return nil, err
	}
	if cpus.Touch == nil {
		// From the page mode the mapping got (a hugetlb fallback to 4 KiB
		// pages needs about twice the touchers), not the one asked for.
		cpus, cpuNote = derivePlan(readTopology(allowed), s.stats.PageMode, opts.Touchers)
	}
	s.stats.Touchers, s.stats.TouchCPUs, s.stats.RegisterCPU, s.stats.CPUNote = len(cpus.Touch), cpus.Touch, cpus.Register, cpuNote
	if err := s.prepareChunks(nodes, !opts.NoVMANames); err != nil {
		return nil, errors.Join(err, sys.Munmap(s.mapBase, s.mapBytes))
	}
	s.stats.MapTime = time.Since(start)

	var pctx context.Context
	pctx, s.cancel = context.WithCancelCause(ctx)
	go s.run(pctx, cpus)

	r := &Region{s: s}
	if !opts.Background {
		<-s.done
		if s.err != nil {
			return nil, errors.Join(s.err, s.release())
		}
	}
	runtime.AddCleanup(r, func(s *state) { s.release() }, s)
	return r, nil
}

// Bytes returns the whole region. Only the first ReadyBytes are registered
// while a background allocation runs. nil after Close. The slice does not
// keep the Region alive: the caller MUST keep the Region (and Close it) for
// as long as the bytes are used.
func (r *Region) Bytes() []byte {
	if r.s.closed.Load() {
		return nil
	}
	return unsafe.Slice((*byte)(r.s.base), r.s.p.size)
}

// ChunkBytes is the registration unit: chunk i is Bytes()[i*ChunkBytes:]
// up to the next chunk or the end. Each chunk is a separate registration,
// and a single copy MUST NOT span two of them: the driver refuses it with
// CUDA_ERROR_INVALID_VALUE. Options.ChunkMultiple keeps slots inside chunks.
func (r *Region) ChunkBytes() int64 { return r.s.p.chunkBytes }

// Size is the region's length in bytes.
func (r *Region) Size() int64 { return r.s.p.size }

// ReadyBytes is how many leading bytes are registered. It only grows
// (until Close, after which it is 0).
func (r *Region) ReadyBytes() int64 { return r.s.ready.Load() }

// WaitReady blocks until the first n bytes are registered, ctx is done, or
// the allocation failed (its error is returned; bytes already ready stay
// usable until Close).
func (r *Region) WaitReady(ctx context.Context, n int64) error {
	s := r.s
	if n < 0 || n > s.p.size {
		return fmt.Errorf("%w: WaitReady(%d): want 0 to the region's %d bytes", ErrInvalidSize, n, s.p.size)
	}
	if s.closed.Load() {
		return ErrClosed
	}
	if n == 0 || s.ready.Load() >= n {
		return nil
	}
	c := int((n - 1) / s.p.chunkBytes)
	select {
	case <-s.chunkReady[c]:
		return nil
	case <-s.done:
		if s.ready.Load() >= n {
			return nil
		}
		if s.closed.Load() {
			return ErrClosed
		}
		return s.err
	case <-ctx.Done():
		return context.Cause(ctx)
	}
}

// Wait blocks until the whole region is registered, and returns the
// allocation's error if it failed.
func (r *Region) Wait(ctx context.Context) error { return r.WaitReady(ctx, r.s.p.size) }

// Err returns the allocation's failure, or nil while it runs or once it
// succeeded.
func (r *Region) Err() error {
	select {
	case <-r.s.done:
		return r.s.err
	default:
		return nil
	}
}

// Stats reports how the region was made. While a background allocation
// runs, the times are zero and the byte counts are live.
func (r *Region) Stats() Stats {
	s := r.s
	s.mu.Lock()
	st := s.stats
	s.mu.Unlock()
	st.TouchCPUs = append([]int(nil), st.TouchCPUs...)
	st.NUMANodes = append([]int(nil), st.NUMANodes...)
	st.FaultedBytes = s.faulted.Load()
	st.RegisteredBytes = s.ready.Load()
	return st
}

// Close stops a running allocation, unregisters every registered chunk
// (last first), and unmaps the region. It is safe to call more than once;
// later calls return the first call's result.
func (r *Region) Close() error { return r.s.release() }

// HugePageBytes reports how much of the region is backed by huge pages now
// (AnonHugePages and hugetlb pages in /proc/self/smaps). It walks the page
// tables, so it is for reports, not hot paths.
func (r *Region) HugePageBytes() (int64, error) {
	s := r.s
	if s.closed.Load() {
		return 0, ErrClosed
	}
	lo := uint64(uintptr(s.base))
	hi := lo + uint64(s.p.size)
	f, err := os.Open("/proc/self/smaps")
	if err != nil {
		return 0, err
	}
	defer f.Close()
	var total int64
	in := false
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		line := sc.Text()
		if a, b, ok := parseMapsRange(line); ok {
			in = a >= lo && b <= hi
			continue
		}
		if !in {
			continue
		}
		name, rest, ok := strings.Cut(line, ":")
		if !ok || (name != "AnonHugePages" && name != "Private_Hugetlb" && name != "Shared_Hugetlb") {
			continue
		}
		if fs := strings.Fields(rest); len(fs) > 0 {
			if v, err := strconv.ParseInt(fs[0], 10, 64); err == nil {
				total += v * KiB
			}
		}
	}
	return total, sc.Err()
}

// parseMapsRange parses the "start-end" that opens a /proc/*/maps line.
func parseMapsRange(line string) (lo, hi uint64, ok bool) {
	field, _, _ := strings.Cut(line, " ")
	a, b, found := strings.Cut(field, "-")
	if !found {
		return 0, 0, false
	}
	lo, err1 := strconv.ParseUint(a, 16, 64)
	hi, err2 := strconv.ParseUint(b, 16, 64)
	return lo, hi, err1 == nil && err2 == nil
}

// slice returns chunk c's bytes.
func (s *state) slice(c Chunk) []byte {
	return unsafe.Slice((*byte)(unsafe.Add(s.base, c.OffsetBytes)), c.LengthBytes)
}

// testHookCancelled, when set by a test, runs in Close after the pipeline
// was told to stop and before Close waits for it.
var testHookCancelled func()

// release stops the pipeline, unregisters and unmaps. Once only.
func (s *state) release() error {
	s.closeOnce.Do(func() {
		s.closed.Store(true)
		if s.cancel != nil {
			s.cancel(ErrClosed)
			if testHookCancelled != nil {
				testHookCancelled()
			}
			<-s.done
		}
		var errs []error
		for c := s.registered - 1; c >= 0; c-- {
			ch := s.p.chunk(c)
			if err := s.p.reg.HostUnregister(s.slice(ch)); err != nil {
				errs = append(errs, fmt.Errorf("pinned: unregister chunk %d (offset %d, %d bytes): %w",
					c, ch.OffsetBytes, ch.LengthBytes, err))
			}
		}
		s.registered = 0
		s.ready.Store(0)
		if err := sys.Munmap(s.mapBase, s.mapBytes); err != nil {
			errs = append(errs, fmt.Errorf("pinned: %w", err))
		}
		s.closeErr = errors.Join(errs...)
	})
	return s.closeErr
}
