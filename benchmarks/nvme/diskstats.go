package main

import (
	"fmt"
	"os"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"
)

// diskStats reads the block device counters (/proc/diskstats) of the device
// that holds a file, so that each case can report how many device requests
// a block cost and how large they were: the shape of the I/O, which the
// bandwidth figures alone do not show. It reports nothing when the device
// cannot be found (overlay, tmpfs, other platforms).
type diskStats struct {
	name         string
	major, minor uint32
}

func newDiskStats(path string) *diskStats {
	var st unix.Stat_t
	if err := unix.Stat(path, &st); err != nil {
		return &diskStats{}
	}
	d := &diskStats{major: unix.Major(st.Dev), minor: unix.Minor(st.Dev)}
	d.name = d.read().name
	return d
}

func (d *diskStats) ok() bool { return d.name != "" }

// diskSample is one reading of a device's counters: requests completed,
// requests merged into others, and 512-byte sectors, for reads and writes.
type diskSample struct {
	name                                       string
	rd, rdMerged, rdSect, wr, wrMerged, wrSect uint64
}

func (d *diskStats) read() diskSample {
	b, err := os.ReadFile("/proc/diskstats")
	if err != nil {
		return diskSample{}
	}
	for _, line := range strings.Split(string(b), "\n") {
		f := strings.Fields(line)
		if len(f) < 11 || f[0] != strconv.Itoa(int(d.major)) || f[1] != strconv.Itoa(int(d.minor)) {
			continue
		}
		var v [8]uint64
		for i := range v {
			v[i], _ = strconv.ParseUint(f[3+i], 10, 64)
		}
		return diskSample{name: f[2], rd: v[0], rdMerged: v[1], rdSect: v[2], wr: v[4], wrMerged: v[5], wrSect: v[6]}
	}
	return diskSample{}
}

// diskDelta is what one direction of the device did during a pass (or a
// sum of passes). Other processes' I/O on the same device is included.
type diskDelta struct{ reqs, merged, sectors uint64 }

func (s diskSample) sub(before diskSample, write bool) diskDelta {
	if write {
		return diskDelta{s.wr - before.wr, s.wrMerged - before.wrMerged, s.wrSect - before.wrSect}
	}
	return diskDelta{s.rd - before.rd, s.rdMerged - before.rdMerged, s.rdSect - before.rdSect}
}

func (a diskDelta) add(b diskDelta) diskDelta {
	return diskDelta{a.reqs + b.reqs, a.merged + b.merged, a.sectors + b.sectors}
}

// per formats the requests per block, their mean size and the merges.
func (a diskDelta) per(blocks float64) string {
	if a.reqs == 0 {
		return "none"
	}
	return fmt.Sprintf("%.2f of %.0f KiB (+%.2f merged)", float64(a.reqs)/blocks,
		float64(a.sectors)*512/1024/float64(a.reqs), float64(a.merged)/blocks)
}

// queue lists the device's block-queue settings that shape the requests:
// how large one may be, how many memory segments it may have, the I/O
// scheduler (which merges adjacent requests) and whether merging is on.
func (d *diskStats) queue() string {
	dev := fmt.Sprintf("/sys/dev/block/%d:%d", d.major, d.minor)
	var parts []string
	for _, name := range []string{"max_sectors_kb", "max_segments", "scheduler", "nomerges", "rotational", "read_ahead_kb"} {
		for _, p := range []string{dev + "/queue/" + name, dev + "/../queue/" + name} {
			if b, err := os.ReadFile(p); err == nil {
				parts = append(parts, name+" "+strings.TrimSpace(string(b)))
				break
			}
		}
	}
	if len(parts) == 0 {
		return "queue settings unknown"
	}
	return strings.Join(parts, ", ")
}
