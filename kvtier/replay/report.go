package replay

import (
	"encoding/json"
	"fmt"
	"io"
	"slices"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"kvtier.dev/internal/results"
	"kvtier.dev/kvtier"
	"kvtier.dev/kvtier/costplan"
)

// tally is what an engine counts while it runs.
type tally struct {
	Requests, InputTokens, Blocks int64
	HitBlocks                     [kvtier.NumTiers]int64
	UsedBlocks, LoadedBlocks      int64
	LoadsFrom                     [kvtier.NumTiers]int64
	TokensReused                  int64
	LoadSavedCompute              results.DurationSum
	RecomputedBlocks              int64
	ForcedRecomputes              int64
	RecomputeSavedLink            results.DurationSum
	MissBlocks, UncachedBlocks    int64
	SpaceWaits                    int64
	insertTries                   int64 // InsertKeys into the GPU, first tries and retries (space.go)
	PlanErrors                    int64
	DroppedOffloads               int64
	Prefetched                    int64 // blocks copied from NVMe to the host tier for waiting requests
	// Sums over requests, which a time.Duration cannot always hold.
	PlannedTime, PlannedLoadAll results.DurationSum
	PlannedRecomputeAll         results.DurationSum
	PrefillBusy                 results.DurationSum
	OfferedPrefill              results.DurationSum // every prompt prefilled whole, no cache
	OfferedDecode               results.DurationSum // every decode step (Config.DecodeOnGPU)
	DecodeBusy                  results.DurationSum // the decode rounds on the GPU (Config.DecodeOnGPU)
	DecodeSteps, MaxDecoding    int64
	FirstArrival, LastArrival   time.Duration
	MemoryWait                  time.Duration // the first in line waited for GPU memory, a slot free
	KVNeededBlocks              int64         // the most blocks it and those running needed then
	Running, MaxRunning         int64         // requests prefilling or decoding
	QueueWait                   results.DurationSum
	End                         time.Duration
	BlockBytes                  int64
	CapacityBlocks              [kvtier.NumTiers]int64
	CodecChoice                 string // host_codec auto's (Config.HostCodec)
	copies                      [kvtier.NumTiers][kvtier.NumTiers]int64
}

// Report is a replay's outcome: the trace, the configuration, and one
// result per strategy, the chosen one first. It holds no map and no
// wall-clock time, so the same trace and configuration give byte-identical
// JSON.
type Report struct {
	Trace        string           `json:"trace"`
	Format       string           `json:"format"`
	SkippedLines int              `json:"skipped_lines"`
	Config       Config           `json:"config"`
	BlockTokens  int              `json:"block_tokens"`
	BlockBytes   int64            `json:"block_bytes"`
	Results      []StrategyResult `json:"results"`
	// HostSweep is the chosen strategy's hit ratio against host capacity
	// (--sweep-host), in increasing capacity.
	HostSweep []SweepPoint `json:"host_sweep,omitempty"`
	// RemoteSweep is the chosen strategy against the size of a remote
	// tier behind the local ones (--sweep-remote).
	RemoteSweep *RemoteSweep `json:"remote_sweep,omitempty"`
	// PeakInFlightRequests and PeakInFlightBytes are the most requests in
	// flight at once (arrived, not done) over every strategy replayed, and
	// their estimated memory: what the replay's memory grew to, bounded by
	// Config.MemoryBudget.
	PeakInFlightRequests int64 `json:"peak_in_flight_requests"`
	PeakInFlightBytes    Bytes `json:"peak_in_flight_bytes"`
	// BreakEven is each lower tier's break-even, without and with
	// compression (breakeven.go).
	BreakEven []TierBreakEven `json:"break_even,omitempty"`
	// OverBudget are the strategies whose replay stopped over
	// Config.MemoryBudget, in the order replayed; Results holds those
	// that finished.
	OverBudget []OverBudget `json:"over_budget,omitempty"`
}

// OverBudget is a strategy whose replay passed Config.MemoryBudget.
type OverBudget struct {
	Strategy string `json:"strategy"`
	// Line is how far the trace was read when it stopped, and
	// InFlightRequests and InFlightBytes what was in flight then (the
	// bytes an estimate of live heap, as PeakInFlightBytes).
	Line             int   `json:"line"`
	InFlightRequests int64 `json:"in_flight_requests"`
	InFlightBytes    Bytes `json:"in_flight_bytes"`
}

