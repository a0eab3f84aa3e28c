package replay

import (
	"errors"
	"fmt"
	"io"
	"strings"

	"kvtier.dev/kvtier/cost"
	"kvtier.dev/kvtier/costplan"
	"kvtier.dev/kvtier/trace"
)

// Source is a trace to replay, opened afresh for each strategy so that it
// streams (it is never held in memory).
type Source struct {
	// Name names the trace in the report and in errors.
	Name string
	// Open returns the trace's lines from the start.
	Open func() (io.ReadCloser, error)
	// Format and SkipBad are passed to trace.Reader.
	Format  trace.Format
	SkipBad bool
}

// BundledSource is the trace bundled with kvtier/trace.
func BundledSource() Source {
	return Source{Name: trace.BundledName, Format: trace.FormatMooncake,
		Open: func() (io.ReadCloser, error) { return io.NopCloser(trace.Bundled()), nil }}
}

// GeneratedSource is cfg's synthetic trace (kvtier/trace's generator),
// generated afresh as each strategy reads it: it streams, whatever its
// length. Blocks of 512 tokens are written as Mooncake lines, others in the
// native format.
func GeneratedSource(name string, cfg trace.GenConfig) Source {
	format := trace.FormatNative
	if cfg.BlockTokens == trace.MooncakeBlockTokens {
		format = trace.FormatMooncake
	}
	return Source{Name: name, Format: format, Open: func() (io.ReadCloser, error) {
		r, err := trace.NewGeneratedReader(cfg, format)
		if err != nil {
			return nil, fmt.Errorf("replay: %s: %w", name, err)
		}
		return io.NopCloser(r), nil
	}}
}

// FileSource is a trace file, gzip-compressed or not.
func FileSource(path string) Source {
	return Source{Name: path, Open: func() (io.ReadCloser, error) { return trace.Open(path) }}
}

// Options are a run's extras.
type Options struct {
	// Progress, when set, is called every 1,024 requests with the strategy
	// being replayed and the requests replayed so far under it.
	Progress func(s costplan.Strategy, requests int)
	// SweepHost replays the chosen strategy again at each host capacity.
	SweepHost []Bytes
	// SweepRemote replays the chosen strategy again with a remote tier of
	// each size behind the local tiers (remote.go), read over RemoteLink;
	// a size of 0 is the replay without one. It needs a host tier.
	SweepRemote []Bytes
	RemoteLink  cost.Link
	// OnRequest, when set, gets the record of every request of every
	// strategy of the report (not of the sweeps), as each request ends:
	// strategy by strategy, in the report's order, and within one in the
	// order the requests end (RequestRecord.Index gives their trace order).
	// An error it returns stops the replay, and Run returns it.
	// RequestLines writes them as JSON lines.
	OnRequest func(RequestRecord) error
}

// Run replays src under cfg's strategy and, with cfg.Baselines, under every
// other strategy, and returns the report. A strategy whose replay passes
// Config.MemoryBudget stops there and the others go on: Run then returns
// the report of those that finished, with Report.OverBudget naming the
// others, and an error that wraps each one's *BudgetError (a sweep that
// passes it ends the sweeps the same way; none runs when the chosen
// strategy passed it). Any other error returns no report.
func Run(src Source, cfg Config, opts Options) (*Report, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	chosen, _ := costplan.ParseStrategy(cfg.Strategy)
	order := []costplan.Strategy{chosen}
	if cfg.Baselines {
		for s := range costplan.NumStrategies {
			if s != chosen {
				order = append(order, s)
			}
		}
	}
	rep := &Report{Trace: src.Name, Config: cfg}
	var over []error
	for _, s := range order {
		res, info, err := runOne(src, cfg, s, opts.Progress, nil, opts.OnRequest)
		var be *BudgetError
		if errors.As(err, &be) {
			rep.OverBudget = append(rep.OverBudget, OverBudget{Strategy: s.String(), Line: be.Line, InFlightRequests: be.Requests, InFlightBytes: be.Bytes})
			rep.PeakInFlightRequests = max(rep.PeakInFlightRequests, be.Requests)
			rep.PeakInFlightBytes = max(rep.PeakInFlightBytes, be.Bytes)
			over = append(over, fmt.Errorf("replay: strategy %s: %w", s, err))
			continue
		}
		if err != nil {
			return nil, err
		}
		rep.Results = append(rep.Results, res)
		rep.Format, rep.SkippedLines, rep.BlockTokens, rep.BlockBytes = info.format, info.skipped, info.blockTokens, info.blockBytes
		rep.BreakEven = info.breakEven
		rep.PeakInFlightRequests = max(rep.PeakInFlightRequests, info.peakRequests)
		rep.PeakInFlightBytes = max(rep.PeakInFlightBytes, Bytes(info.peakBytes))
	}
	if len(rep.OverBudget) > 0 && rep.OverBudget[0].Strategy == chosen.String() {
		return rep, errors.Join(over...) // the sweeps replay the chosen strategy again
	}
	if err := sweeps(rep, src, cfg, chosen, opts); err != nil {
		var be *BudgetError
		if !errors.As(err, &be) {
			return nil, err
		}
		over = append(over, err)
	}
	return rep, errors.Join(over...)
}

