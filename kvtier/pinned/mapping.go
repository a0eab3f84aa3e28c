package pinned

import (
	"errors"
	"fmt"
	"slices"
	"strconv"
	"sync"
	"unsafe"

	"kvtier.dev/kvtier/pinned/internal/sys"
)

// mapRegion maps the region once, in the page mode asked for (or its
// fallback), and records the mode used in the stats.
func (s *state) mapRegion() error {
	size := s.p.size
	mode := s.p.pages
	if mode == PagesHugeTLB {
		var cause error
		if size%hugePageBytes != 0 {
			cause = fmt.Errorf("%d bytes is not a multiple of the 2 MiB hugetlb page", size)
		} else {
			p, err := sys.MmapAnon(uintptr(size), sys.MAP_HUGETLB|sys.MAP_HUGE_2MB)
			if err == nil {
				s.base, s.mapBase, s.mapBytes = p, p, uintptr(size)
				s.stats.PageMode = PagesHugeTLB
				return nil
			}
			if !errors.Is(err, sys.ENOMEM) {
				return fmt.Errorf("pinned: mapping %d bytes of hugetlb pages: %w", size, err)
			}
			free, ferr := meminfoBytes("HugePages_Free", hugePageBytes)
			if ferr != nil {
				cause = fmt.Errorf("%d bytes asked; the pool's free size is unknown (%v)", size, ferr)
			} else {
				cause = fmt.Errorf("%d bytes asked, %d bytes free in the 2 MiB pool (HugePages_Free)", size, free)
			}
		}
		if s.p.fallback == PagesDefault {
			return fmt.Errorf("%w: %v; reserve pages with sysctl vm.nr_hugepages, or set Options.FallbackIfNoHugeTLB", ErrNoHugeTLBPool, cause)
		}
		mode = s.p.fallback.resolve()
		s.stats.PageNote = fmt.Sprintf("hugetlb unavailable (%v): fell back to %v", cause, mode)
	}
	s.stats.PageMode = mode

	var extra uintptr
	if mode == PagesTHP {
		extra = uintptr(hugePageBytes)
	}
	raw, err := sys.MmapAnon(uintptr(size)+extra, 0)
	if err != nil {
		return fmt.Errorf("pinned: mapping %d bytes: %w", size, err)
	}
	s.base, s.mapBase, s.mapBytes = raw, raw, uintptr(size)+extra
	if mode != PagesTHP {
		return nil
	}
	// Trim the mapping to a 2 MiB aligned start, so that every huge page
	// the kernel can place is a whole one.
	head := (uintptr(hugePageBytes) - uintptr(raw)%uintptr(hugePageBytes)) % uintptr(hugePageBytes)
	if head > 0 {
		if err := sys.Munmap(raw, head); err != nil {
			return errors.Join(fmt.Errorf("pinned: %w", err), sys.Munmap(raw, s.mapBytes))
		}
	}
	s.base = unsafe.Add(raw, head)
	s.mapBase, s.mapBytes = s.base, uintptr(size)
	if tail := extra - head; tail > 0 {
		if err := sys.Munmap(unsafe.Add(s.base, size), tail); err != nil {
			return errors.Join(fmt.Errorf("pinned: %w", err), sys.Munmap(s.base, s.mapBytes))
		}
	}
	if err := sys.Madvise(s.base, uintptr(size), sys.MADV_HUGEPAGE); err != nil {
		return errors.Join(fmt.Errorf("pinned: THP: %w", err), sys.Munmap(s.mapBase, s.mapBytes))
	}
	if setting := thpSetting(); setting != "always" && setting != "madvise" {
		s.stats.PageNote = fmt.Sprintf("THP asked, but transparent_hugepage/enabled is %q: the kernel uses 4 KiB pages", setting)
	}
	return nil
}

// vmaNameProbe remembers, for the process, whether PR_SET_VMA_ANON_NAME
// works: nil yes, ErrNotSupported no, anything else inconclusive.
var vmaNameProbe struct {
	once sync.Once
	err  error
}