// StrategyResult is one strategy's replay of the trace.
type StrategyResult struct {
	Strategy    string `json:"strategy"`
	Description string `json:"description"`
	Requests    int64  `json:"requests"`
	// Blocks is the number of block references in the trace; the hit
	// ratios are of these, by the fastest tier that held each block.
	Blocks   int64      `json:"blocks"`
	HitRatio TierRatios `json:"hit_ratio"`
	// CapacityBlocks is each tier's size in blocks (0: absent).
	CapacityBlocks TierCounts `json:"capacity_blocks"`
	// CodecChoice is, with host_codec auto, the codec the lower tiers
	// held and why (cost.ChooseCodec).
	CodecChoice string `json:"codec_choice,omitempty"`
	InputTokens int64  `json:"input_tokens"`
	// TokensReused are the prompt tokens not prefilled: their blocks were
	// used on the GPU or loaded.
	TokensReused int64 `json:"tokens_reused"`
	// Used, Loads and Recomputes split the cached blocks by what was done
	// with them.
	UsedBlocks int64          `json:"used_blocks"`
	Loads      LoadResult     `json:"loads"`
	Recomputes RecomputeStats `json:"recomputes"`
	// MissBlocks were not cached anywhere; UncachedBlocks could not be kept
	// in the GPU (every slot in use).
	MissBlocks     int64 `json:"miss_blocks"`
	UncachedBlocks int64 `json:"uncached_blocks"`
	// SpaceWaits counts the requests whose insert found too few GPU slots
	// free, held by blocks that copies still read (offloads, write-through
	// copies, write-back demotions), and that waited for those copies to
	// free them (each request once, however often it waited).
	SpaceWaits int64 `json:"space_waits"`
	// DroppedOffloads are offloads refused because their link's queue was
	// full (the link could not keep up).
	DroppedOffloads int64 `json:"dropped_offloads"`
	// Tenants are each salt's blocks and hits, when the trace had several
	// salts or Config.Tenants was set.
	Tenants []TenantResult `json:"tenants,omitempty"`
	// PlanErrors counts requests the cost model could not plan (longer than
	// its MaxBlocks); they loaded every cached block.
	PlanErrors int64 `json:"plan_errors"`
	// QueueSeconds is the mean wait for a prefill slot, in TTFT.
	QueueSeconds float64             `json:"mean_queue_s"`
	Moves        []MoveResult        `json:"moves"`
	Links        []LinkResult        `json:"links"`
	TTFT         results.Percentiles `json:"ttft"`
	// PrefillBusySeconds is the GPU time spent prefilling; over SpanSeconds
	// (the replay's span: first arrival to last request done) it is the
	// prefill load. ArrivalSpanSeconds is the trace's: first arrival to
	// last.
	PrefillBusySeconds float64 `json:"prefill_busy_s"`
	SpanSeconds        float64 `json:"span_s"`
	ArrivalSpanSeconds float64 `json:"arrival_span_s"`
	// GPUMemoryWaitSeconds is how long the request first in line waited
	// for GPU memory for its blocks, in all, while a prefill could have
	// started (a slot free); KVNeededBytes is the most KV it and the
	// requests prefilling and decoding needed at once while it waited
	// (per GPU): above the GPU tier, the replay is bound by KV memory.
	GPUMemoryWaitSeconds float64 `json:"gpu_memory_wait_s"`
	KVNeededBytes        int64   `json:"kv_needed_bytes"`
	// OfferedPrefillLoad is the prefill work the trace offers, every prompt
	// prefilled whole (no prefix cache, each at least a forward pass), over
	// the span of its arrivals and the prefill slots (one GPU's capacity
	// per slot; with slots 0, per GPU). Above 1 the GPU cannot keep up
	// without a cache: requests queue and TTFT grows with the trace.
	OfferedPrefillLoad float64 `json:"offered_prefill_load"`
	// With Config.DecodeOnGPU, decode shares the GPU with prefill, and
	// the report says how much of it it took (without, these are absent):
	// DecodeBusySeconds is the GPU time of the decode rounds (one step of
	// decode_token_time per output token after the first), DecodeSteps
	// the steps, MaxDecoding the most requests decoding at once (at most
	// max_batch), and OfferedGPULoad the work the trace offers the GPU
	// over the span of its arrivals, decode included: OfferedPrefillLoad
	// plus every request's decode steps. Above 1 the GPU cannot keep up
	// without a cache.
	DecodeBusySeconds float64 `json:"decode_busy_s,omitempty"`
	DecodeSteps       int64   `json:"decode_steps,omitempty"`
	MaxDecoding       int64   `json:"max_decoding,omitempty"`
	OfferedGPULoad    float64 `json:"offered_gpu_load,omitempty"`
	// MaxInFlight is the most requests prefilling or decoding at once.
	MaxInFlight int64          `json:"max_in_flight"`
	Evictions   TierCounts     `json:"evictions"`
	Demotions   TierCounts     `json:"demotions"`
	Plan        *PlanTotals    `json:"plan,omitempty"`
	Manager     *ManagerCounts `json:"manager,omitempty"`
	// NVMeWrites is what became of the copies the manager would have made
	// into NVMe on its own (write-through, demotions), when there is an
	// NVMe tier.
	NVMeWrites *WriteCounts `json:"nvme_writes,omitempty"`
	// TTFTQuantiles are the 0th to 100th percentiles of TTFT in seconds,
	// 101 of them (none without requests), for plotting its distribution.
	// They are not in the JSON.
	TTFTQuantiles []float64 `json:"-"`
}

