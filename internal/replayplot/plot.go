// Package replayplot draws a replay's report (kvtier/replay) as pictures.
// It lives apart from kvtier/replay so that the library does not link a
// plotting package; `kvtier replay --plot` and benchmarks/remotereplay use
// it.
package replayplot

import (
	"cmp"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"slices"

	"gonum.org/v1/plot"
	"gonum.org/v1/plot/plotter"
	"gonum.org/v1/plot/plotutil"
	"gonum.org/v1/plot/vg"

	"kvtier.dev/kvtier/replay"
)

// Write draws r's pictures into dir, each as SVG and PNG: ttft.{svg,png},
// the TTFT distribution of each strategy, and, after a host sweep,
// host-sweep.{svg,png}, the hit ratio per tier against host capacity, and
// after a remote sweep, remote-sweep.{svg,png}, TTFT against the remote
// tier's size. It returns the files written.
func Write(r *replay.Report, dir string) ([]string, error) {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, fmt.Errorf("replay: plot: %w", err)
	}
	pictures := []struct {
		name string
		draw func(*replay.Report) (*plot.Plot, error)
		want bool
	}{
		{"ttft", ttftPlot, true},
		{"host-sweep", hostSweepPlot, len(r.HostSweep) > 0},
		{"remote-sweep", remoteSweepPlot, r.RemoteSweep != nil && len(r.RemoteSweep.Points) > 0},
	}
	var files []string
	for _, pic := range pictures {
		if !pic.want {
			continue
		}
		p, err := pic.draw(r)
		if err != nil {
			return nil, err
		}
		if files, err = save(p, dir, pic.name, files); err != nil {
			return files, err
		}
	}
	return files, nil
}

// save writes p into dir as name.svg and name.png, appending each file
// written to files.
func save(p *plot.Plot, dir, name string, files []string) ([]string, error) {
	for _, ext := range []string{"svg", "png"} {
		f := filepath.Join(dir, name+"."+ext)
		if err := p.Save(7*vg.Inch, 4.5*vg.Inch, f); err != nil {
			return files, fmt.Errorf("replay: plot: %w", err)
		}
		files = append(files, f)
	}
	return files, nil
}

// ttftPlot draws each strategy's TTFT as a cumulative distribution, on a
// logarithmic time axis (TTFTs span milliseconds to minutes).
func ttftPlot(r *replay.Report) (*plot.Plot, error) {
	p := plot.New()
	p.Title.Text = "Time to first token: " + r.Trace
	p.X.Label.Text = "TTFT (s)"
	p.Y.Label.Text = "fraction of requests"
	p.X.Scale = plot.LogScale{}
	p.X.Tick.Marker = plot.LogTicks{Prec: -1}
	p.Legend.Top = false
	p.Legend.Left = false
	p.Add(plotter.NewGrid())
	floor := ttftFloor(r.Results)
	for i := range r.Results {
		s := &r.Results[i]
		pts := make(plotter.XYs, 0, len(s.TTFTQuantiles))
		for q, v := range s.TTFTQuantiles {
			pts = append(pts, plotter.XY{X: max(v, floor), Y: float64(q) / 100})
		}
		if len(pts) == 0 {
			continue
		}
		l, err := plotter.NewLine(pts)
		if err != nil {
			return nil, fmt.Errorf("replay: plot: %w", err)
		}
		l.Color = plotutil.Color(i)
		l.Dashes = plotutil.Dashes(i)
		l.Width = vg.Points(1.5)
		p.Add(l)
		p.Legend.Add(s.Strategy, l)
	}
	return p, nil
}

// ttftFloor is the smallest positive TTFT of any result (1 ms if none):
// a logarithmic axis cannot show 0, so smaller TTFTs are drawn at it.
func ttftFloor(results []replay.StrategyResult) float64 {
	floor := math.Inf(1)
	for i := range results {
		for _, v := range results[i].TTFTQuantiles {
			if v > 0 {
				floor = min(floor, v)
			}
		}
	}
	if math.IsInf(floor, 1) {
		floor = 1e-3
	}
	return floor
}

