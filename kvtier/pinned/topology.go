package pinned

import (
	"cmp"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
)

// sysfsRoot is where the CPU and NUMA topology is read; tests point it at a
// fake tree in testdata.
var sysfsRoot = "/sys"

// parseCPUList parses the kernel's list format ("0-3,8,10-11") used by
// cpulist and thread_siblings_list files. An empty (or all-space) list is
// empty.
func parseCPUList(s string) ([]int, error) {
	s = strings.TrimSpace(s)
	if s == "" {
		return nil, nil
	}
	var out []int
	for _, part := range strings.Split(s, ",") {
		lo, hi, isRange := strings.Cut(part, "-")
		a, err := strconv.Atoi(lo)
		if err != nil || a < 0 {
			return nil, fmt.Errorf("cpu list %q: bad number %q", s, lo)
		}
		b := a
		if isRange {
			b, err = strconv.Atoi(hi)
			if err != nil || b < a {
				return nil, fmt.Errorf("cpu list %q: bad range %q", s, part)
			}
		}
		if b >= 1<<16 {
			return nil, fmt.Errorf("cpu list %q: %d is out of range", s, b)
		}
		for c := a; c <= b; c++ {
			out = append(out, c)
		}
	}
	slices.Sort(out)
	return slices.Compact(out), nil
}

// cpuInfo is one logical CPU's place in the machine.
type cpuInfo struct {
	cpu      int
	pkg      int
	core     int
	siblings []int // logical CPUs sharing the physical core, itself included
}

func readIntFile(path string) (int, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return 0, err
	}
	return strconv.Atoi(strings.TrimSpace(string(b)))
}

// readTopology reads each allowed CPU's core and package from sysfs. A CPU
// whose topology cannot be read counts as its own core.
func readTopology(allowed []int) []cpuInfo {
	out := make([]cpuInfo, 0, len(allowed))
	for _, c := range allowed {
		dir := filepath.Join(sysfsRoot, "devices/system/cpu", "cpu"+strconv.Itoa(c), "topology")
		ci := cpuInfo{cpu: c, pkg: 0, core: 1<<20 + c, siblings: []int{c}} // a core of its own
		if v, err := readIntFile(filepath.Join(dir, "physical_package_id")); err == nil {
			ci.pkg = v
		}
		if v, err := readIntFile(filepath.Join(dir, "core_id")); err == nil {
			ci.core = v
		}
		if b, err := os.ReadFile(filepath.Join(dir, "thread_siblings_list")); err == nil {
			if l, err := parseCPUList(string(b)); err == nil && slices.Contains(l, c) {
				ci.siblings = l
			}
		}
		out = append(out, ci)
	}
	return out
}

// Figures measured on the H200 machine (design.md) that size the toucher
// pool: touchers must fault faster than the one registering thread pins.
const (
	register4KBytesPerSec       = 19.5 * float64(GiB)
	touch4KBytesPerSecPerThread = 19.0 * float64(GiB) / 16
	// For THP the C prototype kept ahead of a 33.7 GiB/s registration with
	// 8 touchers, so one THP toucher faults at least 33.7/8 GiB/s.
	registerTHPBytesPerSec       = 33.7 * float64(GiB)
	touchTHPBytesPerSecPerThread = registerTHPBytesPerSec / 8
	// keepAheadMargin: touch aims this much faster than registration.
	keepAheadMargin = 1.1
)

// touchersToKeepAhead is how many touchers outrun registration in a mode.
func touchersToKeepAhead(m PageMode) int {
	if m == Pages4K {
		return int(math.Ceil(register4KBytesPerSec * keepAheadMargin / touch4KBytesPerSecPerThread))
	}
	return int(math.Ceil(registerTHPBytesPerSec * keepAheadMargin / touchTHPBytesPerSecPerThread))
}