// TierRatios is a ratio per tier and overall.
type TierRatios struct {
	GPU     float64 `json:"gpu"`
	Host    float64 `json:"host"`
	NVMe    float64 `json:"nvme"`
	Overall float64 `json:"overall"`
}

// WriteCounts are a tier's writes: made (its copies in), and refused by
// reason (kvtier.Refusal).
type WriteCounts struct {
	Written       int64 `json:"written"`
	NotAdmitted   int64 `json:"not_admitted"`
	NotWorth      int64 `json:"not_worth"`
	OverRate      int64 `json:"over_rate"`
	OverEndurance int64 `json:"over_endurance"`
	QueueFull     int64 `json:"queue_full"`
	// Prefetched are blocks read back into the host tier for requests
	// that waited (Config.PrefetchBlocks).
	Prefetched int64 `json:"prefetched"`
}

// TierCounts is a count per tier.
type TierCounts struct {
	GPU  int64 `json:"gpu"`
	Host int64 `json:"host"`
	NVMe int64 `json:"nvme"`
}

// LoadResult counts the cached blocks loaded into the GPU and the prefill
// time they saved (what recomputing them would have cost).
type LoadResult struct {
	Blocks              int64   `json:"blocks"`
	FromHost            int64   `json:"from_host"`
	FromNVMe            int64   `json:"from_nvme"`
	PrefillSavedSeconds float64 `json:"prefill_saved_s"`
}

// RecomputeStats counts the cached blocks recomputed instead of loaded and
// the link time they saved (what loading them would have cost). Forced are
// those the plan wanted loaded but for which no GPU slot was free.
type RecomputeStats struct {
	Blocks           int64   `json:"blocks"`
	Forced           int64   `json:"forced"`
	LinkSavedSeconds float64 `json:"link_saved_s"`
}

// MoveResult is the copies between two tiers.
type MoveResult struct {
	From   string `json:"from"`
	To     string `json:"to"`
	Copies int64  `json:"copies"`
	Bytes  int64  `json:"bytes"`
}

// LinkResult is one modelled channel's traffic. Each GPU has its own link
// of every kind (its PCIe link, its share of NVMe), and with tensor
// parallelism all GPUs move their part of a block at once: GPUs links of
// this kind were at work together, each carrying Bytes (the GPU's part of
// every block) and busy for BusySeconds.
type LinkResult struct {
	Name        string  `json:"name"`
	GPUs        int     `json:"gpus"`
	Copies      int64   `json:"copies"`
	Bytes       int64   `json:"bytes"`
	BusySeconds float64 `json:"busy_s"`
}

// PlanTotals are the cost model's own estimates, summed over requests, each
// for its request alone on an idle link and GPU: the plan chosen, loading
// every cached block, recomputing every one.
type PlanTotals struct {
	MeanPlannedSeconds      float64 `json:"mean_planned_s"`
	MeanLoadAllSeconds      float64 `json:"mean_load_all_s"`
	MeanRecomputeAllSeconds float64 `json:"mean_recompute_all_s"`
}

