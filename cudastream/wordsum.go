package cudastream

import (
	_ "embed"
	"fmt"

	"kvtier.dev/internal/checksum"
)

// WordSummer is an optional capability of a Stream: the word sums
// (internal/checksum's WordSum) of blocks in device memory, computed by a
// kernel at the speed of device memory, so that the host never reads a
// block's bytes to check them. The NVMe tier keeps these sums in its slot
// headers; the transfer engine computes them on the GPU before a block
// leaves it and checks them after one arrives.
//
// Both devices implement it: the real one with kernels/sum.ptx, the
// simulator in Go on its device memory (a TimingOnly simulator has no bytes
// to sum and returns ErrNotSupported). Test for it with a type assertion.
type WordSummer interface {
	// WordSums enqueues the partial word sums of blocks, laid out as l,
	// into device memory at partials: l.PartialsPerBlock() uint64s per
	// block, block blocks[i]'s at partials + i*l.PartialsPerBlock()*8, in
	// any order of addition. Add a block's partials and finish them with
	// WordSumOfPartials. The memory l names and partials MUST stay valid
	// until an event recorded after the call has completed. A bad layout or
	// block number enqueues nothing and names what was wrong.
	WordSums(l SumLayout, blocks []int32, partials DevicePtr) error
}

// SumLayout says where the pieces of the blocks to sum lie in device
// memory: piece p of block b at base[p] + b*BlockStride, PieceBytes long,
// where base is the device array of Pieces addresses at Bases. A block's
// bytes are its pieces in order, piece 0 first, as the host pool keeps
// them (transfer.HostLayout).
type SumLayout struct {
	Bases       DevicePtr
	Pieces      int
	PieceBytes  int64
	BlockStride int64
}

// SumChunkBytes is the most bytes one CTA of the sum kernel adds up: a
// piece has ceil(PieceBytes/SumChunkBytes) partial sums.
const SumChunkBytes = 64 << 10

// maxSumBlocks is the most blocks one launch sums (kernels/sum.cu's
// KV_SUM_MAX_BLOCKS); WordSums launches as often as it needs.
const maxSumBlocks = 256

// sumThreads is the sum kernel's CTA size.
const sumThreads = 256

// PartialsPerBlock is how many partial sums WordSums writes per block.
func (l SumLayout) PartialsPerBlock() int { return l.Pieces * l.chunks() }

// BlockBytes is the bytes a block's sum covers.
func (l SumLayout) BlockBytes() int64 { return int64(l.Pieces) * l.PieceBytes }

func (l SumLayout) chunks() int { return int((l.PieceBytes + SumChunkBytes - 1) / SumChunkBytes) }

// checkWordSums checks what every implementation of WordSums checks.
func checkWordSums(l SumLayout, blocks []int32, partials DevicePtr) error {
	switch {
	case l.Pieces < 1 || l.Pieces > 65535:
		return fmt.Errorf("cudastream: WordSums: SumLayout.Pieces must be in [1, 65535], got %d: %w", l.Pieces, ErrInvalidValue)
	case l.PieceBytes <= 0 || l.PieceBytes%8 != 0 || l.PieceBytes > 1<<40:
		return fmt.Errorf("cudastream: WordSums: SumLayout.PieceBytes must be a positive multiple of 8 (at most 1 TiB), got %d: %w", l.PieceBytes, ErrInvalidValue)
	case l.BlockStride < 0 || l.BlockStride%8 != 0:
		return fmt.Errorf("cudastream: WordSums: SumLayout.BlockStride must be a non-negative multiple of 8, got %d: %w", l.BlockStride, ErrInvalidValue)
	case l.Bases == 0 || l.Bases%8 != 0:
		return fmt.Errorf("cudastream: WordSums: SumLayout.Bases %#x is null or not 8-byte aligned: %w", uint64(l.Bases), ErrInvalidValue)
	case len(blocks) > 0 && (partials == 0 || partials%8 != 0):
		return fmt.Errorf("cudastream: WordSums: partials %#x is null or not 8-byte aligned: %w", uint64(partials), ErrInvalidValue)
	}
	for i, b := range blocks {
		if b < 0 {
			return fmt.Errorf("cudastream: WordSums: block %d (index %d) is negative: %w", b, i, ErrInvalidValue)
		}
	}
	return nil
}

// WordSumOfPartials adds one block's partial sums and finishes them: the
// word sum of its blockBytes bytes (checksum.WordSum).
func WordSumOfPartials(partials []uint64, blockBytes int64) uint64 {
	var acc uint64
	for _, p := range partials {
		acc += p
	}
	return checksum.WordSumFinish(acc, int(blockBytes))
}

// sumPTX is kernels/sum.ptx, built from kernels/sum.cu (see its header).
//
//go:embed kernels/sum.ptx
var sumPTX string
