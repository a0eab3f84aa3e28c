package main

import (
	"bytes"
	"os"
	"regexp"
	"strconv"
	"strings"
	"testing"

	"kvtier.dev/kvtier/nvme"
)

// TestRun runs the example end to end (on the simulated device without a
// GPU) and checks that every tier served hits and that blocks were loaded:
// run itself fails if a loaded block differs from what was cached.
func TestRun(t *testing.T) {
	var out bytes.Buffer
	if err := run(&out, ""); err != nil {
		t.Fatalf("%v\n%s", err, out.String())
	}
	t.Log("\n" + out.String())
	m := regexp.MustCompile(`hits gpu (\d+), host (\d+), nvme (\d+); (\d+) loaded`).FindStringSubmatch(out.String())
	if m == nil {
		t.Fatal("no summary line in the output")
	}
	for i, name := range []string{"gpu hits", "host hits", "nvme hits", "loaded blocks"} {
		if n, _ := strconv.Atoi(m[i+1]); n == 0 {
			t.Errorf("%s: 0", name)
		}
	}
}

// TestRunTwiceStartsWarm runs the example twice over one NVMe directory: the
// second run adopts the blocks the first left on the drive, serves NVMe hits
// from them, and every block it loads checks out byte for byte.
func TestRunTwiceStartsWarm(t *testing.T) {
	dir := t.TempDir()
	var first, second bytes.Buffer
	if err := run(&first, dir); err != nil {
		t.Fatalf("first run: %v\n%s", err, first.String())
	}
	if strings.Contains(first.String(), "adopted") {
		t.Errorf("the first run adopted blocks from an empty directory:\n%s", first.String())
	}
	if err := run(&second, dir); err != nil {
		t.Fatalf("second run: %v\n%s", err, second.String())
	}
	t.Log("\n" + second.String())
	m := regexp.MustCompile(`nvme: adopted (\d+) of the (\d+) blocks`).FindStringSubmatch(second.String())
	if m == nil {
		t.Fatal("the second run adopted nothing")
	}
	if n, _ := strconv.Atoi(m[1]); n == 0 {
		t.Errorf("adopted 0 of %s blocks", m[2])
	}
	h := regexp.MustCompile(`hits gpu (\d+), host (\d+), nvme (\d+)`).FindStringSubmatch(second.String())
	if h == nil {
		t.Fatal("no summary line in the second run's output")
	}
	n1 := regexp.MustCompile(`hits gpu (\d+), host (\d+), nvme (\d+)`).FindStringSubmatch(first.String())
	if a, b := atoi(h[3]), atoi(n1[3]); a <= b {
		t.Errorf("nvme hits: %d in the second run, %d in the first; want more after starting warm", a, b)
	}
}

func atoi(s string) int { n, _ := strconv.Atoi(s); return n }

func TestArgs(t *testing.T) {
	var errb bytes.Buffer
	if dir, err := parseArgs([]string{"-nvme-dir", "d"}, &errb); err != nil || dir != "d" {
		t.Fatalf("-nvme-dir d: %q %v", dir, err)
	}
	if _, err := parseArgs([]string{"-nvme-dir", "d", "extra"}, &errb); err == nil || !strings.Contains(err.Error(), `unexpected argument "extra"`) {
		t.Fatalf("an extra argument: %v", err)
	}
}

// TestCorruptBlocksAreRecomputed flips a bit in the payload of every NVMe
// slot between runs: the next run's loads of them fail, and it recomputes
// those requests instead of stopping; the store clears the bad slots on
// disk, so that the runs after it neither adopt nor meet them again.
func TestCorruptBlocksAreRecomputed(t *testing.T) {
	dir := t.TempDir()
	var out bytes.Buffer
	if err := run(&out, dir); err != nil {
		t.Fatalf("first run: %v\n%s", err, out.String())
	}
	// The layout, from the store itself.
	s, err := nvme.Open(nvme.Config{Dirs: []string{dir}, SlotsPerFile: nvmeSlots, BlockBytes: blockBytes, MaxTokens: blockTokens})
	if err != nil {
		t.Fatal(err)
	}
	info, kept := s.Info(), s.Len()
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	if kept == 0 {
		t.Fatal("the first run left no block on the drive")
	}
	f, err := os.OpenFile(info.Files[0], os.O_RDWR, 0)
	if err != nil {
		t.Fatal(err)
	}
	for i := range info.Slots {
		off := info.FirstSlotOffset + int64(i)*info.SlotBytes + int64(info.HeaderBytes) + 100
		var b [1]byte
		if _, err := f.ReadAt(b[:], off); err != nil {
			t.Fatal(err)
		}
		b[0] ^= 0x20
		if _, err := f.WriteAt(b[:], off); err != nil {
			t.Fatal(err)
		}
	}
	f.Close()

	recomputed := regexp.MustCompile(`(\d+) requests recomputed after a failed load`)
	cleared := regexp.MustCompile(`nvme store: (\d+) corrupt blocks dropped, (\d+) cleared on disk`)
	// Each damaged block is met at most once over all the runs: the first
	// load that meets it clears it on disk. (Before, every restart adopted
	// the same blocks again and each run met them anew.)
	met := 0
	for r := range 4 {
		out.Reset()
		if err := run(&out, dir); err != nil {
			t.Fatalf("run %d after the damage failed: %v\n%s", r+1, err, out.String())
		}
		m, c := recomputed.FindStringSubmatch(out.String()), cleared.FindStringSubmatch(out.String())
		if m == nil || c == nil || c[1] != c[2] {
			t.Fatalf("run %d: corrupt blocks not all cleared on disk, or no summary:\n%s", r+1, out.String())
		}
		if r == 0 && atoi(m[1]) == 0 {
			t.Fatalf("no request was recomputed after a failed load:\n%s", out.String())
		}
		met += atoi(c[1])
		t.Logf("run %d: %s requests recomputed, %s corrupt blocks met", r+1, m[1], c[1])
	}
	if met > kept {
		t.Fatalf("the runs met %d corrupt blocks, but only %d were damaged: some were met twice", met, kept)
	}
}
