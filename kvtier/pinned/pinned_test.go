package pinned

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"unsafe"

	"kvtier.dev/kvtier/pinned/internal/sys"
)

func TestAllocModes(t *testing.T) {
	const size = 24 * MiB
	for _, pages := range []PageMode{Pages4K, PagesTHP, PagesDefault} {
		for _, fault := range []FaultMethod{FaultTouch, FaultPopulateWrite} {
			t.Run(pages.String()+"/"+fault.String(), func(t *testing.T) {
				before := vmLckBytes(t)
				r, err := Alloc(context.Background(), size, Options{Pages: pages, Fault: fault, ChunkBytes: 4 * MiB})
				if err != nil {
					t.Fatal(err)
				}
				b := r.Bytes()
				lo := addrOf(b)
				if int64(len(b)) != size || r.ReadyBytes() != size || r.Size() != size {
					t.Fatalf("len %d, ready %d, size %d; want %d", len(b), r.ReadyBytes(), r.Size(), size)
				}
				n, err := sys.ResidentPages(unsafe.Pointer(&b[0]), uintptr(size), uintptr(smallPageBytes))
				if err != nil || n != int(size/smallPageBytes) {
					t.Fatalf("%d of %d pages resident (%v)", n, size/smallPageBytes, err)
				}
				if got := vmLckBytes(t) - before; got < size {
					t.Errorf("VmLck grew by %d bytes, want at least %d", got, size)
				}
				b[0], b[size-1] = 1, 2 // the memory is ours to write
				st := r.Stats()
				if st.PageMode != pages.resolve() || st.Fault != fault || st.Chunks != 6 || st.RegisteredBytes != size || st.FaultedBytes != size {
					t.Errorf("stats %+v", st)
				}
				if st.Touchers < 1 || st.TotalTime <= 0 || st.TouchTime <= 0 || st.RegisterBusyTime <= 0 || st.TotalGiBPerSec() <= 0 {
					t.Errorf("stats times %+v", st)
				}
				if pages.resolve() == PagesTHP && lo%uint64(hugePageBytes) != 0 {
					t.Errorf("THP region at %#x is not 2 MiB aligned", lo)
				}
				huge, err := r.HugePageBytes()
				if err != nil {
					t.Fatal(err)
				}
				if pages == Pages4K && huge != 0 {
					t.Errorf("4 KiB mode has %d bytes of huge pages", huge)
				}
				t.Logf("huge pages %d MiB; %s; touch %.2f GiB/s, register %.2f GiB/s, total %.2f GiB/s",
					huge/MiB, st.CPUNote, st.TouchGiBPerSec(), st.RegisterGiBPerSec(), st.TotalGiBPerSec())
				if err := r.Close(); err != nil {
					t.Fatal(err)
				}
				if err := r.Close(); err != nil {
					t.Fatalf("second Close: %v", err)
				}
				if r.Bytes() != nil || r.ReadyBytes() != 0 {
					t.Error("Bytes or ReadyBytes after Close")
				}
				checkCleanedUp(t, lo, size, before)
			})
		}
	}
}

func TestChunksRegisteredInOrder(t *testing.T) {
	const chunk = 2 * MiB
	const size = 5*chunk + 12*KiB // the last chunk is short
	f := newFake()
	var onChunk []Chunk
	var lastReg int64
	r, err := Alloc(context.Background(), size, Options{
		Registrar: f, Pages: Pages4K, ChunkBytes: chunk, Touchers: 3,
		OnChunk: func(c Chunk) { onChunk = append(onChunk, c) },
		Progress: func(faulted, registered int64) {
			if registered < lastReg || faulted < registered || registered > size {
				t.Errorf("progress went faulted %d registered %d after registered %d", faulted, registered, lastReg)
			}
			lastReg = registered
		},
	})
	if err != nil {
		t.Fatal(err)
	}
	base := addrOf(r.Bytes())
	calls := f.snapshot()
	if len(calls) != 6 || len(onChunk) != 6 {
		t.Fatalf("%d register calls, %d OnChunk calls; want 6", len(calls), len(onChunk))
	}
	next := base
	for i, c := range calls {
		if !c.register || c.addr != next || c.n > chunk || c.n <= 0 {
			t.Errorf("call %d: %+v, want a registration at %#x of at most %d bytes", i, c, next, chunk)
		}
		if oc := onChunk[i]; oc.Index != i || base+uint64(oc.OffsetBytes) != c.addr || oc.LengthBytes != c.n {
			t.Errorf("OnChunk %d = %+v, registration %+v", i, oc, c)
		}
		next = c.addr + uint64(c.n)
	}
	if next != base+uint64(size) || lastReg != size {
		t.Errorf("registrations end at %#x (progress %d), want %#x", next, lastReg, base+uint64(size))
	}
	before := vmLckBytes(t) - size
	if err := r.Close(); err != nil {
		t.Fatal(err)
	}
	calls = f.snapshot()[6:]
	for i, c := range calls { // unregistered last first, exactly the registered ranges
		want := f.snapshot()[5-i]
		if c.register || c.addr != want.addr || c.n != want.n {
			t.Errorf("unregister %d = %+v, want the range of %+v", i, c, want)
		}
	}
	checkCleanedUp(t, base, size, before)
}

