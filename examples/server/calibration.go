package main

import (
	"fmt"
	"log/slog"
	"strings"
	"time"

	"kvtier.dev/examples/server/internal/engine"
	"kvtier.dev/kvtier"
	"kvtier.dev/kvtier/cost"
	"kvtier.dev/kvtier/transfer"
)

// calibration is the server's cost-model calibration (kvtier/cost): what
// the planner prices prefills and host loads by. With -cost-learn the
// engine feeds it every clean measurement (engine.Observer), so that a
// server started on the presets, or on a file made elsewhere, comes to plan
// by what its own GPU and link do; -cost-calibration-out keeps what it
// learned for the next start or for `kvtier replay --calibration`.
type calibration struct {
	cal   *cost.Calibration
	model cost.Model
	host  cost.Link // the host tier's link to the GPU, as the planner names it
	// rawBlock and wireBlock are a block's bytes as the GPU holds it and
	// as it crosses the host link (-host-codec's encoding; equal without
	// one): a load's bytes are the link's samples as wire bytes.
	rawBlock, wireBlock int64
	// codec is the host tier's codec as the planner prices it (zero
	// without -host-codec): its kernels' launches are learned.
	codec cost.Codec
	learn bool
	log   *slog.Logger
}

// openCalibration loads -cost-calibration, or starts from the presets
// with -cost-learn. It returns nil for a model kvtier/cost has no preset
// of (tiny), and when there is neither a file nor learning (the presets,
// taken as exact).
func openCalibration(c *config, s shape) (*calibration, error) {
	if _, err := cost.LookupModel(s.model.Name); err != nil || (c.costCalibration == "" && !c.costLearn) {
		return nil, nil // config.validate refused -cost-calibration-out here
	}
	pc, err := plannerConfig(c, s)
	if err != nil {
		return nil, err
	}
	k := &calibration{model: pc.Model, host: pc.Paths[cost.TierHost].Ingress, learn: c.costLearn, log: c.log,
		rawBlock: pc.Model.KVBytesPerTokenPerRank(1) * int64(pc.BlockTokens)}
	k.codec = pc.Paths[cost.TierHost].Codec
	k.wireBlock = k.codec.EncodedBlockBytes(&pc.Model, pc.BlockTokens, 1)
	if c.costCalibration != "" {
		if k.cal, err = cost.LoadCalibrationFile(c.costCalibration, pc.GPU, pc.Model); err != nil {
			return nil, fmt.Errorf("-cost-calibration: %w", err)
		}
	} else if k.cal, err = cost.NewCalibration(pc.GPU); err != nil {
		return nil, fmt.Errorf("cost model: %w", err)
	}
	return k, nil
}

// setRuntime names what computes the passes the calibration learns from
// (cost.Calibration.SetRuntime): samples another runtime measured, such as
// a file written before the attention kernel changed, are dropped and their
// fit becomes the prior, so the planner, and the replay of what this
// server writes, price passes by this runtime's own.
func (k *calibration) setRuntime(name string) error {
	if k == nil {
		return nil
	}
	n, err := k.cal.SetRuntime(name)
	if err != nil {
		return fmt.Errorf("cost model: %w", err)
	}
	if n > 0 {
		k.log.Info("server: calibration: samples of another runtime dropped; their fit is the prior", "runtime", name, "dropped", n)
	}
	return nil
}

// setAttentionWave says how many query rows × heads one wave of the GPU's
// attention kernel holds (cost.Calibration.SetAttentionWave): a pass of
// fewer rows over a prefix costs about what a wave's rows do.
func (k *calibration) setAttentionWave(wave int) error {
	if k == nil {
		return nil
	}
	if err := k.cal.SetAttentionWave(wave); err != nil {
		return fmt.Errorf("cost model: %w", err)
	}
	return nil
}

// observer is what the engine feeds, or nil when the server does not learn.
func (k *calibration) observer() engine.Observer {
	if k == nil || !k.learn {
		return nil
	}
	return k
}