// derivePlan chooses the registering CPU and the touchers' CPUs: the
// registering goroutine gets the physical core of the highest-numbered
// allowed CPU (away from CPU 0, where housekeeping and interrupts tend to
// land), and no toucher runs on that core or its hyperthread siblings.
// Touchers spread over distinct physical cores before doubling up on
// hyperthreads. want is the toucher count (0: touchersToKeepAhead).
func derivePlan(topo []cpuInfo, m PageMode, want int) (CPUPlan, string) {
	if len(topo) == 0 {
		return CPUPlan{Register: 0, Touch: []int{0}}, "no CPU information: one toucher, sharing CPU 0 with registration"
	}
	byCPU := slices.Clone(topo)
	slices.SortFunc(byCPU, func(a, b cpuInfo) int { return cmp.Compare(a.cpu, b.cpu) })
	last := byCPU[len(byCPU)-1]
	regCore := [2]int{last.pkg, last.core}
	register := last.cpu
	for _, ci := range byCPU { // lowest-numbered thread of that core
		if ci.pkg == regCore[0] && ci.core == regCore[1] {
			register = ci.cpu
			break
		}
	}

	// Candidates: CPUs off the registering core (and not its siblings),
	// ordered by thread rank within their core, then package and core.
	rank := map[[2]int]int{}
	type cand struct{ cpu, rank, pkg, core int }
	var cands []cand
	for _, ci := range byCPU {
		key := [2]int{ci.pkg, ci.core}
		if key == regCore || slices.Contains(last.siblings, ci.cpu) {
			continue
		}
		cands = append(cands, cand{ci.cpu, rank[key], ci.pkg, ci.core})
		rank[key]++
	}
	slices.SortFunc(cands, func(a, b cand) int {
		return cmp.Or(cmp.Compare(a.rank, b.rank), cmp.Compare(a.pkg, b.pkg), cmp.Compare(a.core, b.core), cmp.Compare(a.cpu, b.cpu))
	})
	if len(cands) == 0 {
		n := max(want, 1)
		touch := make([]int, n)
		for i := range touch {
			touch[i] = register
		}
		return CPUPlan{Register: register, Touch: touch},
			fmt.Sprintf("one physical core: %d toucher(s) share CPU %d with registration", n, register)
	}
	note := fmt.Sprintf("register on CPU %d (package %d core %d); ", register, regCore[0], regCore[1])
	n := want
	if n == 0 {
		need := touchersToKeepAhead(m)
		n = min(need, len(cands))
		note += fmt.Sprintf("%d touchers (%d keep ahead of %v registration, %d CPUs free)", n, need, m, len(cands))
	} else {
		note += fmt.Sprintf("%d touchers as asked (%d CPUs free)", n, len(cands))
	}
	touch := make([]int, n)
	for i := range touch {
		touch[i] = cands[i%len(cands)].cpu
	}
	return CPUPlan{Register: register, Touch: touch}, note
}

// onlineNodes lists the NUMA nodes that have memory.
func onlineNodes() ([]int, error) {
	b, err := os.ReadFile(filepath.Join(sysfsRoot, "devices/system/node/has_memory"))
	if err != nil {
		b, err = os.ReadFile(filepath.Join(sysfsRoot, "devices/system/node/online"))
	}
	if err != nil {
		return nil, fmt.Errorf("reading NUMA nodes: %w", err)
	}
	return parseCPUList(string(b))
}

// meminfoBytes reads one field of /proc/meminfo in bytes. Fields in pages
// (HugePages_Free) are scaled by pageBytes.
func meminfoBytes(field string, pageBytes int64) (int64, error) {
	b, err := os.ReadFile("/proc/meminfo")
	if err != nil {
		return 0, err
	}
	for _, line := range strings.Split(string(b), "\n") {
		name, rest, ok := strings.Cut(line, ":")
		if !ok || name != field {
			continue
		}
		f := strings.Fields(rest)
		if len(f) == 0 {
			break
		}
		v, err := strconv.ParseInt(f[0], 10, 64)
		if err != nil {
			return 0, fmt.Errorf("/proc/meminfo %s: %w", field, err)
		}
		if len(f) > 1 && f[1] == "kB" {
			return v * KiB, nil
		}
		return v * pageBytes, nil
	}
	return 0, fmt.Errorf("/proc/meminfo has no %s", field)
}

// thpSetting returns the bracketed choice of the THP "enabled" file.
func thpSetting() string {
	b, err := os.ReadFile(filepath.Join(sysfsRoot, "kernel/mm/transparent_hugepage/enabled"))
	if err != nil {
		return "unknown"
	}
	s := string(b)
	if i := strings.IndexByte(s, '['); i >= 0 {
		if j := strings.IndexByte(s[i:], ']'); j > 0 {
			return s[i+1 : i+j]
		}
	}
	return strings.TrimSpace(s)
}
