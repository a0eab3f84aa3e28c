package cudastream

import (
	"encoding/binary"
	"fmt"

	"kvtier.dev/internal/checksum"
)

// simSums is one WordSums call's work, done when its op completes, in
// stream order: like the kernel, it reads the piece addresses from device
// memory then, and a piece outside every allocation faults the stream.
type simSums struct {
	l      SumLayout
	blocks []int32
	bases  []byte
	out    []byte
}

func (w *simSums) run(s *Sim, st *simStream) {
	const call = "kvtier_wordsum"
	k := 0
	for _, b := range w.blocks {
		for p := range w.l.Pieces {
			base := binary.LittleEndian.Uint64(w.bases[8*p:])
			al, off, err := s.mem.resolve(call, DevicePtr(base+uint64(b)*uint64(w.l.BlockStride)), w.l.PieceBytes)
			if err != nil {
				st.setFault(cudaErrorIllegalAddress, fmt.Sprintf("%s: piece %d of block %d: %v", call, p, b, err))
				return
			}
			piece := al.data[off : off+w.l.PieceBytes]
			first := uint64(p) * uint64(w.l.PieceBytes/8)
			for lo := 0; lo < len(piece); lo += SumChunkBytes {
				hi := min(lo+SumChunkBytes, len(piece))
				binary.LittleEndian.PutUint64(w.out[8*k:], checksum.WordAccumulate(piece[lo:hi], first+uint64(lo/8)))
				k++
			}
		}
	}
}

var _ WordSummer = (*simStream)(nil)

// WordSums computes the partial sums in Go when the op completes; it costs LinkModel.KernelLaunch plus the bytes at the
// device-to-device bandwidth. A TimingOnly simulator has no bytes to sum:
// ErrNotSupported.
func (st *simStream) WordSums(l SumLayout, blocks []int32, partials DevicePtr) error {
	const call = "cuLaunchKernel (kvtier_wordsum)"
	if err := checkWordSums(l, blocks, partials); err != nil {
		return err
	}
	s := st.sim
	s.mu.Lock()
	defer s.mu.Unlock()
	if err := st.check(call); err != nil {
		return err
	}
	if len(blocks) == 0 {
		return nil
	}
	if s.timingOnly {
		return simError(call, cudaErrorNotSupported, "a TimingOnly simulator has no bytes to sum")
	}
	bal, boff, err := s.mem.resolve(call, l.Bases, int64(l.Pieces)*8)
	if err != nil {
		return err
	}
	per := l.PartialsPerBlock()
	oal, ooff, err := s.mem.resolve(call, partials, int64(len(blocks)*per)*8)
	if err != nil {
		return err
	}
	op := s.newOp(simOpCopy, call)
	op.dir = DeviceToDevice
	op.spans = append(op.spans, simSpan{srcMem: bal}, simSpan{dstMem: oal})
	op.sum = &simSums{l: l, blocks: append([]int32(nil), blocks...), bases: bal.data[boff : boff+int64(l.Pieces)*8],
		out: oal.data[ooff : ooff+int64(len(blocks)*per)*8]}
	op.bytes = int64(len(blocks)) * l.BlockBytes()
	op.cost = s.link.kernelCost(DeviceToDevice, op.bytes)
	s.enqueue(st, op)
	return nil
}
