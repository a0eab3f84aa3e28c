package main

import (
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"slices"
	"unsafe"

	"golang.org/x/sys/unix"

	"kvtier.dev/kvtier/nvme"
)

// bench is what one block size is measured on: a store of --size-gib of
// bs-byte slots, the raw descriptor on its file, a payload buffer and a
// header region per goroutine, the orders of a pass, and, with --gpu, the
// GPU side and a store of its own. close undoes all of it, last made first.
type bench struct {
	o      options
	bs     int
	nslots int
	sub    string // the store's directory
	s      *nvme.Store
	info   nvme.Info
	slots  []nvme.Slot // every slot of s, sorted
	dev    *diskStats
	raw    int      // s's file, opened O_DIRECT for the raw rows
	bufs   [][]byte // a payload buffer per goroutine
	hdrs   [][]byte // a header region per goroutine, for the raw+header reads
	seq    []int    // the slots' indices in order
	perm   []int    // and shuffled
	// --gpu (else nil): a device block per goroutine, and a second store
	// (same geometry, same drive) for the word-summed blocks, so that the
	// tier's CPU rows keep measuring XXH3 blocks.
	gpu    *gpuSide
	s2     *nvme.Store
	slots2 []nvme.Slot
	undo   []func()
}

// newBench makes a bench for bs-byte blocks under o.dir. On an error it
// leaves nothing behind.
func newBench(o options, bs int) (_ *bench, err error) {
	b := &bench{o: o, bs: bs, nslots: max(int(o.sizeGiB*(1<<30))/bs, o.depth)}
	defer func() {
		if err != nil {
			b.close()
		}
	}()
	if err := b.openStore(); err != nil {
		return nil, err
	}
	if err := b.openRaw(); err != nil {
		return nil, err
	}
	if b.slots, err = allocateAll(b.s, b.nslots); err != nil {
		return nil, err
	}
	if err := b.mapBuffers(); err != nil {
		return nil, err
	}
	if o.gpu {
		if err := b.openGPU(); err != nil {
			return nil, err
		}
	}
	if err := b.mapHeaders(); err != nil {
		return nil, err
	}
	rng := rand.New(rand.NewPCG(1, uint64(bs)))
	b.perm = rng.Perm(b.nslots)
	b.seq = make([]int, b.nslots)
	for i := range b.seq {
		b.seq[i] = i
	}
	return b, nil
}

// close undoes what newBench made, in the reverse order.
func (b *bench) close() {
	for _, f := range slices.Backward(b.undo) {
		f()
	}
	b.undo = nil
}

// openStore opens the tier's store in a directory of its own, and the
// device counters of its file.
func (b *bench) openStore() error {
	b.sub = filepath.Join(b.o.dir, fmt.Sprintf("bs-%d", b.bs))
	s, err := openDirStore(b.sub, b.nslots, b.bs, b.o.workers, &b.undo)
	if err != nil {
		return err
	}
	b.s, b.info = s, s.Info()
	b.dev = newDiskStats(b.info.Files[0])
	return nil
}

// openDirStore makes dir and opens a direct-I/O store of nslots bs-byte
// slots in it, adding to undo its close and dir's removal.
func openDirStore(dir string, nslots, bs, workers int, undo *[]func()) (*nvme.Store, error) {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, err
	}
	*undo = append(*undo, func() { os.RemoveAll(dir) })
	s, err := nvme.Open(nvme.Config{Dirs: []string{dir}, SlotsPerFile: nslots, BlockBytes: bs,
		MaxTokens: 16, Mode: nvme.ModeDirect, Workers: workers})
	if err != nil {
		return nil, err
	}
	*undo = append(*undo, func() { s.Close() })
	return s, nil
}

// allocateAll allocates n slots of s, sorted.
func allocateAll(s *nvme.Store, n int) ([]nvme.Slot, error) {
	slots := make([]nvme.Slot, n)
	for i := range slots {
		var err error
		if slots[i], err = s.Allocate(); err != nil {
			return nil, err
		}
	}
	slices.Sort(slots)
	return slots, nil
}

// openRaw opens the store's file with O_DIRECT for the raw rows.
func (b *bench) openRaw() error {
	raw, err := unix.Open(b.info.Files[0], unix.O_RDWR|unix.O_DIRECT|unix.O_CLOEXEC, 0)
	if err != nil {
		return fmt.Errorf("open %s with O_DIRECT for the raw baseline: %w", b.info.Files[0], err)
	}
	b.raw = raw
	b.undo = append(b.undo, func() { unix.Close(raw) })
	return nil
}

// payloadOff is the payload offset of a slot: after the superblock, the
// slots before it and its header region.
func (b *bench) payloadOff(slot nvme.Slot) int64 {
	return b.info.FirstSlotOffset + int64(slot)*b.info.SlotBytes + int64(b.info.HeaderBytes)
}

// mapBuffers maps one payload buffer per goroutine. One mapping holds them
// all; with --thp it is 2 MiB aligned and asks for transparent huge pages,
// as the pinned host pool that feeds the tier in a server does.
func (b *bench) mapBuffers() error {
	const hugeBytes = 2 << 20
	depth, bs := b.o.depth, b.bs
	mem, err := unix.Mmap(-1, 0, depth*bs+hugeBytes, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_ANON|unix.MAP_PRIVATE)
	if err != nil {
		return err
	}
	b.undo = append(b.undo, func() { unix.Munmap(mem) })
	base := mem
	if b.o.thp {
		p := uintptr(unsafe.Pointer(&mem[0]))
		base = mem[(hugeBytes-int(p%hugeBytes))%hugeBytes:]
		if err := unix.Madvise(base[:depth*bs], unix.MADV_HUGEPAGE); err != nil {
			return fmt.Errorf("--thp: madvise(MADV_HUGEPAGE): %w", err)
		}
	}
	b.bufs = make([][]byte, depth)
	for i := range b.bufs {
		buf := base[i*bs : (i+1)*bs : (i+1)*bs]
		// Every buffer holds the same bytes, so that a raw write leaves the
		// tier's block (and its checksum) valid for the reads that follow.
		for j := range buf {
			buf[j] = byte(j*131 + j>>12)
		}
		b.bufs[i] = buf
	}
	return nil
}

// openGPU (--gpu) opens the GPU side and the word-summed blocks' store.
func (b *bench) openGPU() error {
	bs := b.bs
	fill := func(buf []byte) {
		for j := range buf {
			buf[j] = byte(j%bs*131 + j%bs>>12)
		}
	}
	gpu, err := newGPUSide(b.o.depth, b.o.gpuBatch, bs, fill)
	if err != nil {
		return err
	}
	b.gpu = gpu
	b.undo = append(b.undo, gpu.close)
	if b.s2, err = openDirStore(b.sub+"-gpu", b.nslots, bs, b.o.workers, &b.undo); err != nil {
		return err
	}
	b.slots2, err = allocateAll(b.s2, b.nslots)
	return err
}

// mapHeaders maps a header region per goroutine for the raw+header reads.
func (b *bench) mapHeaders() error {
	b.hdrs = make([][]byte, b.o.depth)
	for i := range b.hdrs {
		h, err := unix.Mmap(-1, 0, b.info.HeaderBytes, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_ANON|unix.MAP_PRIVATE)
		if err != nil {
			return err
		}
		b.undo = append(b.undo, func() { unix.Munmap(h) })
		b.hdrs[i] = h
	}
	return nil
}
