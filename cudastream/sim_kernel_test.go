package cudastream

import (
	"bytes"
	"errors"
	"math"
	"math/rand/v2"
	"testing"
	"time"
)

// TestSimCopyKernelMovesAndCosts: the simulated copy kernel moves the same
// bytes as a batch, and costs KernelLaunch + bytes/bandwidth whatever the
// number of descriptors.
func TestSimCopyKernelMovesAndCosts(t *testing.T) {
	link := H200Link()
	const n, pieces = 1 << 20, 256
	s := newTestSim(t, SimVirtualClock, link)
	st := mustStream(t, s, 0)
	kc, ok := st.(KernelCopier)
	if !ok {
		t.Fatalf("%T does not implement KernelCopier", st)
	}
	dev := mustAlloc(t, s, 2*n)
	src, err := s.HostAlloc(n)
	must(t, err)
	dst, err := s.HostAlloc(n)
	must(t, err)
	rng := rand.New(rand.NewPCG(1, 2))
	for i := range src {
		src[i] = byte(rng.Uint32())
	}
	up := make([]Copy, pieces)
	down := make([]Copy, pieces)
	perm := rng.Perm(2 * pieces)
	const piece = n / pieces
	for i := range up {
		d := uint64(dev) + uint64(perm[i]*piece)
		up[i] = Copy{Dst: d, Src: HostAddr(src[i*piece:]), Bytes: piece}
		down[i] = Copy{Dst: HostAddr(dst[i*piece:]), Src: d, Bytes: piece}
	}
	want := func(bw float64) time.Duration {
		return link.KernelLaunch + time.Duration(float64(n)/bw*1e9+0.5) + link.EventCost
	}
	start := s.Clock().Now()
	must(t, kc.CopyKernel(HostToDevice, up))
	if got := eventTime(t, s, st) - start; got != want(49.4*gib) {
		t.Errorf("%d-piece kernel HtoD took %v, want %v", pieces, got, want(49.4*gib))
	}
	start = s.Clock().Now()
	must(t, kc.CopyKernel(DeviceToHost, down))
	if got := eventTime(t, s, st) - start; got != want(51.4*gib) {
		t.Errorf("%d-piece kernel DtoH took %v, want %v", pieces, got, want(51.4*gib))
	}
	must(t, st.Synchronize())
	if !bytes.Equal(src, dst) {
		t.Fatal("data differs after a kernel round trip through scattered device blocks")
	}
	// The same batch costs a descriptor each: the kernel is cheaper.
	start = s.Clock().Now()
	must(t, st.CopyBatch(DeviceToHost, down))
	if batch := eventTime(t, s, st) - start; batch <= want(51.4*gib) {
		t.Errorf("a %d-descriptor batch took %v, not more than the kernel's %v", pieces, batch, want(51.4*gib))
	}
}

func TestSimCopyKernelBadInput(t *testing.T) {
	s := newTestSim(t, SimVirtualClock, LinkModel{})
	st := mustStream(t, s, 0)
	kc := st.(KernelCopier)
	dev := mustAlloc(t, s, 8192)
	pinned, err := s.HostAlloc(8192)
	must(t, err)
	pageable := make([]byte, 4096)
	ops := []Copy{
		{Dst: uint64(dev), Src: HostAddr(pinned), Bytes: 4096},
		{Dst: uint64(dev) + 4096, Src: HostAddr(pageable), Bytes: 4096},
	}
	if err := kc.CopyKernel(HostToDevice, ops); !errors.Is(err, ErrNotRegistered) {
		t.Errorf("kernel copy from pageable memory = %v, want ErrNotRegistered", err)
	}
	ops[1] = Copy{Dst: uint64(dev) + 8000, Src: HostAddr(pinned), Bytes: 4096}
	if err := kc.CopyKernel(HostToDevice, ops); !errors.Is(err, ErrInvalidValue) {
		t.Errorf("kernel copy past the device allocation = %v, want ErrInvalidValue", err)
	}
	ops[1].Bytes = -1
	if err := kc.CopyKernel(HostToDevice, ops); !errors.Is(err, ErrInvalidValue) {
		t.Errorf("kernel copy of a negative size = %v, want ErrInvalidValue", err)
	}
	if err := kc.CopyKernel(NumCopyKinds, ops[:1]); !errors.Is(err, ErrInvalidValue) {
		t.Errorf("kernel copy of an unknown kind = %v, want ErrInvalidValue", err)
	}
	if err := kc.CopyKernel(HostToDevice, nil); err != nil {
		t.Errorf("empty kernel copy = %v, want nil (as on the device)", err)
	}
	// Nothing above was enqueued.
	if ok, err := st.Query(); !ok || err != nil {
		t.Errorf("stream after refused kernel copies: idle %v, err %v", ok, err)
	}
	for _, o := range []KernelCopyOptions{{CTAs: -1}, {ThreadsPerCTA: 48}, {ThreadsPerCTA: 4096}, {PieceBytes: 1024}, {PieceBytes: 8191},
		{Launches: -1}, {Launches: 1025}, {PiecesPerLaunch: 63}, {PiecesPerLaunch: 1<<16 + 1}} {
		if err := kc.SetKernelCopyOptions(o); !errors.Is(err, ErrInvalidValue) {
			t.Errorf("SetKernelCopyOptions(%+v) = %v, want ErrInvalidValue", o, err)
		}
	}
	must(t, kc.SetKernelCopyOptions(KernelCopyOptions{CTAs: 4, ThreadsPerCTA: 128, PieceBytes: 8192}))
	must(t, st.Destroy())
	if err := kc.CopyKernel(HostToDevice, ops[:1]); !errors.Is(err, ErrInvalidValue) {
		t.Errorf("kernel copy on a destroyed stream = %v, want ErrInvalidValue", err)
	}
	if _, err := NewSim(SimConfig{MemoryBytes: 1 << 20, Link: LinkModel{KernelLaunch: -time.Microsecond}}); err == nil {
		t.Error("NewSim with a negative KernelLaunch succeeded")
	}
}

