package nvme

import (
	"errors"
	"io"
	"sync/atomic"

	"kvtier.dev/kvtier/nvme/internal/sysio"
)

// IOErrorKind classifies failed system calls.
type IOErrorKind int

const (
	// IOErrEIO is EIO: the device failed the request.
	IOErrEIO IOErrorKind = iota
	// IOErrNoSpace is ENOSPC or EDQUOT.
	IOErrNoSpace
	// IOErrShort is a read or write that moved fewer bytes than asked and
	// could not finish.
	IOErrShort
	// IOErrOther is any other errno.
	IOErrOther
	// NumIOErrorKinds counts the kinds.
	NumIOErrorKinds
)

func (k IOErrorKind) String() string {
	return [...]string{"EIO", "ENOSPC", "short", "other"}[k]
}

func classify(err error) IOErrorKind {
	switch sysio.ErrnoName(err) {
	case "EIO":
		return IOErrEIO
	case "ENOSPC", "EDQUOT":
		return IOErrNoSpace
	}
	if errors.Is(err, io.ErrShortWrite) || errors.Is(err, io.ErrUnexpectedEOF) {
		return IOErrShort
	}
	return IOErrOther
}

// Stats is a snapshot of the Store's counters since Open.
type Stats struct {
	// Reads and Writes count blocks read and written successfully.
	Reads, Writes uint64
	// ReadBytes and WriteBytes count payload bytes of those blocks.
	ReadBytes, WriteBytes uint64
	// Syscalls counts preadv/pwritev calls, Syncs fdatasync calls.
	Syscalls, Syncs uint64
	// CorruptDrops counts slots dropped because a header or payload failed
	// verification, at Read, at Open, or by the caller's check
	// (ReportCorrupt).
	CorruptDrops uint64
	// DeferredChecks counts reads whose payload check was left to the
	// caller (ReadOp.DeferWordSum); ReportedCorrupt those of them the
	// caller reported failed (ReportCorrupt).
	DeferredChecks, ReportedCorrupt uint64
	// SlotsInvalidated counts corrupt slots whose header was cleared on disk
	// (and synced), at Read or at Open, so that no restart finds them again.
	SlotsInvalidated uint64
	// VersionDrops counts slots dropped at Open because their header came
	// from another format version.
	VersionDrops uint64
	// DuplicateDrops counts slots dropped at Open because a newer slot holds
	// the same key.
	DuplicateDrops uint64
	// Recovered counts blocks found readable at Open.
	Recovered uint64
	// ModelCleared counts slots cleared at Open because their file had
	// been written for another model (Config.Model, Info.Cleared).
	ModelCleared uint64
	// SuperblocksRewritten counts slab files whose superblock was corrupt
	// and rewritten at Open; FilesExtended those that were shorter than
	// their geometry (truncated) and were extended again.
	SuperblocksRewritten, FilesExtended uint64
	// ReadIOErrors, WriteIOErrors and SyncIOErrors count failed calls by kind.
	ReadIOErrors, WriteIOErrors, SyncIOErrors [NumIOErrorKinds]uint64
}

type counters struct {
	reads, writes, readBytes, writeBytes, syscalls, syncs atomic.Uint64
	corrupt, invalidated, version, duplicate, recovered   atomic.Uint64
	superRewritten, extended, modelCleared                atomic.Uint64
	deferred, reported                                    atomic.Uint64
	readErr, writeErr, syncErr                            [NumIOErrorKinds]atomic.Uint64
}

func (c *counters) snapshot() Stats {
	s := Stats{
		Reads: c.reads.Load(), Writes: c.writes.Load(),
		ReadBytes: c.readBytes.Load(), WriteBytes: c.writeBytes.Load(),
		Syscalls: c.syscalls.Load(), Syncs: c.syncs.Load(),
		CorruptDrops: c.corrupt.Load(), SlotsInvalidated: c.invalidated.Load(), VersionDrops: c.version.Load(),
		DuplicateDrops: c.duplicate.Load(), Recovered: c.recovered.Load(), ModelCleared: c.modelCleared.Load(),
		SuperblocksRewritten: c.superRewritten.Load(), FilesExtended: c.extended.Load(),
		DeferredChecks: c.deferred.Load(), ReportedCorrupt: c.reported.Load(),
	}
	for k := range NumIOErrorKinds {
		s.ReadIOErrors[k] = c.readErr[k].Load()
		s.WriteIOErrors[k] = c.writeErr[k].Load()
		s.SyncIOErrors[k] = c.syncErr[k].Load()
	}
	return s
}
