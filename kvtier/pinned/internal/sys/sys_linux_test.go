package sys

import (
	"errors"
	"runtime"
	"testing"
	"unsafe"
)

const page = 4096

func TestMappingCalls(t *testing.T) {
	const size = 64 * page
	p, err := MmapAnon(size, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer func() {
		if err := Munmap(p, size); err != nil {
			t.Error(err)
		}
	}()
	if n, err := ResidentPages(p, size, page); err != nil || n != 0 {
		t.Fatalf("fresh mapping: %d resident (%v)", n, err)
	}
	b := unsafe.Slice((*byte)(p), size)
	for i := 0; i < 8*page; i += page {
		b[i] = 1
	}
	if n, err := ResidentPages(p, size, page); err != nil || n != 8 {
		t.Fatalf("after touching 8 pages: %d resident (%v)", n, err)
	}
	if err := Madvise(unsafe.Add(p, 8*page), 8*page, MADV_POPULATE_WRITE); err != nil {
		t.Fatal(err)
	}
	if n, _ := ResidentPages(p, size, page); n != 16 {
		t.Fatalf("after populating 8 more: %d resident", n)
	}
	if err := MbindNode(p, size, 0); err != nil {
		t.Errorf("mbind to node 0: %v", err)
	}
	if err := MbindNode(p, size, 1000); err == nil {
		t.Error("mbind to node 1000 succeeded")
	}
	if err := MbindNode(p, size, -1); err == nil {
		t.Error("mbind to node -1 succeeded")
	}
	err = SetVMAAnonName(p, page, "kvtier-test")
	if err != nil && !errors.Is(err, EINVAL) {
		t.Errorf("naming a VMA: %v", err)
	}
	if err := Mlock(b[:page]); err != nil {
		t.Fatal(err)
	}
	if err := Munlock(b[:page]); err != nil {
		t.Fatal(err)
	}
	if err := Madvise(unsafe.Add(p, 1), page, MADV_HUGEPAGE); err == nil {
		t.Error("madvise on an unaligned address succeeded")
	}
}

func TestThreadAndLimits(t *testing.T) {
	cpus, err := AllowedCPUs()
	if err != nil || len(cpus) == 0 {
		t.Fatalf("AllowedCPUs = %v, %v", cpus, err)
	}
	done := make(chan error, 1)
	go func() {
		runtime.LockOSThread() // never unlocked: the thread's affinity changes
		if err := PinThreadToCPU(1 << 20); err == nil {
			done <- errors.New("pinning to CPU 1<<20 succeeded")
			return
		}
		done <- PinThreadToCPU(cpus[len(cpus)-1])
	}()
	if err := <-done; err != nil {
		t.Error(err)
	}
	if l, err := MemlockLimit(); err != nil || l == 0 {
		t.Errorf("MemlockLimit = %d, %v", l, err)
	}
	if m, err := PhysicalMemoryBytes(); err != nil || m < 1<<20 {
		t.Errorf("PhysicalMemoryBytes = %d, %v", m, err)
	}
	if _, err := MmapAnon(1<<62, 0); err == nil {
		t.Error("mapping 4 EiB succeeded")
	}
}
