package cost

import (
	"errors"
	"fmt"
	"math"
	"sync/atomic"
	"time"

	"kvtier.dev/internal/invariants"
)

// Tier is where one block of a prefix is now.
type Tier uint8

const (
	TierGPU     Tier = iota // already in GPU memory: nothing to do
	TierHost                // pinned host pool: loaded over the host path
	TierNVMe                // NVMe slab: loaded over the NVMe path
	TierRemote              // another host, by RDMA: loaded over the remote path
	TierMissing             // nowhere: must be recomputed
	NumTiers
)

var tierNames = [NumTiers]string{"gpu", "host", "nvme", "remote", "missing"}

func (t Tier) String() string {
	if t < NumTiers {
		return tierNames[t]
	}
	return fmt.Sprintf("Tier(%d)", uint8(t))
}

func (t Tier) loadable() bool { return t == TierHost || t == TierNVMe || t == TierRemote }

// BlockSource is one block of the prefix, in token order.
type BlockSource struct {
	Tier   Tier
	Tokens int // a short block's tokens (a prompt's last), 0 for a full one
}

// Action is what the plan does with one block.
type Action uint8

const (
	ActionNone      Action = iota // already on the GPU
	ActionLoad                    // copy it in from its tier
	ActionRecompute               // run prefill over its tokens
	NumActions
)

func (a Action) String() string {
	switch a {
	case ActionNone:
		return "none"
	case ActionLoad:
		return "load"
	case ActionRecompute:
		return "recompute"
	}
	return fmt.Sprintf("Action(%d)", uint8(a))
}

// PlanResult summarises a plan.
type PlanResult struct {
	// Time is when the prefix is on the GPU and its forward pass done,
	// never less than Scenario.PassFloor.
	Time            time.Duration
	LoadBlocks      int
	RecomputeBlocks int
	// The times of loading all it can, and of recomputing all.
	LoadAllTime      time.Duration
	RecomputeAllTime time.Duration
}

// PlannerConfig describes the machine a Planner plans for.
type PlannerConfig struct {
	Model       Model
	GPU         GPU
	TP          int // tensor-parallel degree, >= 1
	BlockTokens int // tokens per block, e.g. 16 (vLLM's default)
	// MaxBlocks sizes the scratch space, e.g. 4096 (0: 1024); a longer
	// prefix's first plan grows it.
	MaxBlocks int
	// Calibration, when set, prices every plan by its current Fit, links
	// by name; nil: the presets, taken as exact.
	Calibration *Calibration
	// Paths[t] is how tier t's blocks reach the GPU (zero: a block there is
	// an error); all should share one Ingress, as all loads do. A path's
	// Codec is how tier t holds its blocks: Paths[TierNVMe].Codec =
	// fp8-e4m3 prices an NVMe load as half the bytes over the drive and
	// the link, then a decode on the GPU.
	Paths [NumTiers]Path
}

// Planner chooses, for each block of a prefix, whether to load or
// recompute it so that the prefix's forward pass ends soonest: the pass
// computes the recomputed positions layer by layer, each layer once that
// layer of every load has landed (pass.go, docs/cost.md). It recomputes a
// head of each tier's blocks and loads the rest: the best single cut, then
// a coordinate descent over each tier's cut when several tiers are
// present. It is NOT safe for concurrent use, but BlockRecomputeCost
// is safe beside Plan.
type Planner struct {
	cfg PlannerConfig
	// costs are the nominal and charged costs of the current fit; Plan
	// swaps in new ones when the Calibration publishes a new Fit.
	costs atomic.Pointer[plannerCosts]
	fit   *Fit // the fit costs came from; nil for the presets
	// Scratch, at least len(blocks)+1 each (search.go, forwardPass).
	cnt       []tierCounts        // loadable blocks per tier before position i
	tierPos   [NumTiers][]int32   // per tier, the position of its j-th block
	tierRec   [NumTiers][]float64 // per tier, the recompute of its first j blocks (charged)
	tierN     [NumTiers]int       // per tier, its blocks
	missing   float64             // the missing blocks' recompute (charged)
	gpuTokens int                 // tokens of the blocks on the GPU
}

