package nvme

import (
	"errors"
	"fmt"
	"path/filepath"

	"kvtier.dev/kvtier/nvme/internal/sysio"
)

// Open opens (creating where needed) the slab files that cfg describes and
// rebuilds the index from their slot headers. Each directory is created with
// mode 0700 if absent; an existing one that another user owns or that group
// or others may write is refused (ErrUnsafeDir), and so is a symbolic link
// in it. Open takes each directory's lock file for the Store's life: a
// second Store on a directory fails with ErrLocked naming the holder's pid.
// With ModeAuto it first tries O_DIRECT and falls back to buffered I/O when
// a file system refuses it; Info says what was chosen. A slab file written
// with another geometry, or whose superblock does not decode (unless
// Config.Reformat), makes Open fail before anything is changed.
func Open(cfg Config) (*Store, error) {
	cfg, err := cfg.withDefaults()
	if err != nil {
		return nil, err
	}
	dirs, err := openDirs(&cfg)
	if err != nil {
		return nil, err
	}
	var names []slabName
	for _, d := range dirs {
		for k := range cfg.FilesPerDir {
			names = append(names, slabName{dir: d, name: fmt.Sprintf("kvtier-slab-%03d.kvs", k)})
		}
	}
	direct := cfg.Mode != ModeBuffered
	s, err := openFiles(cfg, names, direct)
	if err != nil && direct && cfg.Mode == ModeAuto && errors.Is(err, sysio.EINVAL) {
		s, err = openFiles(cfg, names, false)
	}
	if err != nil {
		_ = closeDirs(dirs)
		return nil, err
	}
	s.dirs = dirs
	if err := s.recover(); err != nil {
		_ = s.Close()
		return nil, err
	}
	return s, nil
}

// slabName is a slab file: its directory and its name in it.
type slabName struct {
	dir  *slabDir
	name string
}

func (n slabName) path() string { return filepath.Join(n.dir.path, n.name) }

// openFiles opens every file, checks or writes its superblock and
// preallocates it. On error it closes what it opened and removes what it
// created.
func openFiles(cfg Config, names []slabName, direct bool) (s *Store, err error) {
	of := openedFiles{fds: make([]int, 0, len(names))}
	defer func() {
		if err != nil {
			if s != nil && s.pool != nil {
				s.pool.stop()
			}
			of.undo()
		}
	}()
	align, err := of.open(names, direct)
	if err != nil {
		return nil, err
	}
	if s, err = newStore(cfg, names, of.fds, direct, align); err != nil {
		return nil, err
	}
	// Pass 1 reads and checks every superblock, so that a geometry mismatch
	// fails before any file is changed.
	writeSuper, sizes, err := s.checkSupers(of.fds)
	if err != nil {
		return nil, err
	}
	// Pass 2 preallocates and writes the new superblocks.
	for i, fd := range of.fds {
		if err := s.prepareFile(i, fd, writeSuper[i], sizes[i]); err != nil {
			return nil, err
		}
	}
	if err := syncDirsOf(of.created); err != nil {
		return nil, err
	}
	n := len(names) * cfg.SlotsPerFile
	s.slots = make([]slotInfo, n)
	s.tokens = make([]uint32, n*cfg.MaxTokens)
	s.index = make(map[uint64]Slot)
	s.free = make([][]uint32, len(names))
	return s, nil
}

// openedFiles are the slab files openFiles opened, and those of them it
// created: what it undoes on an error.
type openedFiles struct {
	fds     []int
	created []slabName
}

// open opens every file, adding it to o, and returns the direct-I/O
// alignment that suits them all: the largest one reported.
func (o *openedFiles) open(names []slabName, direct bool) (sysio.Align, error) {
	align := sysio.Align{MemBytes: 512, OffsetBytes: 512, Source: "default"}
	for _, n := range names {
		fd, made, err := openFileAt(n.dir, n.name, direct)
		if err != nil {
			return align, err
		}
		if made {
			o.created = append(o.created, n)
		}
		o.fds = append(o.fds, fd)
		if a := sysio.DirectIOAlign(fd); max(a.MemBytes, a.OffsetBytes) > max(align.MemBytes, align.OffsetBytes) || align.Source == "default" {
			align = a
		}
	}
	return align, nil
}

// undo closes the files and removes those created.
func (o *openedFiles) undo() {
	for _, fd := range o.fds {
		_ = sysio.Close(fd)
	}
	for _, n := range o.created {
		_ = sysio.UnlinkAt(n.dir.fd, n.name)
	}
}