// Pass implements engine.Observer: one prefill sample. A pass with loads
// teaches the load slowdown (kvtier/cost slowdown.go) when they came over
// the host link; one with loads from NVMe is not taken: their time in
// flight is mostly the drive's, not the link's copying into the GPU.
func (k *calibration) Pass(s cost.PrefillSample, from kvtier.Tier) {
	if s.LoadBytes > 0 {
		if from != kvtier.Host {
			return
		}
		s.LoadLink, s.LoadBytes = k.host.Name, k.wire(s.LoadBytes)
		// A coded host tier's onboards land whole: the copy engine
		// decodes whole blocks (transfer.Config.CodecLayerGroups 1).
		s.LoadWhole = k.wireBlock != k.rawBlock
	}
	s.TP = 1
	if err := k.cal.AddPrefillSample(k.model, s); err != nil {
		k.log.Debug("server: calibration: prefill sample refused", "err", err)
	}
}

// Load implements engine.Observer: a copy sample of the host link. Loads
// from NVMe cross two hops (the drive, then the host link through a
// staging buffer) and are not taken: their time is not one link's.
func (k *calibration) Load(tier kvtier.Tier, bytes int64, d time.Duration) {
	if tier != kvtier.Host {
		return
	}
	if err := k.cal.AddCopy(k.host, k.wire(bytes), d); err != nil {
		k.log.Debug("server: calibration: copy sample refused", "err", err)
	}
}

// codecKernels is what the copy engines tell of their timed codec
// launches (stack.Options.OnCodecKernel), or nil when the server does not
// learn or the host tier is not coded.
func (k *calibration) codecKernels() func(transfer.CodecKernel) {
	if k == nil || !k.learn || !k.codec.Enabled() {
		return nil
	}
	return func(l transfer.CodecKernel) {
		if err := k.cal.AddCodecKernel(k.codec, l.Encode, l.RawBytes, l.Elapsed); err != nil {
			k.log.Debug("server: calibration: codec launch refused", "err", err)
		}
	}
}

// wire is what bytes of KV as the GPU holds it took on the host link: the
// host tier's encoded blocks. A compressed load's time is its wire bytes'
// (the codec's decode overlaps the copy, fp8-codec-path-h200.md): counted
// as the GPU's bytes, the link would look twice as fast.
func (k *calibration) wire(bytes int64) int64 {
	if k.wireBlock == k.rawBlock || k.rawBlock <= 0 {
		return bytes
	}
	return max(1, bytes/k.rawBlock*k.wireBlock+bytes%k.rawBlock*k.wireBlock/k.rawBlock)
}

// addDriveIO takes one measured NVMe read or write (its link l) as a copy
// sample: the drive's links are learned and kept with the rest.
func (k *calibration) addDriveIO(l cost.Link, bytes int64, d time.Duration) {
	if err := k.cal.AddCopy(l, bytes, d); err != nil {
		k.log.Debug("server: calibration: drive sample refused", "link", l.Name, "err", err)
	}
}

// close writes the calibration to -cost-calibration-out, and says in the
// log what it learned.
func (k *calibration) close(path string) error {
	if k == nil {
		return nil
	}
	f := k.cal.Current()
	attrs := []any{"prefill_samples", f.Prefill.Samples, "outliers", f.Prefill.Outliers, "error_width", f.Prefill.ErrorWidth}
	for _, l := range f.Links {
		attrs = append(attrs, "link_"+l.Name+"_GBps", l.BandwidthBytesPerS/1e9, "link_"+l.Name+"_samples", l.Samples)
	}
	for _, l := range f.CodecKernels {
		name := strings.ReplaceAll(l.Name, " ", "_")
		attrs = append(attrs, "codec_"+name+"_GBps", l.BandwidthBytesPerS/1e9, "codec_"+name+"_us", l.LatencySeconds*1e6,
			"codec_"+name+"_samples", l.Samples)
	}
	k.log.Info("server: calibration", attrs...)
	if path == "" {
		return nil
	}
	if err := k.cal.WriteFile(path); err != nil {
		return fmt.Errorf("-cost-calibration-out: %w", err)
	}
	return nil
}