// ManagerCounts are the block manager's own counters at the end.
type ManagerCounts struct {
	Lookups      uint64 `json:"lookups"`
	LookupBlocks uint64 `json:"lookup_blocks"`
	HitBlocks    uint64 `json:"hit_blocks"`
	// HoleBlocks are missing blocks a lookup went past (MaxHoleBlocks):
	// each was recomputed, and the cached blocks after it served.
	HoleBlocks uint64 `json:"hole_blocks"`
	NoSpace    uint64 `json:"no_space"`
	Records    int64  `json:"records"`
}

// SweepPoint is one host capacity of a --sweep-host run.
type SweepPoint struct {
	HostBytes Bytes               `json:"host_bytes"`
	HitRatio  TierRatios          `json:"hit_ratio"`
	TTFT      results.Percentiles `json:"ttft"`
}

func seconds(d time.Duration) float64 { return d.Seconds() }

func ratio(a, b int64) float64 {
	if b == 0 {
		return 0
	}
	return float64(a) / float64(b)
}

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

// result turns the tally into the engine's StrategyResult.
func (e *engine) result() StrategyResult {
	t := &e.res
	slices.Sort(e.ttfts)
	r := StrategyResult{
		Strategy:        e.strategy.String(),
		Description:     e.strategy.Describe(),
		Requests:        t.Requests,
		Blocks:          t.Blocks,
		InputTokens:     t.InputTokens,
		TokensReused:    t.TokensReused,
		UsedBlocks:      t.UsedBlocks,
		MissBlocks:      t.MissBlocks,
		UncachedBlocks:  t.UncachedBlocks,
		SpaceWaits:      t.SpaceWaits,
		DroppedOffloads: t.DroppedOffloads,
		PlanErrors:      t.PlanErrors,
		QueueSeconds:    t.QueueWait.MeanSeconds(t.Requests),
		HitRatio: TierRatios{
			GPU: ratio(t.HitBlocks[kvtier.GPU], t.Blocks), Host: ratio(t.HitBlocks[kvtier.Host], t.Blocks),
			NVMe:    ratio(t.HitBlocks[kvtier.NVMe], t.Blocks),
			Overall: ratio(t.HitBlocks[kvtier.GPU]+t.HitBlocks[kvtier.Host]+t.HitBlocks[kvtier.NVMe], t.Blocks),
		},
		CapacityBlocks: TierCounts{t.CapacityBlocks[kvtier.GPU], t.CapacityBlocks[kvtier.Host], t.CapacityBlocks[kvtier.NVMe]},
		CodecChoice:    t.CodecChoice,
		Loads: LoadResult{Blocks: t.LoadedBlocks, FromHost: t.LoadsFrom[kvtier.Host], FromNVMe: t.LoadsFrom[kvtier.NVMe],
			PrefillSavedSeconds: t.LoadSavedCompute.Seconds()},
		Recomputes: RecomputeStats{Blocks: t.RecomputedBlocks, Forced: t.ForcedRecomputes,
			LinkSavedSeconds: t.RecomputeSavedLink.Seconds()},
		TTFT:                 results.PercentilesOf(e.ttfts),
		TTFTQuantiles:        quantiles(e.ttfts),
		PrefillBusySeconds:   t.PrefillBusy.Seconds(),
		SpanSeconds:          seconds(t.End - t.FirstArrival),
		ArrivalSpanSeconds:   seconds(t.LastArrival - t.FirstArrival),
		GPUMemoryWaitSeconds: seconds(t.MemoryWait),
		KVNeededBytes:        t.KVNeededBlocks * t.BlockBytes,
		MaxInFlight:          t.MaxRunning,
		DecodeBusySeconds:    t.DecodeBusy.Seconds(),
		DecodeSteps:          t.DecodeSteps,
		MaxDecoding:          t.MaxDecoding,
	}
	if span := t.LastArrival - t.FirstArrival; span > 0 {
		r.OfferedPrefillLoad = t.OfferedPrefill.Seconds() / seconds(span) / float64(max(1, e.cfg.PrefillSlots))
		if e.cfg.DecodeOnGPU { // one prefill slot
			all := t.OfferedPrefill
			all.AddSum(t.OfferedDecode)
			r.OfferedGPULoad = all.Seconds() / seconds(span)
		}
	}
	for from := range kvtier.NumTiers {
		for to := range kvtier.NumTiers {
			if n := t.copies[from][to]; n > 0 {
				r.Moves = append(r.Moves, MoveResult{From: from.String(), To: to.String(), Copies: n, Bytes: n * t.BlockBytes})
			}
		}
	}
	for ch := range numChannels {
		s := &e.servers[ch]
		var copies int64
		for from := range kvtier.NumTiers {
			for to := range kvtier.NumTiers {
				if c, _ := route(from, to); c == ch && from != to {
					copies += t.copies[from][to]
				}
			}
		}
		r.Links = append(r.Links, LinkResult{Name: channelNames[ch], GPUs: e.cfg.TP, Copies: copies, Bytes: copies * t.BlockBytes,
			BusySeconds: seconds(s.busyTime)})
	}
	if e.strategy == costplan.Cost && t.Requests > 0 {
		n := t.Requests
		r.Plan = &PlanTotals{MeanPlannedSeconds: t.PlannedTime.MeanSeconds(n),
			MeanLoadAllSeconds: t.PlannedLoadAll.MeanSeconds(n), MeanRecomputeAllSeconds: t.PlannedRecomputeAll.MeanSeconds(n)}
	}
	r.Tenants = e.tenantResults()
	if e.m != nil {
		mt := e.m.Metrics()
		r.Evictions = TierCounts{int64(mt.Tiers[kvtier.GPU].Evictions), int64(mt.Tiers[kvtier.Host].Evictions), int64(mt.Tiers[kvtier.NVMe].Evictions)}
		r.Demotions = TierCounts{int64(mt.Tiers[kvtier.GPU].Demotions), int64(mt.Tiers[kvtier.Host].Demotions), int64(mt.Tiers[kvtier.NVMe].Demotions)}
		r.Manager = &ManagerCounts{Lookups: mt.Lookups, LookupBlocks: mt.LookupBlocks, HitBlocks: mt.HitBlocks,
			HoleBlocks: mt.HoleBlocks, NoSpace: mt.NoSpace, Records: mt.Records}
		if n := mt.Tiers[kvtier.NVMe]; n.CapacitySlots > 0 {
			f := func(why kvtier.Refusal) int64 { return int64(n.Refused[why]) }
			r.NVMeWrites = &WriteCounts{Written: int64(n.BytesIn) / e.stored, NotAdmitted: f(kvtier.NotAdmitted),
				NotWorth: f(kvtier.NotWorth), OverRate: f(kvtier.OverRate), OverEndurance: f(kvtier.OverEndurance), QueueFull: f(kvtier.QueueFull),
				Prefetched: t.Prefetched}
		}
	}
	return r
}

