package pinned

import (
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

func TestParseCPUList(t *testing.T) {
	for in, want := range map[string]string{
		"":          "[]",
		" \n":       "[]",
		"0":         "[0]",
		"0-3":       "[0 1 2 3]",
		"0-1,8-9\n": "[0 1 8 9]",
		"5,1,1-2":   "[1 2 5]",
	} {
		got, err := parseCPUList(in)
		if err != nil || fmt.Sprint(got) != want {
			t.Errorf("parseCPUList(%q) = %v, %v; want %s", in, got, err, want)
		}
	}
	for _, bad := range []string{"a", "3-1", "1-", "-1", "0,,1", "70000", "1-x"} {
		if got, err := parseCPUList(bad); err == nil {
			t.Errorf("parseCPUList(%q) = %v, want an error", bad, got)
		}
	}
}

func FuzzParseCPUList(f *testing.F) {
	for _, s := range []string{"0-3,8", "1", "", "3-1", "0-65535"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		got, err := parseCPUList(s)
		if err != nil {
			return
		}
		if !slices.IsSorted(got) || len(slices.Compact(slices.Clone(got))) != len(got) {
			t.Fatalf("parseCPUList(%q) = %v: not sorted and unique", s, got)
		}
		for _, c := range got {
			if c < 0 || c >= 1<<16 {
				t.Fatalf("parseCPUList(%q) has %d", s, c)
			}
		}
	})
}