// hostSweepPlot draws the hit ratio per tier and overall against host
// capacity.
func hostSweepPlot(r *replay.Report) (*plot.Plot, error) {
	p := plot.New()
	p.Title.Text = "Block hit ratio against host capacity (" + r.Results[0].Strategy + ")"
	p.X.Label.Text = "host tier (GiB)"
	p.Y.Label.Text = "block hit ratio"
	p.Y.Min, p.Y.Max = 0, 1
	p.Legend.Top = true
	p.Add(plotter.NewGrid())
	pts := slices.Clone(r.HostSweep)
	slices.SortStableFunc(pts, func(a, b replay.SweepPoint) int { return int(a.HostBytes>>20 - b.HostBytes>>20) })
	err := addLines(p, pts, func(pt replay.SweepPoint) float64 { return float64(pt.HostBytes) / (1 << 30) }, []lineSeries[replay.SweepPoint]{
		{"all tiers", func(pt replay.SweepPoint) float64 { return pt.HitRatio.Overall }},
		{"gpu", func(pt replay.SweepPoint) float64 { return pt.HitRatio.GPU }},
		{"host", func(pt replay.SweepPoint) float64 { return pt.HitRatio.Host }},
		{"nvme", func(pt replay.SweepPoint) float64 { return pt.HitRatio.NVMe }},
	})
	if err != nil {
		return nil, err
	}
	return p, nil
}

// remoteSweepPlot draws the TTFT's mean and percentiles against the remote
// tier's size.
func remoteSweepPlot(r *replay.Report) (*plot.Plot, error) {
	sw := r.RemoteSweep
	p := plot.New()
	p.Title.Text = fmt.Sprintf("TTFT against remote tier size (%s, %.2f GB/s, %v per fetch)",
		r.Results[0].Strategy, sw.Link.BandwidthBytesPerS/1e9, sw.Link.Latency)
	p.X.Label.Text = "remote tier (GiB)"
	p.Y.Label.Text = "TTFT (s)"
	p.Y.Min = 0
	p.Legend.Top = true
	p.Add(plotter.NewGrid())
	pts := slices.Clone(sw.Points)
	slices.SortStableFunc(pts, func(a, b replay.RemotePoint) int { return cmp.Compare(a.RemoteBytes, b.RemoteBytes) })
	err := addLines(p, pts, func(pt replay.RemotePoint) float64 { return float64(pt.RemoteBytes) / (1 << 30) }, []lineSeries[replay.RemotePoint]{
		{"p90", func(pt replay.RemotePoint) float64 { return pt.TTFT.P90 }},
		{"mean", func(pt replay.RemotePoint) float64 { return pt.TTFT.Mean }},
		{"p50", func(pt replay.RemotePoint) float64 { return pt.TTFT.P50 }},
	})
	if err != nil {
		return nil, err
	}
	return p, nil
}

// lineSeries is one line of a plot over points P: its legend and its y.
type lineSeries[P any] struct {
	name string
	y    func(P) float64
}

// addLines draws each series over pts as a line with points, colored and
// shaped by its index, with a legend entry.
func addLines[P any](p *plot.Plot, pts []P, x func(P) float64, series []lineSeries[P]) error {
	for i, s := range series {
		xys := make(plotter.XYs, len(pts))
		for j, pt := range pts {
			xys[j] = plotter.XY{X: x(pt), Y: s.y(pt)}
		}
		l, sc, err := plotter.NewLinePoints(xys)
		if err != nil {
			return fmt.Errorf("replay: plot: %w", err)
		}
		l.Color, sc.Color = plotutil.Color(i), plotutil.Color(i)
		sc.Shape = plotutil.Shape(i)
		p.Add(l, sc)
		p.Legend.Add(s.name, l, sc)
	}
	return nil
}
