package replay

import (
	"errors"
	"fmt"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/hashicorp/golang-lru/v2/simplelru"

	"kvtier.dev/internal/invariants"
	"kvtier.dev/internal/results"
	"kvtier.dev/kvtier"
	"kvtier.dev/kvtier/cost"
	"kvtier.dev/kvtier/costplan"
	"kvtier.dev/kvtier/policy"
)

// The remote tier in the replay: a shared store behind the local tiers
// (kvtier.RemoteTier over kvtier/remote), modelled as one mechanism.
//
//   - It holds block keys, at most its capacity, and evicts the least
//     recently used, as Redis does under allkeys-lru.
//   - A request that ends publishes the blocks it held in the GPU, as
//     RemoteTier.Publish does once their host copies are made; a block goes
//     out the second time it is published (seen-twice admission, the
//     RemoteTier's default). The write is behind the request: it costs the
//     request nothing, and the block is in the remote tier at once (the
//     replay does not wait for the host copy, nor model the write's
//     traffic).
//   - A request that starts looks its prefix up locally, then asks the
//     remote tier for the blocks that follow it, as RemoteTier.Fetch does:
//     the run of blocks the remote holds (blocks past a hole that the host
//     tier holds stay local), plus any block of the local prefix without a
//     host copy (the host tier needs the whole prefix). It fetches
//     them only when fetching them and loading them from the host tier is
//     faster than recomputing them (kvtier/cost's times), into the host
//     tier, and its lookup, plan and loads go on after the fetch.
//   - Fetches cross one channel, the remote link, one after another: a
//     fetch occupies it for its bytes over the link's bandwidth and ends no
//     sooner than the link's latency after it was asked for (one round trip
//     per fetch: the tier pipelines a fetch's blocks).
//
// One server replays the trace, so the remote tier here holds what this
// server published: what it buys is the capacity behind the local tiers
// (a server whose host and NVMe tiers are smaller than the trace's working
// set), not the sharing between servers, which adds the other servers'
// blocks to it.

// RemoteSpec is the remote tier a replay models.
type RemoteSpec struct {
	// Bytes is its capacity, e.g. 512 GiB (of the cluster's memory given
	// to this deployment).
	Bytes Bytes `json:"bytes"`
	// Link is what a GPU reads it at: bandwidth and the latency of one
	// fetch, for example those benchmarks/remote measured ("tier read" and
	// "tier read latency"). Like the replay's other links it is per GPU:
	// at tp N each GPU fetches its 1/N of every block, all at once, so a
	// server whose N GPUs share one network link gets 1/N of it each.
	Link cost.Link `json:"link"`
}

// Validate checks the capacity and the link.
func (s *RemoteSpec) Validate() error {
	if s.Bytes < 0 {
		return fmt.Errorf("replay: remote tier: capacity %v is negative", s.Bytes)
	}
	if err := s.Link.Validate(); err != nil {
		return fmt.Errorf("replay: remote tier link: %w", err)
	}
	return nil
}

// remoteLevel is the engine's remote tier.
type remoteLevel struct {
	keys      *simplelru.LRU[kvtier.Key, struct{}]
	adm       policy.Admitter[kvtier.Key]
	latency   time.Duration // one fetch's round trip
	stream    time.Duration // one block over the link
	busyUntil time.Duration // when the link finishes the fetches queued on it

	fetches, fetched, notWorth, published int64
	fetchTime                             time.Duration

	found, inHost []bool // fetch's scratch, by position
}

// maxRemoteFetchBlocks bounds one fetch, as RemoteTierConfig.MaxFetchBlocks
// does by default.
const maxRemoteFetchBlocks = 256

// newRemoteLevel sizes the remote tier in blocks of blockBytes. A capacity
// of less than one block is no remote tier (nil).
func newRemoteLevel(s *RemoteSpec, blockBytes int64) (*remoteLevel, error) {
	blocks := int64(s.Bytes) / blockBytes
	if blocks == 0 {
		return nil, nil
	}
	if blocks > 1<<31 {
		return nil, fmt.Errorf("replay: remote tier: %v makes %d blocks, more than 2^31", s.Bytes, blocks)
	}
	keys, err := simplelru.NewLRU[kvtier.Key, struct{}](int(blocks), nil)
	if err != nil {
		return nil, fmt.Errorf("replay: remote tier: %w", err)
	}
	counters := max(1<<16, 4*int(min(blocks, 1<<24)))
	adm, err := policy.NewSeenTwice(counters, counters, func(k kvtier.Key) uint64 { return uint64(k) })
	if err != nil {
		return nil, fmt.Errorf("replay: remote tier: %w", err)
	}
	p := cost.DirectPath(s.Link)
	return &remoteLevel{keys: keys, adm: adm, latency: p.Latency(), stream: p.StreamTime(blockBytes)}, nil
}