// fakeSysfs writes a CPU topology: cpu -> (package, core), siblings by core.
func fakeSysfs(t *testing.T, cpus map[int][2]int, nodes string) {
	t.Helper()
	root := t.TempDir()
	byCore := map[[2]int][]int{}
	for c, pc := range cpus {
		byCore[pc] = append(byCore[pc], c)
	}
	write := func(path, s string) {
		if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(path, []byte(s+"\n"), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	for c, pc := range cpus {
		dir := filepath.Join(root, "devices/system/cpu", fmt.Sprintf("cpu%d", c), "topology")
		sib := byCore[pc]
		slices.Sort(sib)
		var parts []string
		for _, s := range sib {
			parts = append(parts, fmt.Sprint(s))
		}
		write(filepath.Join(dir, "physical_package_id"), fmt.Sprint(pc[0]))
		write(filepath.Join(dir, "core_id"), fmt.Sprint(pc[1]))
		write(filepath.Join(dir, "thread_siblings_list"), strings.Join(parts, ","))
	}
	write(filepath.Join(root, "devices/system/node/has_memory"), nodes)
	old := sysfsRoot
	sysfsRoot = root
	t.Cleanup(func() { sysfsRoot = old })
}

func TestDerivePlanHyperthreaded(t *testing.T) {
	// 16 logical CPUs: cores 0-7, CPU n and n+8 are siblings.
	cpus := map[int][2]int{}
	var allowed []int
	for c := range 16 {
		cpus[c] = [2]int{0, c % 8}
		allowed = append(allowed, c)
	}
	fakeSysfs(t, cpus, "0")
	topo := readTopology(allowed)

	plan, note := derivePlan(topo, Pages4K, 0)
	if plan.Register != 7 {
		t.Errorf("register on CPU %d, want 7 (the core of CPU 15, its lowest thread)", plan.Register)
	}
	if slices.Contains(plan.Touch, 7) || slices.Contains(plan.Touch, 15) {
		t.Errorf("touchers %v share the registering core", plan.Touch)
	}
	// 4 KiB pages need 19 touchers to keep ahead; 14 CPUs are free, and
	// the first seven are distinct physical cores.
	if fmt.Sprint(plan.Touch) != "[0 1 2 3 4 5 6 8 9 10 11 12 13 14]" {
		t.Errorf("touchers %v (%s)", plan.Touch, note)
	}
	plan, _ = derivePlan(topo, PagesTHP, 0)
	if len(plan.Touch) != touchersToKeepAhead(PagesTHP) || fmt.Sprint(plan.Touch) != "[0 1 2 3 4 5 6 8 9]" {
		t.Errorf("THP touchers %v, want 9: the 7 free cores, then hyperthreads", plan.Touch)
	}
	plan, note = derivePlan(topo, PagesTHP, 20)
	if len(plan.Touch) != 20 || slices.Contains(plan.Touch, 7) || !strings.Contains(note, "as asked") {
		t.Errorf("20 touchers asked: %v (%s)", plan.Touch, note)
	}
}

func TestDerivePlanSmallMachines(t *testing.T) {
	fakeSysfs(t, map[int][2]int{0: {0, 0}, 1: {0, 1}}, "0")
	plan, _ := derivePlan(readTopology([]int{0, 1}), PagesTHP, 0)
	if plan.Register != 1 || fmt.Sprint(plan.Touch) != "[0]" {
		t.Errorf("two cores: %+v", plan)
	}
	plan, note := derivePlan(readTopology([]int{0}), PagesTHP, 0)
	if plan.Register != 0 || fmt.Sprint(plan.Touch) != "[0]" || !strings.Contains(note, "share") {
		t.Errorf("one CPU: %+v (%s)", plan, note)
	}
	// Two threads of one core: registration keeps the core; the toucher shares it.
	fakeSysfs(t, map[int][2]int{0: {0, 0}, 1: {0, 0}}, "0")
	plan, note = derivePlan(readTopology([]int{0, 1}), Pages4K, 0)
	if plan.Register != 0 || slices.Contains(plan.Touch, 1) && !strings.Contains(note, "share") {
		t.Errorf("one hyperthreaded core: %+v (%s)", plan, note)
	}
	// Unreadable topology: every CPU is its own core.
	sysfsRoot = t.TempDir()
	plan, _ = derivePlan(readTopology([]int{0, 1, 2, 3}), Pages4K, 0)
	if plan.Register != 3 || fmt.Sprint(plan.Touch) != "[0 1 2]" {
		t.Errorf("no sysfs: %+v", plan)
	}
}

func TestChooseNodes(t *testing.T) {
	fakeSysfs(t, map[int][2]int{0: {0, 0}}, "0-1")
	nodes, note, err := chooseNodes([]int{1, 0, 1})
	if err != nil || fmt.Sprint(nodes) != "[1 0]" || !strings.Contains(note, "MPOL_BIND") {
		t.Errorf("two nodes: %v %q %v", nodes, note, err)
	}
	if _, _, err := chooseNodes([]int{2}); err == nil || !strings.Contains(err.Error(), "NUMANodes[0] = 2") {
		t.Errorf("absent node: %v", err)
	}
	if nodes, note, err := chooseNodes(nil); nodes != nil || err != nil || !strings.Contains(note, "no node asked") {
		t.Errorf("no nodes: %v %q %v", nodes, note, err)
	}
	fakeSysfs(t, map[int][2]int{0: {0, 0}}, "0")
	if nodes, note, err := chooseNodes([]int{0}); nodes != nil || err != nil || !strings.Contains(note, "single NUMA node") {
		t.Errorf("one node: %v %q %v", nodes, note, err)
	}
}

func TestTHPSetting(t *testing.T) {
	fakeSysfs(t, map[int][2]int{0: {0, 0}}, "0")
	path := filepath.Join(sysfsRoot, "kernel/mm/transparent_hugepage/enabled")
	if got := thpSetting(); got != "unknown" {
		t.Errorf("missing file: %q", got)
	}
	os.MkdirAll(filepath.Dir(path), 0o755)
	os.WriteFile(path, []byte("always [madvise] never\n"), 0o644)
	if got := thpSetting(); got != "madvise" {
		t.Errorf("thpSetting = %q", got)
	}
}

// TestNUMABindingApplied pretends the machine has two nodes so that the
// allocator binds its chunks, for real, to node 0 (which exists here).
func TestNUMABindingApplied(t *testing.T) {
	fakeSysfs(t, map[int][2]int{0: {0, 0}, 1: {0, 1}}, "0-1")
	r, err := Alloc(t.Context(), 4*MiB, Options{NUMANodes: []int{0}, ChunkBytes: 2 * MiB})
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	st := r.Stats()
	if !st.NUMABound || fmt.Sprint(st.NUMANodes) != "[0]" || !strings.Contains(st.NUMANote, "MPOL_BIND") {
		t.Errorf("NUMA stats: bound %v nodes %v note %q", st.NUMABound, st.NUMANodes, st.NUMANote)
	}
	b, err := os.ReadFile("/proc/self/numa_maps")
	if err != nil {
		t.Skipf("no numa_maps: %v", err)
	}
	addr := fmt.Sprintf("%x bind:0", addrOf(r.Bytes()))
	if !strings.Contains(string(b), addr) {
		t.Errorf("numa_maps has no %q", addr)
	}
}
