package replay

import (
	"encoding/json"
	"io"
	"time"

	"kvtier.dev/kvtier"
)

// RequestRecord is one request of a replay, as it ended: what
// Options.OnRequest receives, and one line of `kvtier replay
// --requests-out FILE`, to compare request by request with a measured
// server's. Times are seconds on the replay's virtual clock, whose zero is
// the trace's (its arrivals are offsets from it). The block counts split
// the prompt's blocks by what its prefill did with them:
// UsedGPUBlocks + LoadedHostBlocks + LoadedNVMeBlocks + RecomputedBlocks +
// MissedBlocks = Blocks.
type RequestRecord struct {
	// Strategy is the strategy replayed: cost, reload, recompute,
	// gpu-only or none.
	Strategy string `json:"strategy"`
	// Index is the request's position in the trace, from 0, in arrival
	// order (the trace's order; lines skipped as malformed are not
	// counted).
	Index int64 `json:"index"`
	// ArrivalSeconds is its arrival, the trace's timestamp.
	ArrivalSeconds float64 `json:"arrival_s"`
	// StartSeconds is when its prefill started (its lookup), after it
	// queued for the GPU.
	StartSeconds float64 `json:"start_s"`
	// TTFTSeconds is its time to first token: the end of its prefill plus
	// its handling (Config.HandlingTime, HandlingTokenTime) less its
	// arrival, queueing included.
	TTFTSeconds float64 `json:"ttft_s"`
	// EndSeconds is when its last token came and it released its blocks.
	EndSeconds float64 `json:"end_s"`
	// InputTokens and OutputTokens are the trace's (the output capped by
	// Config.MaxOutputTokens).
	InputTokens  int `json:"input_tokens"`
	OutputTokens int `json:"output_tokens"`
	// Blocks is the prompt's blocks, its partial last one included.
	Blocks int `json:"blocks"`
	// UsedGPUBlocks were found on the GPU and used there.
	UsedGPUBlocks int `json:"used_gpu_blocks"`
	// LoadedHostBlocks and LoadedNVMeBlocks were loaded into the GPU from
	// the host tier and from the NVMe tier.
	LoadedHostBlocks int `json:"loaded_host_blocks"`
	LoadedNVMeBlocks int `json:"loaded_nvme_blocks"`
	// RecomputedBlocks were cached in a lower tier but recomputed: the
	// plan chose to, or it was forced (no GPU slot was free for the load).
	RecomputedBlocks int `json:"recomputed_blocks"`
	// MissedBlocks were cached nowhere the lookup reached (every block
	// under strategy none), and were computed.
	MissedBlocks int `json:"missed_blocks"`
	// PlannedSeconds is, under strategy cost, the cost model's prediction
	// of its prefill: from its plan (its start; after the fetch, with a
	// remote tier) to its first token, behind the loads queued before it.
	// Absent under the other strategies, and when the
	// planner failed (the report's plan_errors).
	PlannedSeconds float64 `json:"planned_s,omitempty"`
}

// RequestLines returns an Options.OnRequest that writes each record to w
// as one line of JSON, the fields in RequestRecord's order. The same trace
// and Config give byte-identical lines.
func RequestLines(w io.Writer) func(RequestRecord) error {
	enc := json.NewEncoder(w)
	return func(r RequestRecord) error { return enc.Encode(&r) }
}

// record hands the ending request's record to the OnRequest hook; its
// first error stops the replay (the run loop returns it).
func (e *engine) record(r *request) {
	if e.recordErr != nil {
		return
	}
	x := r.ext
	e.recordErr = e.onRequest(RequestRecord{
		Strategy:         e.strategy.String(),
		Index:            x.index,
		ArrivalSeconds:   recordSeconds(r.arrival),
		StartSeconds:     recordSeconds(r.started),
		TTFTSeconds:      recordSeconds(x.firstToken - r.arrival),
		EndSeconds:       recordSeconds(e.now),
		InputTokens:      r.inputTokens,
		OutputTokens:     r.outTokens,
		Blocks:           len(r.keys),
		UsedGPUBlocks:    x.used,
		LoadedHostBlocks: x.loadedFrom[kvtier.Host],
		LoadedNVMeBlocks: x.loadedFrom[kvtier.NVMe],
		RecomputedBlocks: x.recomputed,
		MissedBlocks:     x.missed,
		PlannedSeconds:   recordSeconds(x.planned),
	})
}

// recordSeconds is d in seconds, the float nearest its nanoseconds over
// 1e9 (one rounding, where Duration.Seconds has two), so that the lines
// read 11.908032521 rather than 11.908032520999999.
func recordSeconds(d time.Duration) float64 { return float64(d) / 1e9 }

// usesExt reports whether the replay's requests carry a requestExt.
func (e *engine) usesExt() bool { return e.cfg.DecodeOnGPU || e.onRequest != nil }