// TestSimCopy2D: a strided copy moves its rows, costs one copy however many
// rows it has, and refuses bad shapes and unpinned memory, enqueuing
// nothing.
func TestSimCopy2D(t *testing.T) {
	link := H200Link()
	s := newTestSim(t, SimVirtualClock, link)
	st := mustStream(t, s, 0)
	c2, ok := st.(Copier2D)
	if !ok {
		t.Fatalf("%T does not implement Copier2D", st)
	}
	const rows, width, pitch = 64, 4096, 16384
	dev := mustAlloc(t, s, rows*width)
	host, err := s.HostAlloc(rows * pitch)
	must(t, err)
	back, err := s.HostAlloc(rows * pitch)
	must(t, err)
	rng := rand.New(rand.NewPCG(3, 4))
	for i := range host {
		host[i] = byte(rng.Uint32())
	}
	// Up: row i of the host at i*pitch to i*width on the device (dense).
	start := s.Clock().Now()
	must(t, c2.Copy2D(HostToDevice, Copy2D{Dst: uint64(dev), Src: HostAddr(host), DstPitch: width, SrcPitch: pitch, Width: width, Height: rows}))
	n := float64(rows * width)
	want := link.CopyLatency + time.Duration(math.Round(n/(49.4*gib)*1e9)) + link.EventCost
	if got := eventTime(t, s, st) - start; got != want {
		t.Errorf("a %d-row strided copy took %v, want one copy's %v", rows, got, want)
	}
	must(t, c2.Copy2D(DeviceToHost, Copy2D{Dst: HostAddr(back), Src: uint64(dev), DstPitch: pitch, SrcPitch: width, Width: width, Height: rows}))
	must(t, st.Synchronize())
	for i := range rows {
		if !bytes.Equal(host[i*pitch:i*pitch+width], back[i*pitch:i*pitch+width]) {
			t.Fatalf("row %d differs after a strided round trip", i)
		}
		if !bytes.Equal(back[i*pitch+width:(i+1)*pitch], make([]byte, pitch-width)) {
			t.Fatalf("the gap after row %d was written", i)
		}
	}
	pageable := make([]byte, rows*pitch)
	for _, c := range []struct {
		kind CopyKind
		c    Copy2D
		want error
	}{
		{NumCopyKinds, Copy2D{Width: 1, Height: 1}, ErrInvalidValue},
		{HostToDevice, Copy2D{Width: -1, Height: 1}, ErrInvalidValue},
		{HostToDevice, Copy2D{Dst: uint64(dev), Src: HostAddr(host), DstPitch: width - 1, SrcPitch: pitch, Width: width, Height: 2}, ErrInvalidValue},
		{HostToDevice, Copy2D{Dst: uint64(dev), Src: HostAddr(host), DstPitch: width, SrcPitch: pitch, Width: width, Height: rows + 1}, ErrInvalidValue},
		{HostToDevice, Copy2D{Dst: uint64(dev), Src: HostAddr(pageable), DstPitch: width, SrcPitch: pitch, Width: width, Height: 2}, ErrNotRegistered},
	} {
		if err := c2.Copy2D(c.kind, c.c); !errors.Is(err, c.want) {
			t.Errorf("Copy2D(%v, %+v) = %v, want %v", c.kind, c.c, err, c.want)
		}
	}
	if ok, err := st.Query(); !ok || err != nil {
		t.Errorf("stream after refused strided copies: idle %v, err %v", ok, err)
	}
	must(t, c2.Copy2D(HostToDevice, Copy2D{Width: 0, Height: 5}))
}