func TestRegistrationFailureCleansUp(t *testing.T) {
	const chunk = 2 * MiB
	before := vmLckBytes(t)
	f := newFake()
	f.failAt = 2
	r, err := Alloc(context.Background(), 5*chunk, Options{Registrar: f, Pages: Pages4K, ChunkBytes: chunk})
	if r != nil {
		t.Fatal("a region came back with the error")
	}
	var ce *ChunkError
	if !errors.As(err, &ce) || !errors.Is(err, errInjected) {
		t.Fatalf("error %v, want a *ChunkError wrapping the injected failure", err)
	}
	if ce.Index != 2 || ce.OffsetBytes != 2*chunk || ce.LengthBytes != chunk || ce.Stage != StageRegister || ce.Chunks != 5 {
		t.Errorf("chunk error %+v", ce)
	}
	for _, want := range []string{"register chunk 2 of 5", "offset 4194304", "2097152 bytes", errInjected.Error()} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error %q does not say %q", err, want)
		}
	}
	calls := f.snapshot()
	if len(calls) != 4 || calls[2].register || calls[3].register || calls[2].addr != calls[1].addr || calls[3].addr != calls[0].addr {
		t.Fatalf("calls %+v: want chunks 0 and 1 registered, then unregistered last first", calls)
	}
	checkCleanedUp(t, calls[0].addr, 5*chunk, before)
}

func TestCancellationCleansUp(t *testing.T) {
	const chunk = 2 * MiB
	before := vmLckBytes(t)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	f := newFake()
	f.before = func(i int) {
		if i == 2 {
			cancel() // chunk 2 still registers; chunk 3 must not
		}
	}
	_, err := Alloc(ctx, 6*chunk, Options{Registrar: f, Pages: PagesTHP, ChunkBytes: chunk})
	var ce *ChunkError
	if !errors.Is(err, context.Canceled) || !errors.As(err, &ce) || ce.Index != 3 || ce.Stage != StageWait {
		t.Fatalf("error %v, want a cancellation at chunk 3", err)
	}
	calls := f.snapshot()
	if len(calls) != 6 {
		t.Fatalf("calls %+v: want 3 registrations and 3 unregistrations", calls)
	}
	checkCleanedUp(t, calls[0].addr, 6*chunk, before)

	// Cancelled before the start: nothing is mapped.
	if _, err := Alloc(ctx, 6*chunk, Options{Registrar: f}); !errors.Is(err, context.Canceled) || !strings.Contains(err.Error(), "not started") {
		t.Errorf("Alloc with a cancelled context: %v", err)
	}
}

func TestBackgroundWaitReady(t *testing.T) {
	const chunk = 2 * MiB
	const size = 4 * chunk
	before := vmLckBytes(t)
	f := newFake()
	f.gate = make(chan struct{})
	r, err := Alloc(context.Background(), size, Options{Registrar: f, Pages: Pages4K, ChunkBytes: chunk, Background: true})
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	ctx := context.Background()
	cancelled, cancel := context.WithCancel(ctx)
	cancel()

	if err := r.WaitReady(ctx, 0); err != nil || r.ReadyBytes() != 0 || r.Err() != nil {
		t.Fatalf("WaitReady(0) = %v, ReadyBytes %d, Err %v", err, r.ReadyBytes(), r.Err())
	}
	if err := r.WaitReady(cancelled, 1); !errors.Is(err, context.Canceled) {
		t.Fatalf("WaitReady with nothing registered and a cancelled context = %v", err)
	}
	f.gate <- struct{}{} // let chunk 0 register
	if err := r.WaitReady(ctx, chunk); err != nil || r.ReadyBytes() != chunk {
		t.Fatalf("WaitReady(chunk) = %v, ReadyBytes %d", err, r.ReadyBytes())
	}
	r.Bytes()[chunk-1] = 7 // the ready prefix is usable
	if err := r.WaitReady(cancelled, chunk+1); !errors.Is(err, context.Canceled) {
		t.Fatalf("WaitReady(chunk+1) while chunk 1 is held = %v", err)
	}
	if err := r.WaitReady(ctx, size+1); !errors.Is(err, ErrInvalidSize) {
		t.Errorf("WaitReady past the end = %v", err)
	}
	if err := r.WaitReady(ctx, -1); !errors.Is(err, ErrInvalidSize) {
		t.Errorf("WaitReady(-1) = %v", err)
	}
	close(f.gate)
	if err := r.Wait(ctx); err != nil || r.ReadyBytes() != size || r.Err() != nil {
		t.Fatalf("Wait = %v, ReadyBytes %d", err, r.ReadyBytes())
	}
	lo := addrOf(r.Bytes())
	if err := r.Close(); err != nil {
		t.Fatal(err)
	}
	if err := r.WaitReady(ctx, 1); !errors.Is(err, ErrClosed) {
		t.Errorf("WaitReady after Close = %v", err)
	}
	checkCleanedUp(t, lo, size, before)
}