// publish offers the remote tier the blocks r held in the GPU.
func (rl *remoteLevel) publish(r *request) {
	for _, b := range r.l2.Blocks {
		rl.adm.Record(b.Key)
		if rl.adm.Admit(b.Key) && !rl.keys.Contains(b.Key) {
			rl.keys.Add(b.Key, struct{}{})
			rl.published++
		}
	}
}

// fetch decides whether r, looked up in r.l1, fetches blocks from the
// remote tier. If so it schedules the fetch's end (fetchDone continues r's
// start) and reports true.
func (e *engine) fetch(r *request) bool {
	rl := e.remote
	// Where each block is locally: l1 holds blocks by position, past
	// holes too (Config.MaxHoleBlocks).
	n := len(r.keys)
	rl.found, rl.inHost = resize(rl.found, n), resize(rl.inHost, n)
	for i, b := range r.l1.Blocks {
		rl.found[b.Position] = true
		_, rl.inHost[b.Position] = e.m.ReadySlot(r.l1, i, kvtier.Host)
	}
	first := 0 // the local prefix: [0, first)
	for first < n && rl.found[first] {
		first++
	}
	// The run the fetch extends the prefix by: blocks held in the host
	// tier, or that the remote tier holds.
	end, reads := first, 0
	for end < n && reads < maxRemoteFetchBlocks {
		p := end
		if !(rl.found[p] && rl.inHost[p]) {
			if !rl.keys.Contains(r.keys[p]) {
				break
			}
			reads++
		}
		end++
	}
	var recompute time.Duration // what the fetch saves: the new blocks' prefill
	for p := first; p < end; p++ {
		if !rl.found[p] {
			recompute += e.blockCost(r, p)
		}
	}
	if recompute == 0 {
		return false
	}
	// The host tier needs every block of the prefix it is given.
	for p := range first {
		if rl.inHost[p] {
			continue
		}
		if !rl.keys.Contains(r.keys[p]) {
			return false
		}
		reads++
	}
	get := rl.latency + time.Duration(reads)*rl.stream
	for p := first; p < end; p++ {
		if !rl.found[p] {
			get += e.copyStream[kvtier.Host][kvtier.GPU] // and the load into the GPU
		}
	}
	if get >= recompute {
		rl.notWorth++
		return false
	}
	for p := range end {
		rl.keys.Get(r.keys[p]) // a read makes a block recent
	}
	start := max(e.now, rl.busyUntil)
	rl.busyUntil = start + time.Duration(reads)*rl.stream
	done := max(rl.busyUntil, e.now+rl.latency)
	rl.fetches++
	rl.fetchTime += done - e.now
	r.fetchEnd = end
	e.schedule(event{at: done, kind: evRemoteDone, r: r})
	return true
}

// resize returns s with n elements, all false, reusing its memory.
func resize(s []bool, n int) []bool {
	if cap(s) < n {
		return make([]bool, n)
	}
	s = s[:n]
	clear(s)
	return s
}

// fetchDone puts r's fetched blocks into the host tier, looks r up again
// and goes on with its start.
func (e *engine) fetchDone(r *request) {
	e.release(r.l1)
	var w kvtier.Lease
	err := e.m.InsertKeys(r.salt, r.keys[:r.fetchEnd], kvtier.Host, &w)
	if err != nil && !errors.Is(err, kvtier.ErrNoSpace) {
		invariants.Failf("replay: InsertKeys into the host tier: %v", err) // only ErrNoSpace is possible on valid input
	}
	for _, b := range w.Blocks {
		if b.Write {
			e.remote.fetched++
		}
	}
	if err := e.m.Commit(&w, nil); err != nil {
		invariants.Failf("replay: Commit: %v", err)
	}
	e.m.Release(&w)
	if err := e.m.LookupKeys(r.salt, r.keys, r.l1); err != nil {
		invariants.Failf("replay: LookupKeys: %v", err)
	}
	e.planAndLoad(r)
}