func probeVMANames() error {
	vmaNameProbe.once.Do(func() {
		const page = uintptr(smallPageBytes)
		p, err := sys.MmapAnon(2*page, 0)
		if err != nil {
			vmaNameProbe.err = err
			return
		}
		err = sys.SetVMAAnonName(p, page, "kvtier-probe")
		if errors.Is(err, sys.EINVAL) {
			err = fmt.Errorf("%w: %w (kernel without CONFIG_ANON_VMA_NAME)", ErrNotSupported, err)
		}
		vmaNameProbe.err = errors.Join(err, sys.Munmap(p, 2*page))
	})
	return vmaNameProbe.err
}

// vmaName is chunk i's VMA name. Neighbours differ, so the kernel keeps
// each chunk its own VMA (its own fault lock).
func vmaName(i int) string { return "kvtier-pinned-" + strconv.Itoa(i) }

// prepareChunks names each chunk's VMA and binds it to its NUMA node.
func (s *state) prepareChunks(nodes []int, nameVMAs bool) error {
	switch {
	case !nameVMAs:
		s.stats.VMANote = "turned off (Options.NoVMANames)"
	case s.stats.PageMode == PagesHugeTLB:
		s.stats.VMANote = "not applicable: hugetlb mappings are file-backed"
	case s.p.chunks == 1:
		s.stats.VMANote = "one chunk: nothing to split"
	default:
		if err := probeVMANames(); err != nil {
			s.stats.VMANote = "unavailable: " + err.Error()
			break
		}
		for i := range s.p.chunks {
			c := s.p.chunk(i)
			if err := sys.SetVMAAnonName(unsafe.Add(s.base, c.OffsetBytes), uintptr(c.LengthBytes), vmaName(i)); err != nil {
				return fmt.Errorf("pinned: naming chunk %d's VMA: %w", i, err)
			}
		}
		s.stats.VMANames = true
		s.stats.VMANote = fmt.Sprintf("%d VMAs named kvtier-pinned-<i>", s.p.chunks)
	}
	if len(nodes) == 0 {
		return nil
	}
	for i := range s.p.chunks {
		c := s.p.chunk(i)
		node := nodes[i%len(nodes)]
		if err := sys.MbindNode(unsafe.Add(s.base, c.OffsetBytes), uintptr(c.LengthBytes), node); err != nil {
			return fmt.Errorf("pinned: binding chunk %d (offset %d, %d bytes) to NUMA node %d: %w", i, c.OffsetBytes, c.LengthBytes, node, err)
		}
	}
	s.stats.NUMABound = true
	s.stats.NUMANodes = nodes
	return nil
}

// chooseNodes turns Options.NUMANodes into the nodes to bind to (nil for
// none) and a note saying what was decided.
func chooseNodes(asked []int) ([]int, string, error) {
	var want []int
	for _, n := range asked {
		if n >= 0 && !slices.Contains(want, n) {
			want = append(want, n)
		}
	}
	if len(want) == 0 {
		if len(asked) > 0 {
			return nil, "node unknown (-1): not bound", nil
		}
		return nil, "no node asked: not bound", nil
	}
	online, err := onlineNodes()
	if err != nil {
		return nil, fmt.Sprintf("NUMA topology unreadable (%v): not bound", err), nil
	}
	for i, n := range asked {
		if n >= 0 && !slices.Contains(online, n) {
			return nil, "", fmt.Errorf("%w: NUMANodes[%d] = %d is not a node with memory (nodes: %v)", ErrInvalidOptions, i, n, online)
		}
	}
	if len(online) <= 1 {
		return nil, fmt.Sprintf("single NUMA node %v: binding skipped", online), nil
	}
	return want, fmt.Sprintf("chunks bound round robin to nodes %v (MPOL_BIND)", want), nil
}