func TestBackgroundFailureKeepsPrefixUntilClose(t *testing.T) {
	const chunk = 2 * MiB
	before := vmLckBytes(t)
	f := newFake()
	f.failAt = 1
	r, err := Alloc(context.Background(), 3*chunk, Options{Registrar: f, Pages: Pages4K, ChunkBytes: chunk, Background: true})
	if err != nil {
		t.Fatal(err)
	}
	err = r.Wait(context.Background())
	var ce *ChunkError
	if !errors.As(err, &ce) || ce.Index != 1 || !errors.Is(r.Err(), errInjected) {
		t.Fatalf("Wait = %v", err)
	}
	if r.ReadyBytes() != chunk || r.WaitReady(context.Background(), chunk) != nil {
		t.Fatalf("ReadyBytes %d after a failure at chunk 1, want %d", r.ReadyBytes(), chunk)
	}
	r.Bytes()[0] = 1
	lo := addrOf(r.Bytes())
	if err := r.Close(); err != nil {
		t.Fatal(err)
	}
	checkCleanedUp(t, lo, 3*chunk, before)
}

func TestCloseStopsBackgroundAllocation(t *testing.T) {
	const chunk = 2 * MiB
	before := vmLckBytes(t)
	f := newFake()
	f.gate = make(chan struct{}, 1)
	f.gate <- struct{}{} // chunk 0 registers; chunk 1 waits until Close has cancelled
	testHookCancelled = func() { close(f.gate) }
	defer func() { testHookCancelled = nil }()
	r, err := Alloc(context.Background(), 4*chunk, Options{Registrar: f, Pages: Pages4K, ChunkBytes: chunk, Background: true})
	if err != nil {
		t.Fatal(err)
	}
	if err := r.WaitReady(context.Background(), chunk); err != nil {
		t.Fatal(err)
	}
	lo := addrOf(r.Bytes())
	if err := r.Close(); err != nil {
		t.Fatal(err)
	}
	var ce *ChunkError
	if !errors.Is(r.Err(), ErrClosed) || !errors.As(r.Err(), &ce) || ce.Index == 3 {
		t.Errorf("Err after Close mid-allocation = %v, want ErrClosed before the last chunk", r.Err())
	}
	checkCleanedUp(t, lo, 4*chunk, before)
}