// newStore makes the Store of the open files fds (named names): its
// geometry at the alignment, its Info, its workers and its files, wrapped
// by Config.WrapFile. Its index is not made yet.
func newStore(cfg Config, names []slabName, fds []int, direct bool, align sysio.Align) (*Store, error) {
	alignBytes := max(align.MemBytes, align.OffsetBytes, 512)
	s := &Store{cfg: cfg, direct: direct, geom: newGeometry(&cfg, alignBytes), sums: newChecksum(cfg.ChecksumKey)}
	g := &s.geom
	mode := ModeBuffered
	if direct {
		mode = ModeDirect
	}
	paths := make([]string, len(names))
	for i, n := range names {
		paths[i] = n.path()
	}
	s.info = Info{Mode: mode, AlignBytes: alignBytes, AlignSource: align.Source,
		HeaderBytes: g.hdrBytes, SlotBytes: g.slotBytes, FirstSlotOffset: g.superBytes, Slots: len(paths) * cfg.SlotsPerFile,
		Files: paths, Preallocated: true, Keyed: len(cfg.ChecksumKey) > 0}
	var err error
	if s.pool, err = newPool(cfg.Workers, g, cfg.MaxTokens); err != nil {
		return nil, fmt.Errorf("nvme: worker scratch: %w", err)
	}
	for i, p := range paths {
		var f File = newOSFile(fds[i])
		if cfg.WrapFile != nil {
			f = cfg.WrapFile(p, f)
		}
		s.files = append(s.files, slabFile{path: p, f: f})
	}
	return s, nil
}

// superFor is the superblock file i of s must have.
func (s *Store) superFor(i int) superblock {
	return superblock{version: superVersion, fileIndex: uint32(i), fileCount: uint32(len(s.files)),
		slotsPerFile: uint32(s.cfg.SlotsPerFile), blockBytes: uint32(s.cfg.BlockBytes),
		maxTokens: uint32(s.cfg.MaxTokens), alignBytes: uint32(s.geom.alignBytes)}
}

// checkSupers reads every file's size and superblock and checks it against
// superFor. writeSuper says which files need theirs written: a new (empty)
// file, or, with Config.Reformat, one that does not decode.
func (s *Store) checkSupers(fds []int) (writeSuper []bool, sizes []int64, err error) {
	g := &s.geom
	buf := s.pool.workers[0].hdr[:g.superBytes]
	writeSuper = make([]bool, len(fds))
	sizes = make([]int64, len(fds))
	for i, fd := range fds {
		p := s.files[i].path
		if sizes[i], err = sysio.Size(fd); err != nil {
			return nil, nil, fmt.Errorf("nvme: %s: %w", p, err)
		}
		clear(buf)
		if sizes[i] >= g.superBytes {
			if err := s.readFull(s.files[i].f, [][]byte{buf}, 0); err != nil {
				return nil, nil, fmt.Errorf("nvme: read superblock of %s: %w", p, err)
			}
		}
		if writeSuper[i], err = s.checkSuper(i, buf); err != nil {
			return nil, nil, err
		}
	}
	return writeSuper, sizes, nil
}

// checkSuper checks file i's superblock, read into buf, and reports
// whether it is to be written.
func (s *Store) checkSuper(i int, buf []byte) (write bool, err error) {
	p := s.files[i].path
	sb, derr := decodeSuper(buf)
	switch {
	case derr == nil:
		if err := sb.mismatch(s.superFor(i)); err != nil {
			return false, fmt.Errorf("%w: %s %w", ErrConfig, p, err)
		}
		return false, nil
	case errors.Is(derr, errEmptySlot):
		return true, nil
	case s.cfg.Reformat:
		// The slots check themselves (they name their file and slot), so
		// a damaged superblock costs nothing but its rewrite.
		s.ctr.superRewritten.Add(1)
		return true, nil
	default:
		return false, fmt.Errorf("%w: %s: its superblock does not decode (%w); Open changed nothing: set Config.Reformat to rewrite it, or move the file away", ErrConfig, p, derr)
	}
}

// prepareFile preallocates file i (open as fd, size bytes long), writes its
// superblock if writeSuper, and syncs what changed.
func (s *Store) prepareFile(i, fd int, writeSuper bool, size int64) error {
	g := &s.geom
	p, f := s.files[i].path, s.files[i].f
	if size > 0 && size < g.fileBytes {
		s.ctr.extended.Add(1)
	}
	allocated, err := sysio.Fallocate(fd, g.fileBytes)
	if err != nil {
		return fmt.Errorf("nvme: preallocate %d bytes for %s: %w", g.fileBytes, p, err)
	}
	s.info.Preallocated = s.info.Preallocated && allocated
	if writeSuper {
		buf := s.pool.workers[0].hdr[:g.superBytes]
		w := s.superFor(i)
		encodeSuper(buf, &w)
		if err := s.writeFull(f, [][]byte{buf}, 0); err != nil {
			return fmt.Errorf("nvme: write superblock of %s: %w", p, err)
		}
	}
	if writeSuper || size != g.fileBytes {
		// The superblock and the new size must be on disk before any
		// slot write relies on them.
		if err := f.Datasync(); err != nil {
			return fmt.Errorf("nvme: sync %s: %w", p, err)
		}
	}
	return nil
}

// syncDirsOf syncs the directories of the created files: a new file's name
// lives in its directory.
func syncDirsOf(created []slabName) error {
	synced := map[*slabDir]bool{}
	for _, n := range created {
		if synced[n.dir] {
			continue
		}
		synced[n.dir] = true
		if err := sysio.Fsync(n.dir.fd); err != nil {
			return fmt.Errorf("nvme: sync directory %s: %w", n.dir.path, err)
		}
	}
	return nil
}
