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
	fds := make([]int, 0, len(names))
	var created []slabName
	defer func() {
		if err != nil {
			if s != nil && s.pool != nil {
				s.pool.stop()
			}
			for _, fd := range fds {
				_ = sysio.Close(fd)
			}
			for _, n := range created {
				_ = sysio.UnlinkAt(n.dir.fd, n.name)
			}
		}
	}()
	align := sysio.Align{MemBytes: 512, OffsetBytes: 512, Source: "default"}
	paths := make([]string, len(names))
	for i, n := range names {
		paths[i] = n.path()
		fd, made, err := openFileAt(n.dir, n.name, direct)
		if err != nil {
			return nil, err
		}
		if made {
			created = append(created, n)
		}
		fds = append(fds, fd)
		if a := sysio.DirectIOAlign(fd); max(a.MemBytes, a.OffsetBytes) > max(align.MemBytes, align.OffsetBytes) || align.Source == "default" {
			align = a
		}
	}
	alignBytes := max(align.MemBytes, align.OffsetBytes, 512)
	s = &Store{cfg: cfg, direct: direct, geom: newGeometry(&cfg, alignBytes), sums: newChecksum(cfg.ChecksumKey)}
	g := &s.geom
	mode := ModeBuffered
	if direct {
		mode = ModeDirect
	}
	s.info = Info{Mode: mode, AlignBytes: alignBytes, AlignSource: align.Source,
		HeaderBytes: g.hdrBytes, SlotBytes: g.slotBytes, FirstSlotOffset: g.superBytes, Slots: len(paths) * cfg.SlotsPerFile,
		Files: paths, Preallocated: true, Keyed: len(cfg.ChecksumKey) > 0}
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

	// Pass 1 reads and checks every superblock, so that a geometry mismatch
	// fails before any file is changed.
	buf := s.pool.workers[0].hdr[:g.superBytes]
	want := superblock{version: superVersion, fileCount: uint32(len(paths)),
		slotsPerFile: uint32(cfg.SlotsPerFile), blockBytes: uint32(cfg.BlockBytes),
		maxTokens: uint32(cfg.MaxTokens), alignBytes: uint32(alignBytes)}
	writeSuper := make([]bool, len(paths))
	sizes := make([]int64, len(paths))
	for i, p := range paths {
		if sizes[i], err = sysio.Size(fds[i]); err != nil {
			return nil, fmt.Errorf("nvme: %s: %w", p, err)
		}
		clear(buf)
		if sizes[i] >= g.superBytes {
			if err := s.readFull(s.files[i].f, [][]byte{buf}, 0); err != nil {
				return nil, fmt.Errorf("nvme: read superblock of %s: %w", p, err)
			}
		}
		sb, derr := decodeSuper(buf)
		w := want
		w.fileIndex = uint32(i)
		switch {
		case derr == nil:
			if err := sb.mismatch(w); err != nil {
				return nil, fmt.Errorf("%w: %s %w", ErrConfig, p, err)
			}
		case errors.Is(derr, errEmptySlot):
			writeSuper[i] = true
		case cfg.Reformat:
			// The slots check themselves (they name their file and slot), so
			// a damaged superblock costs nothing but its rewrite.
			s.ctr.superRewritten.Add(1)
			writeSuper[i] = true
		default:
			return nil, fmt.Errorf("%w: %s: its superblock does not decode (%w); Open changed nothing: set Config.Reformat to rewrite it, or move the file away", ErrConfig, p, derr)
		}
	}
	// Pass 2 preallocates and writes the new superblocks.
	for i, p := range paths {
		if sizes[i] > 0 && sizes[i] < g.fileBytes {
			s.ctr.extended.Add(1)
		}
		allocated, err := sysio.Fallocate(fds[i], g.fileBytes)
		if err != nil {
			return nil, fmt.Errorf("nvme: preallocate %d bytes for %s: %w", g.fileBytes, p, err)
		}
		s.info.Preallocated = s.info.Preallocated && allocated
		if writeSuper[i] {
			w := want
			w.fileIndex = uint32(i)
			encodeSuper(buf, &w)
			if err := s.writeFull(s.files[i].f, [][]byte{buf}, 0); err != nil {
				return nil, fmt.Errorf("nvme: write superblock of %s: %w", p, err)
			}
		}
		if writeSuper[i] || sizes[i] != g.fileBytes {
			// The superblock and the new size must be on disk before any
			// slot write relies on them.
			if err := s.files[i].f.Datasync(); err != nil {
				return nil, fmt.Errorf("nvme: sync %s: %w", p, err)
			}
		}
	}
	// A new file's name lives in its directory: sync that too.
	synced := map[*slabDir]bool{}
	for _, n := range created {
		if synced[n.dir] {
			continue
		}
		synced[n.dir] = true
		if err := sysio.Fsync(n.dir.fd); err != nil {
			return nil, fmt.Errorf("nvme: sync directory %s: %w", n.dir.path, err)
		}
	}
	n := len(paths) * cfg.SlotsPerFile
	s.slots = make([]slotInfo, n)
	s.tokens = make([]uint32, n*cfg.MaxTokens)
	s.index = make(map[uint64]Slot)
	s.free = make([][]uint32, len(paths))
	return s, nil
}