// RemotePoint is the chosen strategy's replay with a remote tier of one
// size (0: none, the baseline).
type RemotePoint struct {
	RemoteBytes Bytes `json:"remote_bytes"`
	// FetchedRatio is the block references fetched from the remote tier;
	// HitRatio counts them in the host tier, where they landed.
	FetchedRatio float64             `json:"fetched_ratio"`
	HitRatio     TierRatios          `json:"hit_ratio"`
	TTFT         results.Percentiles `json:"ttft"`
	// Fetches and FetchedBlocks are the remote reads; NotWorth the fetches
	// not made because recomputing was faster; Published the blocks
	// written to it. MeanFetchSeconds is a fetch's mean time, queueing on
	// the remote link included.
	Fetches          int64   `json:"fetches"`
	FetchedBlocks    int64   `json:"fetched_blocks"`
	NotWorth         int64   `json:"not_worth"`
	Published        int64   `json:"published"`
	MeanFetchSeconds float64 `json:"mean_fetch_s"`
}

// RemoteSweep is the chosen strategy against the remote tier's size.
type RemoteSweep struct {
	Link   cost.Link     `json:"link"`
	Points []RemotePoint `json:"points"`
}

// remotePoint turns a replay's result and its remote tier's counts into a
// point.
func remotePoint(size Bytes, res *StrategyResult, rl *remoteLevel) RemotePoint {
	p := RemotePoint{RemoteBytes: size, HitRatio: res.HitRatio, TTFT: res.TTFT}
	if rl != nil {
		p.FetchedRatio = ratio(rl.fetched, res.Blocks)
		p.Fetches, p.FetchedBlocks, p.NotWorth, p.Published = rl.fetches, rl.fetched, rl.notWorth, rl.published
		if rl.fetches > 0 {
			p.MeanFetchSeconds = seconds(rl.fetchTime / time.Duration(rl.fetches))
		}
	}
	return p
}

// sweepRemote replays src under strategy s once per size in
// opts.SweepRemote, each with a remote tier of that size.
func sweepRemote(src Source, cfg Config, s costplan.Strategy, opts Options) (*RemoteSweep, error) {
	if cfg.HostBytes == 0 || s == costplan.None || s == costplan.GPUOnly {
		return nil, fmt.Errorf("replay: a remote tier fetches into the host tier: strategy %v with host_bytes %v has none", s, cfg.HostBytes)
	}
	sw := &RemoteSweep{Link: opts.RemoteLink}
	for _, size := range opts.SweepRemote {
		spec := &RemoteSpec{Bytes: size, Link: opts.RemoteLink}
		if err := spec.Validate(); err != nil {
			return nil, err
		}
		res, info, err := runOne(src, cfg, s, opts.Progress, spec, nil)
		if err != nil {
			return nil, fmt.Errorf("replay: sweep at remote %v: %w", size, err)
		}
		sw.Points = append(sw.Points, remotePoint(size, &res, info.remote))
	}
	return sw, nil
}

// writeText writes the sweep as a table: what each size of remote tier
// buys in TTFT over none.
func (sw *RemoteSweep) writeText(b *strings.Builder, strategy string) {
	fmt.Fprintf(b, "\nTTFT against the remote tier's size (%s; remote link %.2f GB/s, %v per fetch):\n",
		strategy, sw.Link.BandwidthBytesPerS/1e9, sw.Link.Latency)
	tw := tabwriter.NewWriter(b, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "remote\tTTFT p50\tp90\tp99\tmean\tfetched\thit local+fetched\tfetches\tmean fetch\tnot worth\tpublished\t")
	for _, p := range sw.Points {
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%.4f\t%.4f\t%d\t%s\t%d\t%d\t\n", p.RemoteBytes,
			fmtSeconds(p.TTFT.P50), fmtSeconds(p.TTFT.P90), fmtSeconds(p.TTFT.P99), fmtSeconds(p.TTFT.Mean),
			p.FetchedRatio, p.HitRatio.Overall, p.Fetches, fmtSeconds(p.MeanFetchSeconds), p.NotWorth, p.Published)
	}
	tw.Flush()
}
