package main

import (
	"context"
	"fmt"
	"io"

	"kvtier.dev/internal/bytesize"
	"kvtier.dev/internal/results"
	"kvtier.dev/kvtier/nvme"
)

// probeNVMeConfig is `kvtier probe --nvme`'s: the directory the tier will
// use, and the I/O it measures.
type probeNVMeConfig struct {
	dir        string
	blockBytes int64
	bytes      int64
}

// probeNVMe measures the drive under pc.dir as the NVMe tier uses it
// (nvme.ProbeDrive: one block-sized direct I/O at a time, and single 4 KiB
// I/Os for the latency), cfg.runs rounds after a warm-up. The rows "drive
// read", "drive write" and their latencies are what `kvtier replay
// --nvme-link FILE` and the server's -nvme-link read.
func probeNVMe(ctx context.Context, pc probeNVMeConfig, cfg probeConfig, stdout io.Writer) (*results.File, error) {
	fmt.Fprintf(stdout, "drive under %s: %s blocks, %s a pass each way, %d rounds after a warm-up\n",
		pc.dir, bytesize.Format(pc.blockBytes), bytesize.Format(pc.bytes), cfg.runs)
	var read, write, readLat, writeLat []float64
	direct := true
	for round := -1; round < cfg.runs; round++ { // round -1 warms up
		p, err := nvme.ProbeDrive(ctx, nvme.ProbeConfig{Dir: pc.dir, BlockBytes: int(pc.blockBytes), Bytes: pc.bytes})
		if err != nil {
			return nil, err
		}
		direct = direct && p.Direct
		if round >= 0 {
			read, write = append(read, p.ReadBytesPerS/(1<<30)), append(write, p.WriteBytesPerS/(1<<30))
			readLat, writeLat = append(readLat, p.ReadLatency.Seconds()*1e6), append(writeLat, p.WriteLatency.Seconds()*1e6)
		}
	}
	f := results.New("probe-nvme", cfg.machine, cfg.commit)
	f.Command = cfg.command
	f.Add("drive write", "GiB/s", write, "")
	f.Add("drive read", "GiB/s", read, "")
	f.Add("drive write latency", "us", writeLat, "")
	f.Add("drive read latency", "us", readLat, "")
	mode := "O_DIRECT"
	if !direct {
		mode = "buffered, synced (the file system refused O_DIRECT)"
	}
	f.Notes = append(f.Notes, fmt.Sprintf("%s: one %s I/O at a time, %s, a write pass synced at its end, then read back; latency: the median of single 4 KiB I/Os (writes each synced)",
		pc.dir, bytesize.Format(pc.blockBytes), mode))
	return f, nil
}