// WriteJSON writes the report as indented JSON.
func (r *Report) WriteJSON(w io.Writer) error {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	return enc.Encode(r)
}

// WriteText writes the report as tables.
func (r *Report) WriteText(w io.Writer) error {
	var b strings.Builder
	r.writeHeader(&b)
	r.writeTables(&b)
	r.writeOverBudget(&b)
	r.writeNotes(&b)
	if r.RemoteSweep != nil {
		r.RemoteSweep.writeText(&b, r.Results[0].Strategy)
	}
	_, err := io.WriteString(w, b.String())
	return err
}

// writeHeader writes what was replayed: the trace, the configuration and
// the load it offers.
func (r *Report) writeHeader(b *strings.Builder) {
	c := &r.Config
	fmt.Fprintf(b, "trace %s (%s): ", r.Trace, r.Format)
	if len(r.Results) > 0 {
		res := &r.Results[0]
		fmt.Fprintf(b, "%d requests, %d block references of %d tokens (%s each), arriving over %.0f s; replayed (%s) over %.0f s, to the last request done",
			res.Requests, res.Blocks, r.BlockTokens, Bytes(r.BlockBytes), res.ArrivalSpanSeconds, res.Strategy, res.SpanSeconds)
	}
	if r.SkippedLines > 0 {
		fmt.Fprintf(b, ", %d bad lines skipped", r.SkippedLines)
	}
	fmt.Fprintf(b, "\nmodel %s on %s (tp %d): GPU KV %s, host %s over %s, NVMe %s on %s; policy %s, %s, NVMe admission %s\n",
		c.Model, c.GPU, c.TP, c.GPUBytes, c.HostBytes, c.HostLink, c.NVMeBytes, c.NVMeLink, c.Policy,
		writeMode(c.WriteThrough), c.NVMeAdmission)
	fmt.Fprintf(b, "decode %v per token%s; %s\n", c.DecodeTokenTime, decodeNote(c), prefillNote(c.PrefillSlots))
	fmt.Fprintf(b, "copies: %s\n", moverNote(c.Mover))
	fmt.Fprintf(b, "memory: at most %d requests in flight, holding about %s of live heap (up to %dx that between collections), of a budget of %v\n",
		r.PeakInFlightRequests, fmtBytes(int64(r.PeakInFlightBytes)), heapGrowth, budgetNote(c.MemoryBudget))
	if len(r.Results) > 0 {
		r.writeLoad(b)
		r.writeKVMemory(b)
	}
	r.writeBreakEven(b)
	b.WriteString("\n")
}

