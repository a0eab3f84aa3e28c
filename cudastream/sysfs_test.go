package cudastream

import (
	"os"
	"path/filepath"
	"testing"
)

func TestDrvParseLinkSpeed(t *testing.T) {
	for _, c := range []struct {
		in   string
		gen  int
		fail bool
	}{
		{"32.0 GT/s PCIe\n", 5, false},
		{"16.0 GT/s PCIe", 4, false},
		{"8.0 GT/s PCIe", 3, false},
		{"8 GT/s", 3, false},
		{"5.0 GT/s PCIe", 2, false},
		{"2.5 GT/s PCIe", 1, false},
		{"64.0 GT/s PCIe", 6, false},
		{"  16 gt/s  ", 4, false},
		{"Unknown", 0, true},
		{"Unknown speed", 0, true},
		{"", 0, true},
		{"12.0 GT/s PCIe", 0, true},
		{"fast GT/s", 0, true},
		{"32.0 Gb/s", 0, true},
	} {
		gen, err := drvParseLinkSpeed(c.in)
		if (err != nil) != c.fail || gen != c.gen {
			t.Errorf("drvParseLinkSpeed(%q) = %d, %v; want %d, fail=%v", c.in, gen, err, c.gen, c.fail)
		}
	}
}

func TestDrvParseLinkWidth(t *testing.T) {
	for _, c := range []struct {
		in    string
		width int
		fail  bool
	}{
		{"16\n", 16, false},
		{"x8", 8, false},
		{"1", 1, false},
		{"0", 0, true},
		{"255", 0, true},
		{"", 0, true},
		{"sixteen", 0, true},
	} {
		w, err := drvParseLinkWidth(c.in)
		if (err != nil) != c.fail || w != c.width {
			t.Errorf("drvParseLinkWidth(%q) = %d, %v; want %d, fail=%v", c.in, w, err, c.width, c.fail)
		}
	}
}

func TestDrvNormalizeBusID(t *testing.T) {
	for _, c := range []struct{ in, want string }{
		{"0000:3B:00.0", "0000:3b:00.0"},
		{"00000000:3b:00.0", "0000:3b:00.0"},
		{"0001:c1:1f.7\x00", ""},
		{"0001:c1:1f.7", "0001:c1:1f.7"},
		{"3b:00.0", ""},
		{"0000:3b:00", ""},
		{"0000:3g:00.0", ""},
		{"0000:100:00.0", ""},
		{"0000:3b:20.0", ""},
		{"0000::00.0", ""},
	} {
		got, err := drvNormalizeBusID(c.in)
		if c.want == "" {
			if err == nil {
				t.Errorf("drvNormalizeBusID(%q) = %q, want an error", c.in, got)
			}
			continue
		}
		if err != nil || got != c.want {
			t.Errorf("drvNormalizeBusID(%q) = %q, %v; want %q", c.in, got, err, c.want)
		}
	}
}

func TestDrvReadPCIFacts(t *testing.T) {
	root := t.TempDir()
	dev := filepath.Join(root, "0000:3b:00.0")
	if err := os.MkdirAll(dev, 0o755); err != nil {
		t.Fatal(err)
	}
	write := func(name, s string) {
		t.Helper()
		if err := os.WriteFile(filepath.Join(dev, name), []byte(s), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	write("numa_node", "1\n")
	write("current_link_speed", "32.0 GT/s PCIe\n")
	write("current_link_width", "16\n")
	if got, want := drvReadPCIFacts(root, "0000:3b:00.0"), (drvPCIFacts{numaNode: 1, linkGen: 5, linkWidth: 16}); got != want {
		t.Errorf("full sysfs: %+v, want %+v", got, want)
	}
	write("numa_node", "-1\n")
	write("current_link_speed", "Unknown\n")
	if err := os.Remove(filepath.Join(dev, "current_link_width")); err != nil {
		t.Fatal(err)
	}
	if got, want := drvReadPCIFacts(root, "0000:3b:00.0"), (drvPCIFacts{numaNode: -1}); got != want {
		t.Errorf("VM-like sysfs: %+v, want %+v", got, want)
	}
	if got, want := drvReadPCIFacts(root, "0000:99:00.0"), (drvPCIFacts{numaNode: -1}); got != want {
		t.Errorf("missing device: %+v, want %+v", got, want)
	}
}
