package transfer

import (
	"encoding/binary"
	"errors"
	"fmt"
	"math/bits"
	"sync"

	"kvtier.dev/cudastream"
)

// The engine's word sums (Config.Sums): with them on, every offload and
// staged onboard also computes, on the GPU, the word sum (internal/checksum's WordSum) of each
// block it moved, over the block's bytes in host order, so that the host
// never reads a block to check it. The NVMe tier stores these sums in its
// slot headers instead of hashing payloads on the CPU (2 to 5 times the CPU
// of the raw I/O, benchmarks/results/nvme-h200.md), and a block loaded from
// NVMe is checked against its stored sum on the GPU.
//
// Once a transfer's copies are issued, a stream of the engine's own waits
// for the transfer's final event, runs the sum kernel over the transfer's
// GPU blocks (cudastream.WordSummer) and copies the partial sums to pinned
// host memory; the transfer is done only after that copy, and Sums then
// returns one sum per block. For an offload the sums are of the GPU blocks
// it copied from, which the caller keeps unchanged until the transfer is
// done; for a staged onboard, of the GPU blocks as they landed.

// Sums reports whether the engine sums its offloads and staged onboards
// (Config.Sums).
func (e *Engine) Sums() bool { return e.sums != nil }

// sumState is the engine's sum stream and its buffers.
type sumState struct {
	mu     sync.Mutex // serialises work on stream
	stream cudastream.Stream
	ws     cudastream.WordSummer
	layout cudastream.SumLayout
	per    int // partial sums per block

	bufMu sync.Mutex
	free  [][]*sumBuf // by class: capacity minSumBlocks<<class blocks
	all   []*sumBuf
}

// sumBuf holds the partial sums of up to cap blocks on the device and in
// pinned host memory.
type sumBuf struct {
	class int
	cap   int
	dev   cudastream.DevicePtr
	host  []byte
}

const minSumBlocks = 16

// setupSums creates the sum stream, puts the layout's piece addresses in
// device memory, and sums block 0 once: a device that cannot sum (no
// kernel, or a TimingOnly simulator) fails here, not on a transfer.
func (e *Engine) setupSums(cfg *Config) error {
	if !cfg.Sums {
		return nil
	}
	g := &e.gpu
	if g.PartBytes%8 != 0 {
		return fmt.Errorf("transfer: Config.Sums: GPULayout.PartBytes %d is not a multiple of 8 bytes, the sum kernel's word", g.PartBytes)
	}
	if g.BlockStride%8 != 0 {
		return fmt.Errorf("transfer: Config.Sums: GPULayout.BlockStride %d is not a multiple of 8 bytes", g.BlockStride)
	}
	s := &sumState{}
	var err error
	if s.stream, err = e.dev.NewStream(cfg.OnboardPriority); err != nil {
		return fmt.Errorf("transfer: Config.Sums: stream: %w", err)
	}
	e.sums = s // Close releases what is set up from here on
	ws, ok := s.stream.(cudastream.WordSummer)
	if !ok {
		return fmt.Errorf("transfer: Config.Sums: the device's streams cannot sum blocks: %w", cudastream.ErrNotSupported)
	}
	s.ws = ws
	bases := make([]byte, 8*len(g.Base))
	for i, b := range g.Base {
		if b%8 != 0 {
			return fmt.Errorf("transfer: Config.Sums: GPULayout.Base[%d] %#x is not 8-byte aligned", i, uint64(b))
		}
		binary.LittleEndian.PutUint64(bases[8*i:], uint64(b))
	}
	p, err := e.dev.Alloc(int64(len(bases)))
	if err != nil {
		return fmt.Errorf("transfer: Config.Sums: the layout's addresses: %w", err)
	}
	s.layout = cudastream.SumLayout{Bases: p, Pieces: len(g.Base), PieceBytes: g.PartBytes, BlockStride: g.BlockStride}
	s.per = s.layout.PartialsPerBlock()
	buf, err := s.get(e.dev, 1)
	if err != nil {
		return err
	}
	defer s.put(buf)
	if err := s.stream.CopyHtoD(p, bases); err != nil {
		return fmt.Errorf("transfer: Config.Sums: copy the layout's addresses: %w", err)
	}
	if err := s.ws.WordSums(s.layout, []int32{0}, buf.dev); err != nil {
		return fmt.Errorf("transfer: Config.Sums: %w", err)
	}
	if err := s.stream.Synchronize(); err != nil {
		return fmt.Errorf("transfer: Config.Sums: the first sum: %w", err)
	}
	return nil
}