// kvBoundShare is the share of the replay's span the request first in line
// may wait for GPU memory, a prefill slot free, before the report calls
// the replay bound by KV memory.
const kvBoundShare = 0.1

// writeKVMemory says, when requests waited for GPU memory, how long and
// how much KV they needed, and flags a replay bound by it.
func (r *Report) writeKVMemory(b *strings.Builder) {
	res := &r.Results[0]
	if res.GPUMemoryWaitSeconds == 0 {
		return
	}
	share := 0.0
	if res.SpanSeconds > 0 {
		share = res.GPUMemoryWaitSeconds / res.SpanSeconds
	}
	fmt.Fprintf(b, "GPU KV memory (%s): the request first in line waited %s in all for GPU memory with a prefill slot free (%.0f%% of the replay's span); with the requests running it needed up to %s of KV at once, on a GPU tier of %s",
		res.Strategy, fmtSeconds(res.GPUMemoryWaitSeconds), 100*share, fmtBytes(res.KVNeededBytes), r.Config.GPUBytes)
	if share >= kvBoundShare {
		b.WriteString(": BOUND BY GPU KV MEMORY; requests queue for it and TTFT grows with the trace")
	}
	b.WriteString("\n")
}

// writeLoad says what share of the GPU the trace offers, and warns when it
// is more than the GPU can serve.
func (r *Report) writeLoad(b *strings.Builder) {
	c := &r.Config
	if res := &r.Results[0]; res.ArrivalSpanSeconds == 0 && res.Requests > 1 {
		b.WriteString("offered prefill load: every request arrives at once, so the trace offers no rate; they queue\n")
		return
	}
	load := r.Results[0].OfferedPrefillLoad
	per := "of the GPU's prefill capacity"
	if c.PrefillSlots == 0 {
		per = "of one GPU's prefill capacity"
	} else if c.PrefillSlots > 1 {
		per = fmt.Sprintf("of the %d prefill slots' capacity", c.PrefillSlots)
	}
	fmt.Fprintf(b, "offered prefill load %.0f%% %s (every prompt prefilled whole)", 100*load, per)
	gpuLoad := r.Results[0].OfferedGPULoad
	if c.DecodeOnGPU {
		fmt.Fprintf(b, "; with decode, %.0f%% of the GPU's time", 100*gpuLoad)
	}
	if load > 1 && c.PrefillSlots > 0 {
		b.WriteString(": MORE THAN THE GPU CAN PREFILL without a prefix cache; requests queue and TTFT grows with the trace")
	} else if gpuLoad > 1 {
		fmt.Fprintf(b, ": MORE THAN THE GPU CAN SERVE without a prefix cache (decode alone %.0f%%); requests queue and TTFT grows with the trace",
			100*(gpuLoad-load))
	}
	b.WriteString("\n")
}

