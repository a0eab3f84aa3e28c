package nvme

import (
	"errors"
	"fmt"
	"path/filepath"

	"kvtier.dev/kvtier/nvme/internal/sysio"
)

// Open opens (creating where needed) the slab files that cfg describes and
// rebuilds the index from their slot headers. Each directory is created with
// mode 0700 if absent; one that is a symbolic link, that another user owns
// or that group or others may write, or whose parent another user could
// change, is refused (ErrUnsafeDir), and so is a symbolic link in it or a
// slab file others may read or write. Open takes each directory's lock file
// for the Store's life (a second Store on a directory fails with ErrLocked
// naming the holder's pid) and its key file (made if absent). With ModeAuto
// it first tries O_DIRECT and falls back to buffered I/O when a file system
// refuses it; Info says what was chosen. A slab file written for another
// Config.Model is cleared (Info.Cleared); one written with another geometry,
// or whose superblock does not decode, makes Open fail before anything is
// changed, unless Config.Reformat.
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
	acts, sizes, err := s.checkSupers(of.fds, of.loose)
	if err != nil {
		return nil, err
	}
	// Pass 2 preallocates and writes the new superblocks.
	for i, fd := range of.fds {
		if err := s.prepareFile(i, fd, acts[i], sizes[i]); err != nil {
			return nil, err
		}
		if acts[i] == superClear {
			s.clearing[i] = true
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
	loose   []bool // group or others may read or write the file
	created []slabName
}

// open opens every file, adding it to o, and returns the direct-I/O
// alignment that suits them all: the largest one reported.
func (o *openedFiles) open(names []slabName, direct bool) (sysio.Align, error) {
	align := sysio.Align{MemBytes: 512, OffsetBytes: 512, Source: "default"}
	for _, n := range names {
		fd, made, perm, err := openFileAt(n.dir, n.name, direct)
		if err != nil {
			return align, err
		}
		if made {
			o.created = append(o.created, n)
		}
		o.fds = append(o.fds, fd)
		o.loose = append(o.loose, perm&0o077 != 0)
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
	s := &Store{cfg: cfg, direct: direct, geom: newGeometry(&cfg, alignBytes)}
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
	s.clearing = make([]bool, len(names))
	var err error
	if s.pool, err = newPool(cfg.Workers, g, cfg.MaxTokens); err != nil {
		return nil, fmt.Errorf("nvme: worker scratch: %w", err)
	}
	for i, p := range paths {
		var f File = newOSFile(fds[i])
		if cfg.WrapFile != nil {
			f = cfg.WrapFile(p, f)
		}
		s.files = append(s.files, slabFile{path: p, f: f, sums: newChecksum(names[i].dir.key, cfg.ChecksumKey)})
	}
	return s, nil
}

// superFor is the superblock file i of s must have.
func (s *Store) superFor(i int) superblock {
	sb := superblock{version: superVersion, fileIndex: uint32(i), fileCount: uint32(len(s.files)),
		slotsPerFile: uint32(s.cfg.SlotsPerFile), blockBytes: uint32(s.cfg.BlockBytes),
		maxTokens: uint32(s.cfg.MaxTokens), alignBytes: uint32(s.geom.alignBytes)}
	sb.model, sb.label = modelDigest(s.cfg.Model)
	return sb
}

// superAction is what Open does with a slab file's superblock.
type superAction uint8

const (
	superKeep     superAction = iota // it is this store's: keep the file
	superNew                         // the file is new (or empty): write it
	superClear                       // another model's: clear the slots, then write it
	superReformat                    // unusable, and Config.Reformat: empty the file, write it
)

// checkSupers reads every file's size and superblock and decides, for
// each, what Open does with it (checkSuper). loose says which files group
// or others may read or write.
func (s *Store) checkSupers(fds []int, loose []bool) (acts []superAction, sizes []int64, err error) {
	g := &s.geom
	buf := s.pool.workers[0].hdr[:g.superBytes]
	acts = make([]superAction, len(fds))
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
		if acts[i], err = s.checkSuper(i, buf, loose[i]); err != nil {
			return nil, nil, err
		}
	}
	return acts, sizes, nil
}

// checkSuper decides what Open does with file i, whose superblock is read
// into buf; loose says group or others may read or write the file. A file
// Open cannot use is an error naming it, unless Config.Reformat.
func (s *Store) checkSuper(i int, buf []byte, loose bool) (superAction, error) {
	p := s.files[i].path
	want := s.superFor(i)
	sb, derr := decodeSuper(buf)
	var why error
	switch {
	case loose:
		why = fmt.Errorf("%w: %s may be read or written by group or others: whoever could write it may have planted blocks, so the tier cannot trust it; remove it, or set Config.Reformat to empty it and make it 0600", ErrUnsafeDir, p)
	case errors.Is(derr, errEmptySlot):
		return superNew, nil
	case derr != nil:
		why = fmt.Errorf("%w: %s: its superblock does not decode (%w); Open changed nothing: set Config.Reformat to empty and reformat it, or move the file away", ErrConfig, p, derr)
	case sb.version != superVersion && sb.version != superV2Version:
		why = fmt.Errorf("%w: %s written with superblock version %d, this build writes %d; Open changed nothing: set Config.Reformat to empty and reformat it", ErrConfig, p, sb.version, superVersion)
	default:
		if err := sb.mismatch(want); err != nil {
			why = fmt.Errorf("%w: %s %w; Open changed nothing: set Config.Reformat to empty and reformat it", ErrConfig, p, err)
		}
	}
	switch {
	case why == nil && sb.version == superVersion && sb.model == want.model:
		return superKeep, nil
	case why == nil:
		s.info.Cleared = append(s.info.Cleared, ClearedFile{Path: p, WrittenFor: sb.label, Recorded: sb.version != superV2Version})
		return superClear, nil
	case s.cfg.Reformat:
		s.ctr.superRewritten.Add(1)
		return superReformat, nil
	}
	return superKeep, why
}

// prepareFile makes file i (open as fd, size bytes long) ready as act
// says: emptied (superReformat, and made 0600), preallocated, its new
// superblock written (superNew, superReformat; superClear's waits for its
// slots to be cleared: Store.writeSupers), and what changed synced.
func (s *Store) prepareFile(i, fd int, act superAction, size int64) error {
	g := &s.geom
	p, f := s.files[i].path, s.files[i].f
	if act == superReformat {
		if err := sysio.Fchmod(fd, 0o600); err != nil {
			return fmt.Errorf("nvme: reformat %s: %w", p, err)
		}
		if err := sysio.Truncate(fd, 0); err != nil {
			return fmt.Errorf("nvme: reformat %s: %w", p, err)
		}
		size = 0
	}
	if size > 0 && size < g.fileBytes {
		s.ctr.extended.Add(1)
	}
	allocated, err := sysio.Fallocate(fd, g.fileBytes)
	if err != nil {
		return fmt.Errorf("nvme: preallocate %d bytes for %s: %w", g.fileBytes, p, err)
	}
	s.info.Preallocated = s.info.Preallocated && allocated
	write := act == superNew || act == superReformat
	if write {
		if err := s.writeSuper(i); err != nil {
			return err
		}
	}
	if write || size != g.fileBytes {
		// The superblock and the new size must be on disk before any
		// slot write relies on them.
		if err := f.Datasync(); err != nil {
			return fmt.Errorf("nvme: sync %s: %w", p, err)
		}
	}
	return nil
}

// writeSuper writes file i's superblock (the caller syncs).
func (s *Store) writeSuper(i int) error {
	buf := s.pool.workers[0].hdr[:s.geom.superBytes]
	w := s.superFor(i)
	encodeSuper(buf, &w)
	if err := s.writeFull(s.files[i].f, [][]byte{buf}, 0); err != nil {
		return fmt.Errorf("nvme: write superblock of %s: %w", s.files[i].path, err)
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
