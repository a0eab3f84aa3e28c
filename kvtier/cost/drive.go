package cost

import (
	"encoding/json"
	"fmt"
	"os"
	"time"

	"kvtier.dev/internal/results"
)

// Drive is an NVMe tier's drive as measured: the link its loads read
// through and the link its writes take.
type Drive struct {
	Read, Write Link
}

// WriteLinkName names the write direction of the drive link named name,
// as a Calibration keeps it.
func WriteLinkName(name string) string { return name + " write" }

// PresetDrive is the drive of a link preset: writes at its read rate.
func PresetDrive(read Link) Drive {
	w := read
	w.Name = WriteLinkName(read.Name)
	return Drive{Read: read, Write: w}
}

// LoadDrive reads a drive's links from the results file `kvtier probe
// --nvme DIR --json FILE` wrote: the rows "drive read" and "drive write"
// (GiB/s, median) and their latencies "drive read latency" and "drive write
// latency" (us, median), one block-sized I/O at a time as the tier does
// them. The read link is named "drive-<machine>".
func LoadDrive(path string) (Drive, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return Drive{}, err
	}
	var f results.File
	if err := json.Unmarshal(data, &f); err != nil {
		return Drive{}, fmt.Errorf("%s: %w", path, err)
	}
	var rate, lat [2]float64 // read, write
	for _, r := range f.Rows {
		for i, name := range [2]string{"drive read", "drive write"} {
			switch {
			case r.Name == name && r.Unit == "GiB/s":
				rate[i] = r.Median
			case r.Name == name+" latency" && r.Unit == "us":
				lat[i] = r.Median
			}
		}
	}
	if rate[0] <= 0 || rate[1] <= 0 || lat[0] <= 0 || lat[1] <= 0 {
		return Drive{}, fmt.Errorf("%s: want positive medians in the rows \"drive read\" and \"drive write\" (GiB/s) and their \"latency\" rows (us)", path)
	}
	name := "drive-" + f.Machine
	d := Drive{
		Read: Link{Name: name, BandwidthBytesPerS: rate[0] * (1 << 30), Latency: time.Duration(lat[0] * 1e3),
			Source: fmt.Sprintf("%s: drive read %.3g GiB/s, %.3g us a block (machine %s, %s, commit %s)", path, rate[0], lat[0], f.Machine, f.Date, f.Commit)},
		Write: Link{Name: WriteLinkName(name), BandwidthBytesPerS: rate[1] * (1 << 30), Latency: time.Duration(lat[1] * 1e3),
			Source: fmt.Sprintf("%s: drive write %.3g GiB/s, %.3g us a block", path, rate[1], lat[1])},
	}
	for _, l := range []*Link{&d.Read, &d.Write} {
		if err := l.Validate(); err != nil {
			return Drive{}, fmt.Errorf("%s: %s: %w", path, l.Name, err)
		}
	}
	return d, nil
}