// writeTables writes the two tables of the strategies' figures: latency
// and hits, then loads, recomputes and bytes moved.
func (r *Report) writeTables(b *strings.Builder) {
	tw := tabwriter.NewWriter(b, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "strategy\tTTFT p50\tp90\tp99\tmean\thit gpu\thost\tnvme\tall\ttokens reused\tloads\trecomputes\tprefill busy\t")
	for i := range r.Results {
		s := &r.Results[i]
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%.4f\t%.4f\t%.4f\t%.4f\t%.1f%%\t%d\t%d\t%.0f s\t\n",
			s.Strategy, fmtSeconds(s.TTFT.P50), fmtSeconds(s.TTFT.P90), fmtSeconds(s.TTFT.P99), fmtSeconds(s.TTFT.Mean),
			s.HitRatio.GPU, s.HitRatio.Host, s.HitRatio.NVMe, s.HitRatio.Overall,
			100*ratio(s.TokensReused, s.InputTokens), s.Loads.Blocks, s.Recomputes.Blocks, s.PrefillBusySeconds)
	}
	tw.Flush()

	b.WriteString("\n")
	tw = tabwriter.NewWriter(b, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "strategy\tloads host\tnvme\tprefill saved\trecomputed cached\tforced\tlink saved\tmissed\tnot kept\tmoved gpu<-host\tgpu<-nvme\tgpu->host\t->nvme\t")
	for i := range r.Results {
		s := &r.Results[i]
		fmt.Fprintf(tw, "%s\t%d\t%d\t%.0f s\t%d\t%d\t%.1f s\t%d\t%d\t%s\t%s\t%s\t%s\t\n",
			s.Strategy, s.Loads.FromHost, s.Loads.FromNVMe, s.Loads.PrefillSavedSeconds,
			s.Recomputes.Blocks, s.Recomputes.Forced, s.Recomputes.LinkSavedSeconds, s.MissBlocks, s.UncachedBlocks,
			fmtBytes(s.moved("host", "gpu")), fmtBytes(s.moved("nvme", "gpu")), fmtBytes(s.moved("gpu", "host")),
			fmtBytes(s.moved("gpu", "nvme")+s.moved("host", "nvme")))
	}
	tw.Flush()
	writeTenants(b, r.Results)
}

// writeOverBudget names the strategies that stopped over the memory
// budget, and where.
func (r *Report) writeOverBudget(b *strings.Builder) {
	if len(r.OverBudget) == 0 {
		return
	}
	fmt.Fprintf(b, "\nNOT FINISHED, over the memory budget of %v (the tables hold the strategies that finished):\n", r.Config.MemoryBudget)
	for _, o := range r.OverBudget {
		fmt.Fprintf(b, "  %s: stopped at line %d of the trace, %d requests in flight holding about %s\n",
			o.Strategy, o.Line, o.InFlightRequests, fmtBytes(int64(o.InFlightBytes)))
	}
}

// writeNotes writes what follows the tables: the links, decode, holes,
// the cost model's estimates and the host sweep.
func (r *Report) writeNotes(b *strings.Builder) {
	c := &r.Config
	if len(r.Results) > 0 {
		b.WriteString(linksNote(&r.Results[0], c.TP))
		if w := r.Results[0].NVMeWrites; w != nil {
			fmt.Fprintf(b, "nvme writes (%s, %s): %d written; refused: %d not admitted, %d not worth a load, %d over the rate budget, %d over endurance, %d behind a full queue; %d read back for waiting requests\n",
				r.Results[0].Strategy, nvmeWritesNote(c), w.Written, w.NotAdmitted, w.NotWorth, w.OverRate, w.OverEndurance, w.QueueFull, w.Prefetched)
		}
	}
	if c.DecodeOnGPU {
		b.WriteString("\ndecode on the GPU, between prefills (GPU time, steps, most requests decoding at once):")
		for i := range r.Results {
			s := &r.Results[i]
			if i > 0 {
				b.WriteString(";")
			}
			fmt.Fprintf(b, " %s %s, %d, %d", s.Strategy, fmtSeconds(s.DecodeBusySeconds), s.DecodeSteps, s.MaxDecoding)
		}
		b.WriteString("\n")
	}
	if c.MaxHoleBlocks > 0 {
		b.WriteString("\nholes (lookups went on past up to " + strconv.Itoa(c.MaxHoleBlocks) + " missing blocks; recomputed, the cached blocks after them served):")
		for i := range r.Results {
			if s := &r.Results[i]; s.Manager != nil {
				fmt.Fprintf(b, " %s %d", s.Strategy, s.Manager.HoleBlocks)
			}
		}
		b.WriteString("\n")
	}
	for i := range r.Results {
		if p := r.Results[i].Plan; p != nil {
			fmt.Fprintf(b, "\ncost model, per request alone on an idle GPU and link (mean): plan %s, load all %s, recompute all %s\n",
				fmtSeconds(p.MeanPlannedSeconds), fmtSeconds(p.MeanLoadAllSeconds), fmtSeconds(p.MeanRecomputeAllSeconds))
		}
	}
	if len(r.HostSweep) > 0 {
		b.WriteString("\nhit ratio against host capacity (" + r.Results[0].Strategy + "):\n")
		tw := tabwriter.NewWriter(b, 0, 0, 2, ' ', tabwriter.AlignRight)
		fmt.Fprintln(tw, "host\thit gpu\thost\tnvme\tall\tTTFT p50\tmean\t")
		for _, p := range r.HostSweep {
			fmt.Fprintf(tw, "%s\t%.4f\t%.4f\t%.4f\t%.4f\t%s\t%s\t\n", p.HostBytes, p.HitRatio.GPU, p.HitRatio.Host,
				p.HitRatio.NVMe, p.HitRatio.Overall, fmtSeconds(p.TTFT.P50), fmtSeconds(p.TTFT.Mean))
		}
		tw.Flush()
	}
}