func TestBadInputRejected(t *testing.T) {
	phys, err := sys.PhysicalMemoryBytes()
	if err != nil {
		t.Fatal(err)
	}
	tooBig := (int64(phys)/smallPageBytes + 1) * smallPageBytes
	cases := []struct {
		name string
		size int64
		opts Options
		is   error
		says string
	}{
		{"zero", 0, Options{}, ErrInvalidSize, "must be positive"},
		{"negative", -4096, Options{}, ErrInvalidSize, "must be positive"},
		{"not a page multiple", 4*MiB + 1, Options{}, ErrInvalidSize, "not a multiple of the 4096-byte page"},
		{"absurd", 1 << 50, Options{}, ErrInvalidSize, "absurd"},
		{"beyond physical memory", tooBig, Options{}, ErrInvalidSize, "physical memory"},
		{"hugetlb not 2 MiB", 3 * MiB, Options{Pages: PagesHugeTLB}, ErrInvalidSize, "hugetlb page"},
		{"page mode", 4 * MiB, Options{Pages: 9}, ErrInvalidOptions, "Pages = 9"},
		{"fallback hugetlb", 4 * MiB, Options{FallbackIfNoHugeTLB: PagesHugeTLB}, ErrInvalidOptions, "FallbackIfNoHugeTLB"},
		{"fault method", 4 * MiB, Options{Fault: 7}, ErrInvalidOptions, "Fault = 7"},
		{"negative chunk", 4 * MiB, Options{ChunkBytes: -1}, ErrInvalidOptions, "ChunkBytes = -1"},
		{"chunk not a page multiple", 4 * MiB, Options{Pages: Pages4K, ChunkBytes: 4097}, ErrInvalidOptions, "multiple of 4096"},
		{"THP chunk not 2 MiB", 4 * MiB, Options{Pages: PagesTHP, ChunkBytes: MiB}, ErrInvalidOptions, "multiple of 2097152"},
		{"chunk 512 GiB", 4 * MiB, Options{ChunkBytes: 512 * GiB}, ErrInvalidOptions, "512 GiB"},
		{"negative chunk multiple", 4 * MiB, Options{ChunkMultiple: -5}, ErrInvalidOptions, "ChunkMultiple = -5"},
		{"chunk multiple past the limit", 4 * MiB, Options{Pages: PagesTHP, ChunkMultiple: 300*GiB + 4096}, ErrInvalidOptions, "registration limit"},
		{"touchers", 4 * MiB, Options{Touchers: -1}, ErrInvalidOptions, "Touchers = -1"},
		{"empty touch CPUs", 4 * MiB, Options{CPUs: CPUPlan{Touch: []int{}}}, ErrInvalidOptions, "CPUs.Touch is empty"},
		{"CPU out of range", 4 * MiB, Options{CPUs: CPUPlan{Touch: []int{-3}}}, ErrInvalidOptions, "CPU -3"},
		{"CPU not allowed", 4 * MiB, Options{CPUs: CPUPlan{Register: 0, Touch: []int{4000}}}, ErrInvalidOptions, "CPU 4000"},
		{"NUMA node -2", 4 * MiB, Options{NUMANodes: []int{-2}}, ErrInvalidOptions, "NUMANodes[0] = -2"},
		{"NUMA node absent", 4 * MiB, Options{NUMANodes: []int{0, 999}}, ErrInvalidOptions, "NUMANodes[1] = 999"},
	}
	before := vmLckBytes(t)
	beforeNamed := len(mapsMentioning(t, "kvtier-pinned-"))
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			f := newFake()
			c.opts.Registrar = f
			r, err := Alloc(context.Background(), c.size, c.opts)
			if r != nil || !errors.Is(err, c.is) || !strings.Contains(err.Error(), c.says) {
				t.Fatalf("Alloc(%d, %+v) = %v, want %v saying %q", c.size, c.opts, err, c.is, c.says)
			}
			if len(f.snapshot()) != 0 {
				t.Errorf("the registrar was called: %+v", f.snapshot())
			}
		})
	}
	if vmLckBytes(t) != before || len(mapsMentioning(t, "kvtier-pinned-")) != beforeNamed {
		t.Error("rejected allocations changed the process's locked or named memory")
	}
}