// plannerCosts are a Planner's costs under one fit. Immutable once built.
type plannerCosts struct {
	prefill PrefillCost
	// blockS0 and blockS1: a full block i costs blockS0 + i × blockS1
	// (nominal): its linear work and its attention to itself, plus its
	// attention to the i blocks before it.
	blockS0, blockS1 float64
	loadS            [NumTiers]float64 // s_t per block, seconds; 0 for unconfigured
	latS             [NumTiers]float64
	// tailS is the decode of a compressed tier's last chunk, after its
	// copy: every load from the tier ends that much later (0: no codec).
	tailS      [NumTiers]float64
	configured [NumTiers]bool
	// pass is how each tier's loads cross into the GPU in a pass, layers
	// the model's layer count (pass.go).
	pass   [NumTiers]tierPass
	layers float64
	// Charged costs (docs/cost.md): recompute × chargeC, loads chargedS.
	chargeC   float64
	chargedS  [NumTiers]float64
	uncertain bool // some width is not 0: choices use the charged costs
}

// Backlog is how long work queued ahead of a plan keeps the GPU's ingress
// (Link) and the GPU busy.
type Backlog struct {
	Link  time.Duration // with copies: Planner.LinkBusy of their bytes
	GPU   time.Duration // with prefill
	Drive time.Duration // the NVMe drive, with reads and writes: an NVMe load's read starts after it
}

// NewPlanner validates the configuration and prices blocks and loads.
func NewPlanner(cfg PlannerConfig) (*Planner, error) {
	if err := cfg.Model.Validate(); err != nil {
		return nil, err
	}
	if err := cfg.GPU.Validate(); err != nil {
		return nil, err
	}
	if err := checkTP(cfg.TP); err != nil {
		return nil, err
	}
	if cfg.BlockTokens < 1 || cfg.BlockTokens > 1<<20 {
		return nil, fieldErr("block_tokens", cfg.BlockTokens, "must be between 1 and %d", 1<<20)
	}
	if cfg.MaxBlocks < 0 || int64(cfg.MaxBlocks)*int64(cfg.BlockTokens) > maxTokens {
		return nil, fieldErr("max_blocks", cfg.MaxBlocks, "must be between 0 (1024) and max_blocks × block_tokens at most %d", maxTokens)
	}
	if cfg.MaxBlocks == 0 {
		cfg.MaxBlocks = 1024
	}
	p := &Planner{cfg: cfg}
	anyPath := false
	for t := Tier(0); t < NumTiers; t++ {
		path := &cfg.Paths[t]
		zero := *path == (Path{})
		if !t.loadable() {
			if !zero {
				return nil, fmt.Errorf("planner: tier %s takes no path", t)
			}
			continue
		}
		if zero {
			continue
		}
		if err := path.Validate(); err != nil {
			return nil, fmt.Errorf("planner: tier %s: %w", t, err)
		}
		if err := path.Codec.checkModel(&cfg.Model); err != nil {
			return nil, fmt.Errorf("planner: tier %s: %w", t, err)
		}
		anyPath = true
	}
	if !anyPath {
		return nil, errors.New("planner: no tier has a path; set Paths[TierHost] at least")
	}
	var fit *Fit
	if cfg.Calibration != nil {
		fit = cfg.Calibration.Current()
	}
	p.setCosts(fit)
	p.grow(cfg.MaxBlocks)
	return p, nil
}