// linksNote says what each link of s carried and how long it was busy, and
// that with tensor parallelism each GPU has its own.
func linksNote(s *StrategyResult, tp int) string {
	var b strings.Builder
	if tp > 1 {
		fmt.Fprintf(&b, "\nlinks (%s), each of the %d GPUs its own, all %d at once:", s.Strategy, tp, tp)
	} else {
		fmt.Fprintf(&b, "\nlinks (%s):", s.Strategy)
	}
	for i, l := range s.Links {
		if i > 0 {
			b.WriteString(";")
		}
		fmt.Fprintf(&b, " %s %s", l.Name, fmtBytes(l.Bytes))
		if tp > 1 {
			fmt.Fprintf(&b, " per GPU (%s in all)", fmtBytes(l.Bytes*int64(tp)))
		}
		fmt.Fprintf(&b, ", busy %s", fmtSeconds(l.BusySeconds))
	}
	b.WriteString("\n")
	return b.String()
}

func nvmeWritesNote(c *Config) string {
	if c.NVMeWrites == "all" {
		return "every admitted block"
	}
	return "gated by their worth and the drive's budget"
}

func writeMode(through bool) string {
	if through {
		return "write-through"
	}
	return "write-back"
}

// decodeNote says, with Config.DecodeOnGPU, that decode takes GPU time.
func decodeNote(c *Config) string {
	if !c.DecodeOnGPU {
		return ""
	}
	return fmt.Sprintf(", on the GPU between prefills (each round a step of every request decoding, at most %d at once)", c.maxBatch())
}

func moverNote(mover string) string {
	if mover == MoverDevice {
		return "GPU and host tier by kvtier.DeviceMover and the transfer engine on the simulated device (virtual clock); the NVMe drive modelled, its loads then copied to the GPU on the device"
	}
	return "on the modelled channels"
}

func prefillNote(slots int) string {
	if slots == 0 {
		return "every request prefills on a GPU of its own (no compute queueing)"
	}
	if slots == 1 {
		return "prefills queue for one GPU"
	}
	return fmt.Sprintf("prefills queue for %d GPU slots", slots)
}

func (s *StrategyResult) moved(from, to string) int64 {
	for _, m := range s.Moves {
		if m.From == from && m.To == to {
			return m.Bytes
		}
	}
	return 0
}

func fmtSeconds(s float64) string {
	switch {
	case s == 0:
		return "0"
	case s < 1:
		return fmt.Sprintf("%.1f ms", s*1e3)
	case s < 10:
		return fmt.Sprintf("%.3f s", s)
	case s < 100:
		return fmt.Sprintf("%.2f s", s)
	default:
		return fmt.Sprintf("%.1f s", s)
	}
}

func fmtBytes(n int64) string {
	const unit = 1024
	if n < unit {
		return fmt.Sprintf("%d B", n)
	}
	v, u := float64(n), 0
	for v >= unit && u < 4 {
		v /= unit
		u++
	}
	return fmt.Sprintf("%.1f %ciB", v, "KMGTP"[u-1])
}

func budgetNote(b Bytes) string {
	if b == 0 {
		return "none"
	}
	return b.String()
}
