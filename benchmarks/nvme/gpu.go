package main

import (
	"encoding/binary"
	"fmt"

	"golang.org/x/sys/unix"

	"kvtier.dev/cudastream"
)

// gpuSide is what the GPU modes need per goroutine: batch device blocks and
// batch pinned I/O buffers, a stream, and the word-sum kernel's buffers.
// The copies and the kernel are the ones the DeviceMover's engine issues
// (transfer.Config.Sums), issued here directly, per goroutine, so that both
// GPU modes run at the raw rows' depth. Like the engine, which waits once
// per transfer, a goroutine moves batch blocks per wait (a blocking-sync
// event, as the engine's completer's): on the H200, 1 MiB blocks copied
// and summed cost 75-80 µs of CPU a block with a wait per block, 20-22 µs
// with one per 8 blocks (cudastream's BenchmarkCuWaitCPU).
type gpuSide struct {
	dev     cudastream.Device
	mem     []byte // every worker's buffers, registered
	workers []*gpuWorker
}

type gpuWorker struct {
	st       cudastream.Stream
	ws       cudastream.WordSummer
	ev       cudastream.Event
	bufs     [][]byte // batch pinned buffers
	blocks   cudastream.DevicePtr
	bases    cudastream.DevicePtr
	layout   cudastream.SumLayout
	ids      []int32
	partDev  cudastream.DevicePtr
	partHost []byte
	partials []uint64
	sums     []uint64
}

// newGPUSide opens GPU 0 and gives each of depth goroutines batch pinned
// buffers and device blocks of bs bytes, filled by fill.
func newGPUSide(depth, batch, bs int, fill func([]byte)) (*gpuSide, error) {
	dev, err := cudastream.Open(0)
	if err != nil {
		return nil, fmt.Errorf("--gpu: %w", err)
	}
	g := &gpuSide{dev: dev}
	if g.mem, err = unix.Mmap(-1, 0, depth*batch*bs, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_ANON|unix.MAP_PRIVATE); err != nil {
		dev.Close()
		return nil, err
	}
	fill(g.mem)
	if err := dev.HostRegister(g.mem); err != nil {
		unix.Munmap(g.mem)
		dev.Close()
		return nil, fmt.Errorf("--gpu: register the I/O buffers: %w", err)
	}
	for i := range depth {
		w, err := g.newWorker(g.mem[i*batch*bs:(i+1)*batch*bs], batch, bs)
		if err != nil {
			g.close()
			return nil, err
		}
		g.workers = append(g.workers, w)
	}
	return g, nil
}

func (g *gpuSide) newWorker(mem []byte, batch, bs int) (*gpuWorker, error) {
	w := &gpuWorker{}
	var err error
	if w.st, err = g.dev.NewStream(0); err != nil {
		return nil, err
	}
	var ok bool
	if w.ws, ok = w.st.(cudastream.WordSummer); !ok {
		return nil, fmt.Errorf("--gpu: the device's streams cannot sum")
	}
	if w.ev, err = g.dev.NewEvent(cudastream.EventOptions{BlockingSync: true}); err != nil {
		return nil, err
	}
	for k := range batch {
		w.bufs = append(w.bufs, mem[k*bs:(k+1)*bs:(k+1)*bs])
		w.ids = append(w.ids, int32(k))
	}
	if w.blocks, err = g.dev.Alloc(int64(batch * bs)); err != nil {
		return nil, err
	}
	if w.bases, err = g.dev.Alloc(8); err != nil {
		return nil, err
	}
	w.layout = cudastream.SumLayout{Bases: w.bases, Pieces: 1, PieceBytes: int64(bs), BlockStride: int64(bs)}
	n := int64(batch*w.layout.PartialsPerBlock()) * 8
	if w.partDev, err = g.dev.Alloc(n); err != nil {
		return nil, err
	}
	if w.partHost, err = g.dev.HostAlloc(n); err != nil {
		return nil, err
	}
	w.partials = make([]uint64, w.layout.PartialsPerBlock())
	w.sums = make([]uint64, batch)
	var base [8]byte
	binary.LittleEndian.PutUint64(base[:], uint64(w.blocks))
	if err := w.st.CopyHtoD(w.bases, base[:]); err != nil {
		return nil, err
	}
	for k, b := range w.bufs {
		if err := w.st.CopyHtoD(w.blocks+cudastream.DevicePtr(k*bs), b); err != nil {
			return nil, err
		}
	}
	return w, w.st.Synchronize()
}

func (w *gpuWorker) block(k int) cudastream.DevicePtr {
	return w.blocks + cudastream.DevicePtr(int64(k)*w.layout.BlockStride)
}

// toDevice copies the first n buffers into the worker's blocks and, with
// sum, returns the blocks' word sums as the kernel computes them there,
// once all of it is done.
func (w *gpuWorker) toDevice(n int, sum bool) ([]uint64, error) {
	for k := range n {
		if err := w.st.CopyHtoD(w.block(k), w.bufs[k]); err != nil {
			return nil, err
		}
	}
	return w.sumAndWait(n, sum, false)
}

// fromDevice sums the first n blocks (with sum) and copies them into the
// buffers.
func (w *gpuWorker) fromDevice(n int, sum bool) ([]uint64, error) {
	return w.sumAndWait(n, sum, true)
}

// sumAndWait enqueues the sum kernel over the first n blocks and its
// partials' copy (with sum), then the blocks' copies into the buffers (with
// out), and waits for all of it.
func (w *gpuWorker) sumAndWait(n int, sum, out bool) ([]uint64, error) {
	per := w.layout.PartialsPerBlock()
	if sum {
		if err := w.ws.WordSums(w.layout, w.ids[:n], w.partDev); err != nil {
			return nil, err
		}
		if err := w.st.CopyDtoH(w.partHost[:n*per*8], w.partDev); err != nil {
			return nil, err
		}
	}
	if out {
		for k := range n {
			if err := w.st.CopyDtoH(w.bufs[k], w.block(k)); err != nil {
				return nil, err
			}
		}
	}
	if err := w.ev.Record(w.st); err != nil {
		return nil, err
	}
	if err := w.ev.Synchronize(); err != nil {
		return nil, err
	}
	if !sum {
		return nil, nil
	}
	for k := range n {
		for j := range w.partials {
			w.partials[j] = binary.LittleEndian.Uint64(w.partHost[8*(k*per+j):])
		}
		w.sums[k] = cudastream.WordSumOfPartials(w.partials, w.layout.BlockBytes())
	}
	return w.sums[:n], nil
}

func (g *gpuSide) close() {
	for _, w := range g.workers {
		w.st.Destroy()
		w.ev.Destroy()
		g.dev.Free(w.blocks)
		g.dev.Free(w.bases)
		g.dev.Free(w.partDev)
		g.dev.HostFree(w.partHost)
	}
	g.dev.HostUnregister(g.mem)
	unix.Munmap(g.mem)
	g.dev.Close()
}
