// Command remotereplay shows what a remote tier buys in TTFT on the trace
// bundled with kvtier/trace: it replays it (kvtier/replay) under the
// chosen strategy once per remote tier size, the remote link being what
// benchmarks/remote measured (the "tier read" rate and the "tier read
// latency" of its results file), and writes the report (text and JSON)
// and its plots. --bandwidth replaces the measured bandwidth with a given
// one (say, a data-centre network's share per GPU), and the report says so.
//
//	go run ./benchmarks/remotereplay --config benchmarks/remotereplay/small-local.json \
//	    --measured benchmarks/results/remote-local.json --out benchmarks/results/remote-replay
package main

import (
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"kvtier.dev/internal/replayplot"
	"kvtier.dev/kvtier/replay"
)

func main() {
	config := flag.String("config", "", "replay config (JSON, over replay.DefaultConfig); empty: the default")
	measured := flag.String("measured", "benchmarks/results/remote-local.json", "benchmarks/remote's results file: the remote link's figures")
	sizes := flag.String("sizes", "0,16GiB,32GiB,64GiB,128GiB", "remote tier sizes, comma separated (0: none)")
	out := flag.String("out", "benchmarks/results/remote-replay", "directory for report.txt, report.json and the plots")
	bandwidth := flag.Float64("bandwidth", 0, "the remote link's bandwidth per GPU in GB/s, instead of the measured one (0: measured)")
	flag.Parse()
	if err := run(*config, *measured, *sizes, *out, *bandwidth); err != nil {
		fmt.Fprintln(os.Stderr, "remotereplay:", err)
		os.Exit(1)
	}
}

func run(configPath, measuredPath, sizeList, out string, gbps float64) error {
	cfg := replay.DefaultConfig()
	if configPath != "" {
		f, err := os.Open(configPath)
		if err != nil {
			return err
		}
		cfg, err = replay.LoadConfig(f)
		f.Close()
		if err != nil {
			return fmt.Errorf("%s: %w", configPath, err)
		}
	}
	link, err := replay.RemoteLinkFromResults(measuredPath)
	if err != nil {
		return err
	}
	if gbps != 0 {
		link.Name = "remote-given"
		link.BandwidthBytesPerS = gbps * 1e9
		link.Source = fmt.Sprintf("bandwidth %g GB/s given on the command line (not measured); latency from %s", gbps, link.Source)
		if err := link.Validate(); err != nil {
			return fmt.Errorf("--bandwidth: %w", err)
		}
	}
	var sizes []replay.Bytes
	for _, s := range strings.Split(sizeList, ",") {
		b, err := replay.ParseBytes(s)
		if err != nil {
			return fmt.Errorf("--sizes: %w", err)
		}
		sizes = append(sizes, b)
	}
	rep, err := replay.Run(replay.BundledSource(), cfg, replay.Options{SweepRemote: sizes, RemoteLink: link})
	if err != nil {
		return err
	}
	if err := os.MkdirAll(out, 0o755); err != nil {
		return err
	}
	var text strings.Builder
	fmt.Fprintf(&text, "command: %s\n", strings.Join(os.Args, " "))
	fmt.Fprintf(&text, "remote link: %s\n\n", link.Source)
	if err := rep.WriteText(&text); err != nil {
		return err
	}
	if err := os.WriteFile(filepath.Join(out, "report.txt"), []byte(text.String()), 0o644); err != nil {
		return err
	}
	jf, err := os.Create(filepath.Join(out, "report.json"))
	if err != nil {
		return err
	}
	if err := rep.WriteJSON(jf); err != nil {
		jf.Close()
		return err
	}
	if err := jf.Close(); err != nil {
		return err
	}
	if _, err := replayplot.Write(rep, out); err != nil {
		return err
	}
	fmt.Print(text.String())
	return nil
}