// get returns a buffer for n blocks' partial sums.
func (s *sumState) get(dev cudastream.Device, n int) (*sumBuf, error) {
	class := 0
	if n > minSumBlocks {
		class = bits.Len(uint((n - 1) / minSumBlocks))
	}
	s.bufMu.Lock()
	if class < len(s.free) && len(s.free[class]) > 0 {
		l := s.free[class]
		b := l[len(l)-1]
		s.free[class] = l[:len(l)-1]
		s.bufMu.Unlock()
		return b, nil
	}
	s.bufMu.Unlock()
	b := &sumBuf{class: class, cap: minSumBlocks << class}
	bytes := int64(b.cap*s.per) * 8
	var err error
	if b.dev, err = dev.Alloc(bytes); err != nil {
		return nil, fmt.Errorf("transfer: sums of %d blocks: device buffer: %w", n, err)
	}
	if b.host, err = dev.HostAlloc(bytes); err != nil {
		dev.Free(b.dev)
		return nil, fmt.Errorf("transfer: sums of %d blocks: pinned buffer: %w", n, err)
	}
	s.bufMu.Lock()
	s.all = append(s.all, b)
	s.bufMu.Unlock()
	return b, nil
}

func (s *sumState) put(b *sumBuf) {
	s.bufMu.Lock()
	for len(s.free) <= b.class {
		s.free = append(s.free, nil)
	}
	s.free[b.class] = append(s.free[b.class], b)
	s.bufMu.Unlock()
}

// destroy releases the stream and the buffers.
func (s *sumState) destroy(dev cudastream.Device) error {
	var errs []error
	if s.stream != nil {
		errs = append(errs, s.stream.Destroy())
	}
	if s.layout.Bases != 0 {
		errs = append(errs, dev.Free(s.layout.Bases))
	}
	for _, b := range s.all {
		errs = append(errs, dev.Free(b.dev), dev.HostFree(b.host))
	}
	return errors.Join(errs...)
}

// enqueueSums queues t's sums behind its final event. Called once t's
// events are recorded; t.err set means there is nothing to sum.
func (e *Engine) enqueueSums(t *Transfer) {
	s := e.sums
	if s == nil || t.err != nil || len(t.sumBlocks) == 0 {
		return
	}
	buf, err := s.get(e.dev, len(t.sumBlocks))
	if err != nil {
		t.err = err
		return
	}
	ev, err := e.events.get()
	if err != nil {
		s.put(buf)
		t.err = fmt.Errorf("transfer: sums: event: %w", err)
		return
	}
	t.owned = append(t.owned, ev)
	n := len(t.sumBlocks) * s.per * 8
	s.mu.Lock()
	err = s.stream.WaitEvent(t.final)
	if err == nil {
		err = s.ws.WordSums(s.layout, t.sumBlocks, buf.dev)
	}
	if err == nil {
		err = s.stream.CopyDtoH(buf.host[:n], buf.dev)
	}
	if err == nil {
		err = ev.Record(s.stream)
	}
	s.mu.Unlock()
	if err != nil {
		// What was enqueued may still run: the buffer is not reused.
		t.err = fmt.Errorf("transfer: sums of %d blocks: %w", len(t.sumBlocks), err)
		return
	}
	t.sumBuf, t.sumEv = buf, ev
}

// awaitSums waits for t's sums, if it has any, and finishes them.
func (t *Transfer) awaitSums() error {
	if t.sumEv == nil {
		return nil
	}
	s := t.eng.sums
	if err := t.sumEv.Synchronize(); err != nil {
		return fmt.Errorf("sums: %w", err)
	}
	t.sums = make([]uint64, len(t.sumBlocks))
	partials := make([]uint64, s.per)
	bytes := s.layout.BlockBytes()
	for i := range t.sums {
		for k := range partials {
			partials[k] = binary.LittleEndian.Uint64(t.sumBuf.host[8*(i*s.per+k):])
		}
		t.sums[i] = cudastream.WordSumOfPartials(partials, bytes)
	}
	s.put(t.sumBuf)
	t.sumBuf = nil
	return nil
}

// Sums returns the word sum of each block an offload or staged onboard
// moved, in the order of its pairs (or of OnboardStaged's gpuBlocks), once
// it is done without error on an engine with Config.Sums; nil otherwise. The slice is the
// transfer's: valid until Release.
func (t *Transfer) Sums() []uint64 {
	select {
	case <-t.done:
		return t.sums
	default:
		return nil
	}
}
