package cudastream

import (
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
)

// drvSysfsPCIRoot is where Linux lists PCI devices. Tests point the readers
// at a directory of their own.
const drvSysfsPCIRoot = "/sys/bus/pci/devices"

// drvPCIFacts are what sysfs knows about a device that the driver API does
// not report. Unreadable fields are 0, numaNode -1.
type drvPCIFacts struct {
	numaNode  int
	linkGen   int
	linkWidth int
}

// drvReadPCIFacts reads numa_node, current_link_speed and current_link_width
// of busID (as "0000:3b:00.0") under root. A file that is missing or does not
// parse leaves its field at the unknown value: a VM may hide any of them.
func drvReadPCIFacts(root, busID string) drvPCIFacts {
	f := drvPCIFacts{numaNode: -1}
	dir := filepath.Join(root, busID)
	if s, err := os.ReadFile(filepath.Join(dir, "numa_node")); err == nil {
		if n, err := strconv.Atoi(strings.TrimSpace(string(s))); err == nil && n >= 0 {
			f.numaNode = n
		}
	}
	if s, err := os.ReadFile(filepath.Join(dir, "current_link_speed")); err == nil {
		if g, err := drvParseLinkSpeed(string(s)); err == nil {
			f.linkGen = g
		}
	}
	if s, err := os.ReadFile(filepath.Join(dir, "current_link_width")); err == nil {
		if w, err := drvParseLinkWidth(string(s)); err == nil {
			f.linkWidth = w
		}
	}
	return f
}

// drvLinkGens maps a PCIe transfer rate per lane (GT/s) to its generation.
var drvLinkGens = []struct {
	gtps float64
	gen  int
}{{2.5, 1}, {5, 2}, {8, 3}, {16, 4}, {32, 5}, {64, 6}, {128, 7}}

// drvParseLinkSpeed turns sysfs current_link_speed ("32.0 GT/s PCIe", or
// "8 GT/s" on older kernels) into the PCIe generation (5).
func drvParseLinkSpeed(s string) (int, error) {
	fields := strings.Fields(s)
	if len(fields) < 2 || !strings.EqualFold(fields[1], "GT/s") {
		return 0, fmt.Errorf("link speed %q: want \"<rate> GT/s\"", s)
	}
	rate, err := strconv.ParseFloat(fields[0], 64)
	if err != nil {
		return 0, fmt.Errorf("link speed %q: rate: %w", s, err)
	}
	for _, g := range drvLinkGens {
		if rate > g.gtps*0.95 && rate < g.gtps*1.05 {
			return g.gen, nil
		}
	}
	return 0, fmt.Errorf("link speed %q: %g GT/s is no PCIe generation", s, rate)
}

// drvParseLinkWidth turns sysfs current_link_width ("16", some tools print
// "x16") into the lane count.
func drvParseLinkWidth(s string) (int, error) {
	t := strings.TrimPrefix(strings.ToLower(strings.TrimSpace(s)), "x")
	w, err := strconv.Atoi(t)
	if err != nil {
		return 0, fmt.Errorf("link width %q: %w", s, err)
	}
	switch w {
	case 1, 2, 4, 8, 12, 16, 32:
		return w, nil
	}
	return 0, fmt.Errorf("link width %q: %d lanes is no PCIe width", s, w)
}

// drvNormalizeBusID turns the driver's bus id ("0000:3B:00.0", or with an
// 8-digit domain "00000000:3b:00.0") into sysfs's form, "0000:3b:00.0".
func drvNormalizeBusID(s string) (string, error) {
	s = strings.TrimSpace(s)
	dom, rest, ok := strings.Cut(s, ":")
	if !ok {
		return "", fmt.Errorf("PCI bus id %q: want domain:bus:device.function", s)
	}
	bus, rest, ok := strings.Cut(rest, ":")
	if !ok {
		return "", fmt.Errorf("PCI bus id %q: want domain:bus:device.function", s)
	}
	dev, fn, ok := strings.Cut(rest, ".")
	if !ok {
		return "", fmt.Errorf("PCI bus id %q: want domain:bus:device.function", s)
	}
	parts := []struct {
		text string
		max  uint64
	}{{dom, 0xffffffff}, {bus, 0xff}, {dev, 0x1f}, {fn, 0x7}}
	var v [4]uint64
	for i, p := range parts {
		n, err := strconv.ParseUint(p.text, 16, 32)
		if err != nil || n > p.max || p.text == "" {
			return "", fmt.Errorf("PCI bus id %q: field %q is not hex up to %#x", s, p.text, p.max)
		}
		v[i] = n
	}
	return fmt.Sprintf("%04x:%02x:%02x.%x", v[0], v[1], v[2], v[3]), nil
}
