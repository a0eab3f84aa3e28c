package pinned

import (
	"errors"
	"fmt"
)

var (
	// ErrInvalidSize: the requested size is zero, negative, not a multiple
	// of the page, larger than physical memory, or absurd (1 PiB or more).
	ErrInvalidSize = errors.New("pinned: invalid size")
	// ErrInvalidOptions: a field of Options is out of range.
	ErrInvalidOptions = errors.New("pinned: invalid options")
	// ErrNoHugeTLBPool: PagesHugeTLB was asked for and the hugetlb pool
	// cannot hold the region, and no fallback was chosen.
	ErrNoHugeTLBPool = errors.New("pinned: hugetlb pool too small")
	// ErrMemlockLimit: MlockRegistrar would exceed RLIMIT_MEMLOCK.
	ErrMemlockLimit = errors.New("pinned: RLIMIT_MEMLOCK exceeded")
	// ErrNotSupported: the kernel lacks a feature (reported by probes).
	ErrNotSupported = errors.New("pinned: not supported")
	// ErrClosed: the region was closed.
	ErrClosed = errors.New("pinned: region closed")
)

// Stage names the step of the pipeline an error happened in.
type Stage uint8

const (
	StageFault    Stage = iota // faulting the pages in (touch or populate)
	StageWait                  // waiting for a chunk to be faulted (cancellation)
	StageRegister              // Registrar.HostRegister
	StagePin                   // pinning a worker thread to its CPU
	NumStages
)

func (s Stage) String() string {
	switch s {
	case StageFault:
		return "fault"
	case StageWait:
		return "wait"
	case StageRegister:
		return "register"
	case StagePin:
		return "pin thread"
	}
	return fmt.Sprintf("Stage(%d)", uint8(s))
}

// ChunkError is a failure of one chunk of an allocation. errors.Is and
// errors.As see through it to the cause (a driver error, context.Canceled...).
type ChunkError struct {
	Index       int   // chunk number, from 0
	Chunks      int   // how many chunks the region has
	OffsetBytes int64 // the chunk's offset in the region
	LengthBytes int64 // the chunk's length
	Stage       Stage
	Err         error
}

func (e *ChunkError) Error() string {
	return fmt.Sprintf("pinned: %s chunk %d of %d (offset %d, %d bytes): %v",
		e.Stage, e.Index, e.Chunks, e.OffsetBytes, e.LengthBytes, e.Err)
}

func (e *ChunkError) Unwrap() error { return e.Err }