// setCosts prices blocks and loads under fit (nil: the presets).
func (p *Planner) setCosts(fit *Fit) {
	cfg := &p.cfg
	c := &plannerCosts{prefill: fit.PrefillCost(&cfg.Model, &cfg.GPU, cfg.TP), chargeC: 1, layers: float64(cfg.Model.Layers)}
	bt := float64(cfg.BlockTokens)
	c.blockS0 = c.prefill.MarginalSeconds(cfg.BlockTokens, 0)
	c.blockS1 = bt * bt * c.prefill.PrefixSecondsPerPair
	if fit != nil && fit.Prefill.ErrorWidth > 0 {
		c.chargeC = 1 + fit.Prefill.ErrorWidth
		c.uncertain = true
	}
	bytes := float64(cfg.Model.KVBytesPerTokenPerRank(cfg.TP)) * bt
	for t := range NumTiers {
		path := cfg.Paths[t]
		if !t.loadable() || path == (Path{}) {
			continue
		}
		var w, ws float64
		path.Ingress, w = fit.Link(path.Ingress)
		if path.HasSource() {
			path.Source, ws = fit.Link(path.Source)
			w = max(w, ws)
		}
		path.Codec = fit.Codec(path.Codec, int64(path.Codec.ChunkBlocks)*int64(bytes))
		c.loadS[t] = bytes * path.secondsPerByte()
		c.chargedS[t] = c.loadS[t] * (1 + w)
		wire := bytes
		if codec := &path.Codec; codec.Enabled() {
			wire = float64(codec.EncodedBlockBytes(&cfg.Model, cfg.BlockTokens, cfg.TP))
		}
		c.pass[t] = passCosts(&path, wire, w)
		if codec := &path.Codec; codec.Enabled() {
			// Per block, the slower of the encoded copy and the decode
			// (Codec); the fit's width widens the copy only.
			wireS := wire * path.secondsPerByte()
			decode := bytes / codec.DecodeBytesPerS
			c.loadS[t] = max(wireS, decode)
			c.chargedS[t] = max(wireS*(1+w), decode)
			c.tailS[t] = decode * float64(codec.ChunkBlocks)
			tp := &c.pass[t]
			tp.in, tp.inCharged = max(tp.in, decode), max(tp.inCharged, decode)
			tp.decode, tp.chunk = decode, codec.ChunkBlocks
			tp.whole = true
		}
		c.latS[t] = path.latencySeconds()
		c.configured[t] = true
		if w > 0 {
			c.uncertain = true
		}
	}
	p.fit = fit
	p.costs.Store(c)
}

// passCosts is how path's loads of wire bytes a block cross into the GPU in
// a pass; w widens the charged copies.
func passCosts(path *Path, wire, w float64) tierPass {
	in := &path.Ingress
	tp := tierPass{
		in: wire / in.BandwidthBytesPerS, call: in.Latency.Seconds(),
		desc: in.DescriptorCost.Seconds(), event: in.EventCost.Seconds(), pipelined: path.Pipelined,
	}
	if path.HasSource() {
		tp.src, tp.srcLat = wire/path.Source.BandwidthBytesPerS, path.Source.Latency.Seconds()
	}
	tp.inCharged, tp.srcCharged = tp.in*(1+w), tp.src*(1+w)
	return tp
}

// refresh takes the Calibration's newest fit, if it changed.
func (p *Planner) refresh() *plannerCosts {
	if cal := p.cfg.Calibration; cal != nil {
		if f := cal.Current(); f != p.fit {
			p.setCosts(f)
		}
	}
	return p.costs.Load()
}

// grow makes the scratch space hold a prefix of n blocks.
func (p *Planner) grow(blocks int) {
	n := blocks + 1
	if len(p.cnt) >= n {
		return
	}
	n = max(n, 2*len(p.cnt))
	p.cnt = make([]tierCounts, n)
	for t := range p.tierPos {
		p.tierPos[t] = make([]int32, n)
		p.tierRec[t] = make([]float64, n)
	}
}

// Config returns the configuration the Planner was built with.
func (p *Planner) Config() PlannerConfig { return p.cfg }

// BlockRecomputeCost is block i's prefill time (0-based) after the i
// before it, under the last plan's fit. Safe for concurrent use.
func (p *Planner) BlockRecomputeCost(i int) time.Duration {
	c := p.costs.Load()
	return seconds(c.blockCost(max(i, 0), 0, p.cfg.BlockTokens))
}

// Prefill is the prefill cost the last plan used (the fit's, or the
// presets').
func (p *Planner) Prefill() PrefillCost { return p.costs.Load().prefill }

// BlockLoadCost is a full block's load from tier t alone on an idle path:
// its latency and its time on the path, under the costs the last plan took
// (0 for a tier with no path). Safe beside Plan.
func (p *Planner) BlockLoadCost(t Tier) time.Duration {
	c := p.costs.Load()
	if t >= NumTiers || !c.configured[t] {
		return 0
	}
	return seconds(c.latS[t] + c.tailS[t] + c.loadS[t])
}

// PassFloor is Scenario.PassFloor: no plan takes less.
func (p *Planner) PassFloor() time.Duration { return seconds(p.costs.Load().prefill.FloorSeconds) }

// LinkBusy is how long bytes queued on tier t's path keep the ingress
// busy, bytes counted as the GPU holds them (a compressed tier's at its
// per-block load cost).
func (p *Planner) LinkBusy(t Tier, bytes int64) time.Duration {
	c := p.costs.Load()
	if t >= NumTiers || !c.configured[t] || bytes <= 0 {
		return 0
	}
	perByte := c.loadS[t] / (float64(p.cfg.Model.KVBytesPerTokenPerRank(p.cfg.TP)) * float64(p.cfg.BlockTokens))
	return seconds(float64(bytes) * perByte)
}

