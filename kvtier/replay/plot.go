package replay

import (
	"fmt"
	"math"
	"os"
	"path/filepath"
	"slices"
	"time"

	"gonum.org/v1/plot"
	"gonum.org/v1/plot/plotter"
	"gonum.org/v1/plot/plotutil"
	"gonum.org/v1/plot/vg"
)

// quantiles returns the 0th to 100th percentiles of sorted ds, in seconds.
func quantiles(sorted []time.Duration) []float64 {
	if len(sorted) == 0 {
		return nil
	}
	q := make([]float64, 101)
	for i := range q {
		j := min(len(sorted)-1, i*len(sorted)/100)
		q[i] = sorted[j].Seconds()
	}
	return q
}

// Plot draws the report's pictures into dir, each as SVG and PNG:
// ttft.{svg,png}, the TTFT distribution of each strategy, and, after a host
// sweep, host-sweep.{svg,png}, the hit ratio per tier against host
// capacity, and after a remote sweep, remote-sweep.{svg,png}, TTFT against
// the remote tier's size. It returns the files written.
func (r *Report) Plot(dir string) ([]string, error) {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, fmt.Errorf("replay: plot: %w", err)
	}
	var files []string
	p, err := r.ttftPlot()
	if err != nil {
		return nil, err
	}
	for _, ext := range []string{"svg", "png"} {
		f := filepath.Join(dir, "ttft."+ext)
		if err := p.Save(7*vg.Inch, 4.5*vg.Inch, f); err != nil {
			return files, fmt.Errorf("replay: plot: %w", err)
		}
		files = append(files, f)
	}
	if len(r.HostSweep) > 0 {
		p, err = r.sweepPlot()
		if err != nil {
			return nil, err
		}
		for _, ext := range []string{"svg", "png"} {
			f := filepath.Join(dir, "host-sweep."+ext)
			if err := p.Save(7*vg.Inch, 4.5*vg.Inch, f); err != nil {
				return files, fmt.Errorf("replay: plot: %w", err)
			}
			files = append(files, f)
		}
	}
	if r.RemoteSweep != nil && len(r.RemoteSweep.Points) > 0 {
		p, err = r.remotePlot()
		if err != nil {
			return nil, err
		}
		for _, ext := range []string{"svg", "png"} {
			f := filepath.Join(dir, "remote-sweep."+ext)
			if err := p.Save(7*vg.Inch, 4.5*vg.Inch, f); err != nil {
				return files, fmt.Errorf("replay: plot: %w", err)
			}
			files = append(files, f)
		}
	}
	return files, nil
}

// ttftPlot draws each strategy's TTFT as a cumulative distribution, on a
// logarithmic time axis (TTFTs span milliseconds to minutes).
func (r *Report) ttftPlot() (*plot.Plot, error) {
	p := plot.New()
	p.Title.Text = "Time to first token: " + r.Trace
	p.X.Label.Text = "TTFT (s)"
	p.Y.Label.Text = "fraction of requests"
	p.X.Scale = plot.LogScale{}
	p.X.Tick.Marker = plot.LogTicks{Prec: -1}
	p.Legend.Top = false
	p.Legend.Left = false
	p.Add(plotter.NewGrid())
	floor := math.Inf(1)
	for i := range r.Results {
		for _, v := range r.Results[i].ttftQuantiles {
			if v > 0 {
				floor = min(floor, v)
			}
		}
	}
	if math.IsInf(floor, 1) {
		floor = 1e-3
	}
	for i := range r.Results {
		s := &r.Results[i]
		pts := make(plotter.XYs, 0, len(s.ttftQuantiles))
		for q, v := range s.ttftQuantiles {
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

// sweepPlot draws the hit ratio per tier and overall against host capacity.
func (r *Report) sweepPlot() (*plot.Plot, error) {
	p := plot.New()
	p.Title.Text = "Block hit ratio against host capacity (" + r.Results[0].Strategy + ")"
	p.X.Label.Text = "host tier (GiB)"
	p.Y.Label.Text = "block hit ratio"
	p.Y.Min, p.Y.Max = 0, 1
	p.Legend.Top = true
	p.Add(plotter.NewGrid())
	pts := slices.Clone(r.HostSweep)
	slices.SortStableFunc(pts, func(a, b SweepPoint) int { return int(a.HostBytes>>20 - b.HostBytes>>20) })
	err := addLines(p, pts, func(pt SweepPoint) float64 { return float64(pt.HostBytes) / (1 << 30) }, []lineSeries[SweepPoint]{
		{"all tiers", func(pt SweepPoint) float64 { return pt.HitRatio.Overall }},
		{"gpu", func(pt SweepPoint) float64 { return pt.HitRatio.GPU }},
		{"host", func(pt SweepPoint) float64 { return pt.HitRatio.Host }},
		{"nvme", func(pt SweepPoint) float64 { return pt.HitRatio.NVMe }},
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