func TestHugeTLBWithoutPool(t *testing.T) {
	free, err := meminfoBytes("HugePages_Free", hugePageBytes)
	if err != nil {
		t.Skipf("no hugetlb information: %v", err)
	}
	const size = 8 * MiB
	if free >= size {
		r, err := Alloc(context.Background(), size, Options{Pages: PagesHugeTLB, ChunkBytes: 2 * MiB})
		if err != nil {
			t.Fatalf("hugetlb with %d bytes free: %v", free, err)
		}
		if st := r.Stats(); st.PageMode != PagesHugeTLB {
			t.Errorf("page mode %v", st.PageMode)
		}
		if huge, err := r.HugePageBytes(); err != nil || huge != size {
			t.Errorf("huge bytes %d (%v), want %d", huge, err, size)
		}
		r.Close()
		t.Skip("this machine has a hugetlb pool; the no-pool paths are not reachable")
	}
	_, err = Alloc(context.Background(), size, Options{Pages: PagesHugeTLB})
	if !errors.Is(err, ErrNoHugeTLBPool) || !strings.Contains(err.Error(), "HugePages_Free") || !strings.Contains(err.Error(), "FallbackIfNoHugeTLB") {
		t.Fatalf("hugetlb without a pool: %v", err)
	}
	before := vmLckBytes(t)
	r, err := Alloc(context.Background(), size, Options{Pages: PagesHugeTLB, FallbackIfNoHugeTLB: PagesTHP, ChunkBytes: 2 * MiB})
	if err != nil {
		t.Fatal(err)
	}
	st := r.Stats()
	if st.PageMode != PagesTHP || st.PageModeAsked != PagesHugeTLB || !strings.Contains(st.PageNote, "fell back to THP") {
		t.Errorf("fallback stats: mode %v asked %v note %q", st.PageMode, st.PageModeAsked, st.PageNote)
	}
	lo := addrOf(r.Bytes())
	r.Close()
	checkCleanedUp(t, lo, size, before)

	// A size hugetlb pages cannot make falls back too when asked to.
	r, err = Alloc(context.Background(), 3*MiB, Options{Pages: PagesHugeTLB, FallbackIfNoHugeTLB: Pages4K})
	if err != nil {
		t.Fatal(err)
	}
	if st := r.Stats(); st.PageMode != Pages4K || !strings.Contains(st.PageNote, "not a multiple") {
		t.Errorf("fallback for 3 MiB: %v %q", st.PageMode, st.PageNote)
	}
	// The touchers are planned for the pages the region got.
	if st := r.Stats(); strings.Contains(st.CPUNote, "registration") && !strings.Contains(st.CPUNote, "4KiB registration") {
		t.Errorf("touchers planned for other pages than 4 KiB: %q", st.CPUNote)
	}
	r.Close()
}

func TestVMANamesAndNUMAReported(t *testing.T) {
	r, err := Alloc(context.Background(), 6*MiB, Options{Pages: Pages4K, ChunkBytes: 2 * MiB, NUMANodes: []int{0}})
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	st := r.Stats()
	named := mapsMentioning(t, "[anon:kvtier-pinned-")
	if st.VMANames {
		if len(named) < 3 {
			t.Errorf("VMA names reported used, but maps shows %v", named)
		}
	} else if len(named) != 0 || st.VMANote == "" {
		t.Errorf("VMA names not used (%q) but maps shows %v", st.VMANote, named)
	}
	nodes, _ := onlineNodes()
	if len(nodes) == 1 && (st.NUMABound || !strings.Contains(st.NUMANote, "single NUMA node")) {
		t.Errorf("single-node machine: bound %v, note %q", st.NUMABound, st.NUMANote)
	}
	t.Logf("VMA names: %v (%s); NUMA: %s", st.VMANames, st.VMANote, st.NUMANote)

	r2, err := Alloc(context.Background(), 2*MiB, Options{NUMANodes: []int{-1}, NoVMANames: true})
	if err != nil {
		t.Fatal(err)
	}
	defer r2.Close()
	if st := r2.Stats(); st.NUMABound || !strings.Contains(st.NUMANote, "unknown") || st.VMANames {
		t.Errorf("node -1: %+v", st)
	}
}

func TestExplicitCPUPlan(t *testing.T) {
	r, err := Alloc(context.Background(), 4*MiB, Options{CPUs: CPUPlan{Register: 0, Touch: []int{0, 0}}, ChunkBytes: 2 * MiB})
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	if st := r.Stats(); st.Touchers != 2 || st.RegisterCPU != 0 || fmt.Sprint(st.TouchCPUs) != "[0 0]" {
		t.Errorf("stats %+v", st)
	}
}

// TestChunkMultipleKeepsSlotsInsideRegistrations: with 3 MiB slots and THP
// pages, every registration boundary is a slot boundary (chunks of
// lcm(3 MiB, 2 MiB) = 6 MiB), since the driver refuses a copy that spans two
// registrations.
func TestChunkMultipleKeepsSlotsInsideRegistrations(t *testing.T) {
	const slot = 3 * MiB
	const size = 40 * slot
	f := newFake()
	r, err := Alloc(context.Background(), size, Options{Registrar: f, Pages: PagesTHP, ChunkBytes: 8 * MiB, ChunkMultiple: slot})
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	if cb := r.ChunkBytes(); cb != 6*MiB {
		t.Fatalf("ChunkBytes = %d, want 6 MiB: the largest multiple of lcm(slot, 2 MiB) not above 8 MiB", cb)
	}
	if n := len(f.snapshot()); n != 20 {
		t.Errorf("%d registrations, want 20", n)
	}
	base := addrOf(r.Bytes())
	for i, c := range f.snapshot() {
		if off := int64(c.addr - base); off%slot != 0 {
			t.Errorf("registration %d starts at offset %d, inside a slot", i, off)
		}
	}
}
