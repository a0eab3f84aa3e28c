package replay

import (
	"encoding/json"
	"fmt"
	"os"
	"time"

	"kvtier.dev/internal/results"
	"kvtier.dev/kvtier/cost"
)

// RemoteLinkFromResults reads a remote tier's link from a results file
// that measured it: benchmarks/remote's or `kvtier probe --remote --json`'s.
// The link's bandwidth is the "tier read" row (GiB/s, median) and its
// latency the "tier read latency" row (us, median): what one GPU fetching
// blocks through kvtier/remote gets, checksums and copies included.
func RemoteLinkFromResults(path string) (cost.Link, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return cost.Link{}, err
	}
	var f results.File
	if err := json.Unmarshal(data, &f); err != nil {
		return cost.Link{}, fmt.Errorf("%s: %w", path, err)
	}
	var gibps, us float64
	for _, r := range f.Rows {
		switch {
		case r.Name == "tier read" && r.Unit == "GiB/s":
			gibps = r.Median
		case r.Name == "tier read latency" && r.Unit == "us":
			us = r.Median
		}
	}
	if gibps <= 0 || us <= 0 {
		return cost.Link{}, fmt.Errorf("%s: no \"tier read\" (GiB/s) and \"tier read latency\" (us) rows with positive medians", path)
	}
	l := cost.Link{Name: "remote-" + f.Machine, BandwidthBytesPerS: gibps * (1 << 30), Latency: time.Duration(us * 1e3),
		Source: fmt.Sprintf("%s: tier read %.3g GiB/s, tier read latency %.3g us (machine %s, %s, commit %s)", path, gibps, us, f.Machine, f.Date, f.Commit)}
	if err := l.Validate(); err != nil {
		return cost.Link{}, fmt.Errorf("%s: %w", path, err)
	}
	return l, nil
}