// sweeps replays the chosen strategy at each host capacity and remote tier
// size of opts, into rep.
func sweeps(rep *Report, src Source, cfg Config, chosen costplan.Strategy, opts Options) error {
	for _, host := range opts.SweepHost {
		c := cfg
		c.HostBytes = host
		res, _, err := runOne(src, c, chosen, opts.Progress, nil, nil)
		if err != nil {
			return fmt.Errorf("replay: sweep at host %v: %w", host, err)
		}
		rep.HostSweep = append(rep.HostSweep, SweepPoint{HostBytes: host, HitRatio: res.HitRatio, TTFT: res.TTFT})
	}
	if len(opts.SweepRemote) > 0 {
		sw, err := sweepRemote(src, cfg, chosen, opts)
		if err != nil {
			return err
		}
		rep.RemoteSweep = sw
	}
	return nil
}

type runInfo struct {
	format       string
	skipped      int
	blockTokens  int
	blockBytes   int64
	peakRequests int64        // requests in flight at once, at most
	peakBytes    int64        // their estimated memory, at most
	remote       *remoteLevel // the remote tier and its counts, if any
	breakEven    []TierBreakEven
}

// noRequestErr explains a trace that gave no request: empty, or every line
// skipped as malformed (then how many, and the first reasons).
func noRequestErr(name string, rd *trace.Reader) error {
	if rd.Skipped() == 0 {
		return fmt.Errorf("replay: %s has no request", name)
	}
	kept := rd.SkippedErrors()
	reasons := make([]string, 0, 3)
	for _, le := range kept[:min(3, len(kept))] {
		reasons = append(reasons, le.Error())
	}
	return fmt.Errorf("replay: %s has no request: all %d lines were malformed and skipped (--skip-bad); the first: %s",
		name, rd.Skipped(), strings.Join(reasons, "; "))
}

// runOne replays src under one strategy.
// With rs, a remote tier of rs's size sits behind the local tiers; the
// runInfo.remote then holds its counts. onRequest, if set, gets each
// request's record as it ends.
func runOne(src Source, cfg Config, s costplan.Strategy, progress func(costplan.Strategy, int), rs *RemoteSpec,
	onRequest func(RequestRecord) error) (StrategyResult, runInfo, error) {
	e, err := newEngine(cfg, s)
	if err != nil {
		return StrategyResult{}, runInfo{}, err
	}
	e.rspec = rs
	e.onRequest = onRequest
	e.name = src.Name
	if progress != nil {
		e.progress = func(n int) { progress(s, n) }
	}
	if src.Open == nil {
		return StrategyResult{}, runInfo{}, errors.New("replay: Source.Open is nil")
	}
	rc, err := src.Open()
	if err != nil {
		return StrategyResult{}, runInfo{}, err
	}
	defer rc.Close()
	rd := trace.NewReader(rc, trace.Options{Format: src.Format, Name: src.Name, SkipBad: src.SkipBad})
	if err := e.run(rd); err != nil {
		return StrategyResult{}, runInfo{}, err
	}
	if rd.Requests() == 0 {
		return StrategyResult{}, runInfo{}, noRequestErr(src.Name, rd)
	}
	info := runInfo{format: rd.Format().String(), skipped: rd.Skipped(), blockTokens: e.bt, blockBytes: e.blockBytes,
		peakRequests: e.flight.peakRequests, peakBytes: e.flight.peakBytes}
	info.remote = e.remote
	if info.breakEven, err = e.breakEvens(); err != nil {
		return StrategyResult{}, runInfo{}, err
	}
	return e.result(), info, nil
}