// blockCost is the nominal c_i for a block of the given tokens (0: a full
// block).
func (c *plannerCosts) blockCost(i, tokens, blockTokens int) float64 {
	if tokens == 0 || tokens == blockTokens {
		return c.blockS0 + float64(i)*c.blockS1
	}
	return c.prefill.MarginalSeconds(tokens, i*blockTokens)
}

// checkBlock rejects a block whose tier or tokens the Planner cannot plan.
func (p *Planner) checkBlock(c *plannerCosts, i int, b BlockSource) error {
	if b.Tier >= NumTiers || (b.Tier.loadable() && !c.configured[b.Tier]) {
		return fmt.Errorf("planner: block %d: tier %s has no path", i, b.Tier)
	}
	if b.Tokens < 0 || b.Tokens > p.cfg.BlockTokens {
		return fmt.Errorf("planner: block %d: tokens %d is not in [0, %d]", i, b.Tokens, p.cfg.BlockTokens)
	}
	return nil
}

// Plan is PlanQueued with no backlog.
func (p *Planner) Plan(blocks []BlockSource, out []Action) (PlanResult, error) {
	return p.PlanQueued(blocks, out, Backlog{})
}

// PlanQueued writes one Action per block into out, which MUST hold
// len(blocks) (on error out is unchanged), and returns the plan's time
// behind q. It allocates nothing once the scratch space holds the prefix.
func (p *Planner) PlanQueued(blocks []BlockSource, out []Action, q Backlog) (PlanResult, error) {
	cs, err := p.prepare(blocks, out, q)
	if err != nil {
		return PlanResult{}, err
	}
	qs := queue{link: q.Link.Seconds(), drive: q.Drive.Seconds(), gpu: q.GPU.Seconds()}
	best := p.search(cs, blocks, &qs)
	res := p.result(cs, blocks, out, best, &qs)
	if invariants.Enabled {
		p.checkCut(cs, blocks, best, &qs)
	}
	return res, nil
}

// prepare refuses what PlanQueued cannot plan, before anything is
// written, takes the newest fit's costs and grows the scratch space to
// hold the prefix.
func (p *Planner) prepare(blocks []BlockSource, out []Action, q Backlog) (*plannerCosts, error) {
	B := len(blocks)
	if len(out) < B {
		return nil, fmt.Errorf("planner: out has %d elements for %d blocks", len(out), B)
	}
	if q.Link < 0 || q.GPU < 0 || q.Drive < 0 {
		return nil, fmt.Errorf("planner: negative backlog %+v", q)
	}
	cs := p.refresh()
	for i, b := range blocks {
		if err := p.checkBlock(cs, i, b); err != nil {
			return nil, err
		}
	}
	p.grow(B)
	return cs, nil
}

// result writes the cut's actions into out and reports its time. The
// choice was made on the per-position block costs (charged, when the fit
// is uncertain); each plan's time is reported as it runs: nominal costs,
// every pair at the rate of its kind, and the pass's read of the tokens
// present (exactTimes).
func (p *Planner) result(cs *plannerCosts, blocks []BlockSource, out []Action, best cut, q *queue) PlanResult {
	res := PlanResult{}
	if len(blocks) > 0 {
		res.Time, res.LoadAllTime, res.RecomputeAllTime = p.exactTimes(cs, blocks, best, q)
	}
	for i, b := range blocks {
		a := cs.action(i, b, best)
		switch a {
		case ActionRecompute:
			res.RecomputeBlocks++
		case ActionLoad:
			res.LoadBlocks++
		}
		out[i] = a
	}
	return res
}

// checkCut fails when the search's time for best, from its prefix sums,
// disagrees with its plan priced block by block.
func (p *Planner) checkCut(cs *plannerCosts, blocks []BlockSource, best cut, q *queue) {
	if len(blocks) == 0 {
		return
	}
	got := p.chargedTime(cs, blocks, best, q)
	if math.Abs(got-best.t) > 1e-9*math.Max(1, best.t) {
		invariants.Failf("planner's search priced its cut %g s, its plan block by block %g s", best.t, got)
	}
}
