package main

import (
	"fmt"
	"io"
	"os"

	"kvtier.dev/kvtier/cost"
)

// The calculator's calibration: --calibration FILE replaces the presets by
// a fit (a server's, or one written before), --prefill-samples FILE.jsonl
// fits prefill from measurements (and prints how well), and
// --write-calibration FILE saves the result.

// calcCalibration is the calibration part of the report.
type calcCalibration struct {
	Fit     *cost.Fit          `json:"fit"`
	Samples []calcSampleReport `json:"samples,omitempty"`
}

// calcSampleReport is one prefill sample and how three models predict
// it: the fit to every sample, the fit to every other sample (leave one
// out), and the presets. Errors are predicted over measured, minus 1.
type calcSampleReport struct {
	cost.PrefillSample
	FittedSeconds     float64 `json:"fitted_seconds"`
	FittedError       float64 `json:"fitted_error"`
	LeaveOneOutSecond float64 `json:"leave_one_out_seconds"`
	LeaveOneOutError  float64 `json:"leave_one_out_error"`
	PresetSeconds     float64 `json:"preset_seconds"`
	PresetError       float64 `json:"preset_error"`
}

// calcLoadCalibration builds the calculator's calibration for s's GPU
// and model: from path (a calibration file or `kvtier probe --json`), then
// samples added; nil when neither is given and nothing is to be written.
func calcLoadCalibration(s *cost.Scenario, path, samplesPath string, write bool) (*cost.Calibration, []cost.PrefillSample, error) {
	if path == "" && samplesPath == "" && !write {
		return nil, nil, nil
	}
	var cal *cost.Calibration
	var err error
	if path != "" {
		if cal, err = cost.LoadCalibrationFile(path, s.GPU, s.Model); err != nil {
			return nil, nil, fmt.Errorf("--calibration %w", err)
		}
	} else if cal, err = cost.NewCalibration(s.GPU); err != nil {
		return nil, nil, err
	}
	if samplesPath == "" {
		return cal, nil, nil
	}
	f, err := os.Open(samplesPath)
	if err != nil {
		return nil, nil, fmt.Errorf("--prefill-samples: %w", err)
	}
	defer f.Close()
	samples, err := cost.ReadPrefillSamples(f)
	if err != nil {
		return nil, nil, fmt.Errorf("--prefill-samples %s: %w", samplesPath, err)
	}
	if len(samples) == 0 {
		return nil, nil, fmt.Errorf("--prefill-samples %s: no sample", samplesPath)
	}
	if len(samples) > cost.MaxPrefillSamples {
		return nil, nil, fmt.Errorf("--prefill-samples %s: %d samples; a calibration keeps the newest %d, give at most that many",
			samplesPath, len(samples), cost.MaxPrefillSamples)
	}
	if err := cal.AddPrefillSamples(samples...); err != nil {
		return nil, nil, fmt.Errorf("--prefill-samples %s: %w", samplesPath, err)
	}
	return cal, samples, nil
}

// calcCalibrationReport predicts each sample three ways.
func calcCalibrationReport(cfg calcConfig) (*calcCalibration, error) {
	s := &cfg.scenario
	fit := cfg.cal.Current()
	r := &calcCalibration{Fit: fit}
	if len(cfg.samples) == 0 {
		return r, nil
	}
	loo, err := cost.LeaveOneOut(s.GPU, cfg.samples, s.Model)
	if err != nil {
		return nil, err
	}
	for i, smp := range cfg.samples {
		fitted, err := fit.Predict(smp, &s.GPU, s.Model)
		if err != nil {
			return nil, err
		}
		preset, err := (*cost.Fit)(nil).Predict(smp, &s.GPU, s.Model)
		if err != nil {
			return nil, err
		}
		r.Samples = append(r.Samples, calcSampleReport{PrefillSample: smp,
			FittedSeconds: fitted.Seconds(), FittedError: fitted.Seconds()/smp.Seconds - 1,
			LeaveOneOutSecond: loo[i].Seconds(), LeaveOneOutError: loo[i].Seconds()/smp.Seconds - 1,
			PresetSeconds: preset.Seconds(), PresetError: preset.Seconds()/smp.Seconds - 1})
	}
	return r, nil
}

func calcPrintCalibration(w io.Writer, cfg calcConfig, r *calcCalibration) {
	s := &cfg.scenario
	fmt.Fprintf(w, "calibration\n%s", r.Fit.Describe(&s.Model, s.TP))
	if len(r.Samples) == 0 {
		fmt.Fprintln(w)
		return
	}
	fmt.Fprintf(w, "\n  %-16s %3s %8s %8s %10s %18s %18s %18s\n", "model", "tp", "prefix", "tokens", "measured", "fitted", "leave-one-out", "presets")
	for _, x := range r.Samples {
		fmt.Fprintf(w, "  %-16s %3d %8d %8d %10s %10s %+6.1f%% %10s %+6.1f%% %10s %+6.1f%%\n", x.Model, max(1, x.TP), x.Prefix, x.Tokens,
			calcDur(x.Seconds), calcDur(x.FittedSeconds), 100*x.FittedError, calcDur(x.LeaveOneOutSecond), 100*x.LeaveOneOutError,
			calcDur(x.PresetSeconds), 100*x.PresetError)
	}
	fmt.Fprintln(w)
}
