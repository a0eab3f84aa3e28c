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
	Tier Tier
	// Tokens is the block's token count when it is short of
	// PlannerConfig.BlockTokens (a prompt's trailing partial block); 0
	// means a full block. Its recompute is priced by its tokens; its load
	// moves a whole block's slot.
	Tokens int
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
	// Time is when the last block is present and the prefill's forward
	// pass is done, from the moment the plan starts, under the model of
	// Planner: never less than the pass floor (Scenario.PassFloor).
	Time            time.Duration
	LoadBlocks      int
	RecomputeBlocks int
	// LoadAllTime is Time for the plan that loads every block it can (and
	// recomputes only the missing ones); RecomputeAllTime for the plan that
	// recomputes every block not on the GPU. Both for comparison.
	LoadAllTime      time.Duration
	RecomputeAllTime time.Duration
}

// PlannerConfig describes the machine a Planner plans for.
type PlannerConfig struct {
	Model Model
	GPU   GPU
	TP    int // tensor-parallel degree, >= 1
	// BlockTokens is the tokens per block (vLLM's default is 16).
	BlockTokens int
	// MaxBlocks sizes the Planner's scratch space up front, e.g. 4096.
	// A longer prefix is planned all the same: its first plan grows the
	// scratch space (one allocation), later ones of that length allocate
	// nothing. 0 takes 1024.
	MaxBlocks int
	// Calibration, when set, is what this server measured: every plan
	// reads its current Fit (one atomic load) and prices prefill and the
	// links by it (links by name: a fitted link replaces a path's hop of
	// the same name). The fit's error widths make the plan careful where
	// a decision is close (see Planner). nil: the presets, taken as exact.
	Calibration *Calibration
	// Paths[t] is how blocks of tier t reach the GPU, for t in TierHost,
	// TierNVMe, TierRemote. A tier left zero cannot be planned: a block in
	// it is an error. Every path's Ingress should be the same GPU link, since
	// the model lets all loads share it.
	Paths [NumTiers]Path
}

// Planner chooses, for each block of a prefix, whether to load it or
// recompute it, minimising the time until the whole prefix is on the GPU.
//
// The model. Loads and recompute run at once, from time 0:
//   - Loads share the GPU's ingress link and cross it one after another in
//     block order (one copy stream, FIFO). A block of tier t occupies it for
//     its path's per-block time s_t (the slower hop's when pipelined), and no
//     block of tier t can finish before its path's latency: the j-th load
//     finishes at D_j = max(D_{j-1}, lat_t) + s_t.
//   - Recompute runs on the GPU, one block after another in token order.
//     Block i's recompute costs c_i (prefill of its tokens after i blocks of
//     context, attention included) and cannot start before every earlier
//     block is present: E_i = max(E_prev, D_last load before i) + c_i.
//   - Blocks already on the GPU are present at 0.
//   - The prefill is at least one forward pass, and no pass is shorter than
//     the weights' read from HBM (Scenario.PassFloor): a plan's time is
//     never less than that floor, whatever it loads or recomputes. The
//     floor is the same for every plan, so it changes no choice.
//   - A block short of BlockTokens (BlockSource.Tokens) recomputes its
//     tokens only, and loads as a whole block.
//
// The plan's time is max(last D, last E). Unrolling both recurrences, it is
// the longest of the paths "load from block j up to before block x, then
// recompute every recomputed block from x on" (plus the all-recompute path):
//
//	T = max( Rtot, max over loaded j, x > j of lat_j + S[j,x) + R[x,B) )
//
// where S sums the loads' s and R the recomputes' c. Missing blocks are
// always recomputed.
//
// The algorithm. First the single cut: every non-GPU block before q is
// recomputed, every loadable block from q on is loaded. With prefix sums and
// suffix maxima each q's time is O(1), so all B+1 cuts cost O(B) in three
// passes. Exchange arguments say why cuts: if a loaded block i precedes a
// recomputed block j and loading j costs no more than loading i, then
// recomputing i and loading j instead never lengthens any path (c_i <= c_j,
// since later blocks attend to more context). So when the loadable blocks
// share one load cost (one tier: the common case) the best single cut is
// optimal; tests check it against brute force.
//
// With tiers of different load costs, the same argument leaves nested cuts:
// recompute everything before q1, and in [q1, q2) load the cheap tiers while
// recomputing the dear ones (a block on NVMe behind blocks in host memory is
// recomputed while they load). For each way to split the tiers present into
// cheap and dear, Plan runs a coordinate descent over (q1, q2), each step an
// O(B) scan, from q1 = 0 and from the best single cut. The result is never
// worse than the best single cut and every time it reports is exact for its
// plan; on random cases against brute force it is optimal in over 99% and
// within 4% in the worst (TestPlanMixedTiers). The exact problem with
// arbitrary costs contains PARTITION, so no fast exact algorithm is expected.
//
// Calibrated costs and uncertainty. With a Calibration, the block costs
// come from its fit: c_i is the fit's marginal prefill of block i (linear
// and attention work, PrefillCost.MarginalSeconds), and every plan pays
// the fit's per-pass cost once, at the end (it is the same for every plan,
// so it changes no choice):
//
//	Time = max(G + floor, pass + max(T, G))
//
// The choice is made on those per-position costs, which price a block's
// pairs with every block before it at the prefix rate. The time reported
// for a plan (and for loading or recomputing everything) is the plan as it
// runs: each recomputed block's pairs with the blocks recomputed before it
// at the attention rate, with the present ones at the prefix rate
// (PrefillCost.BlockSeconds), and the pass's read of the tokens present
// added to its cost, so that a suffix recomputed after present blocks
// takes exactly the fit's Seconds. The two agree when the fit has one
// attention rate and no read term, as the presets do.
//
// The fit reports a relative error width for prefill and for each link.
// A choice is made on charged costs, c × (1 + prefill width) and s × (1 +
// the path's widest link width), and reported at nominal costs: the side
// whose figure is less certain must win by more than its uncertainty, so
// that a close call goes to the option that stays good if the uncertain
// figure is wrong.
//
// Queues. PlanQueued takes what is already queued (Backlog): the GPU's
// ingress is busy for Link before this request's first load can start
// (the j-th load ends at max(D_{j-1}, lat_t, Link) + s_t), and the GPU
// for GPU before its first recompute (E starts at GPU). Under load a
// request then recomputes what would wait too long behind a busy link,
// and loads what would wait too long behind a busy GPU.
//
// A Planner is not safe for concurrent use: give each goroutine its own, or
// lock around Plan. BlockRecomputeCost is safe beside Plan. Plan allocates
// nothing once its scratch space holds the request (MaxBlocks).
type Planner struct {
	cfg PlannerConfig
	// costs are the nominal and charged costs of the current fit; Plan
	// swaps in new ones when the Calibration publishes a new Fit.
	costs atomic.Pointer[plannerCosts]
	fit   *Fit // the fit costs came from; nil for the presets
	// Scratch, at least len(blocks)+1 each.
	loadPre []float64 // S before block i
	recPre  []float64 // recompute of all non-GPU blocks before i
	missSuf []float64 // recompute of missing blocks from i on
	pathSuf []float64 // max over loaded j >= i of the longest path starting at j
	fSuf    []float64 // max over x >= i of S[x] + R_missing[x,B)
	hand    []float64 // fSuf[i+1] - S[i] (0 at B): a load line through i continues to this
	blkS    []float64 // s of block i's tier, 0 when it is not loadable
	blkLat  []float64 // latency of block i's tier
	blkC    []float64 // c_i of this plan (charged), a short block's by its tokens
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
	configured       [NumTiers]bool
	// Charged costs (see Planner): recompute × chargeC, loads chargedS.
	chargeC   float64
	chargedS  [NumTiers]float64
	uncertain bool // some width is not 0: choices use the charged costs
}

// Backlog is the work already queued where a plan's own work will run.
type Backlog struct {
	// Link is how long the GPU's ingress stays busy with copies queued
	// before this request's (the bytes queued over its bandwidth:
	// Planner.LinkBusy).
	Link time.Duration
	// GPU is how long the GPU stays busy with prefill queued before this
	// request's.
	GPU time.Duration
}

// NewPlanner validates the configuration and precomputes every block's
// recompute cost.
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
	c := &plannerCosts{prefill: fit.PrefillCost(&cfg.Model, &cfg.GPU, cfg.TP), chargeC: 1}
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
		c.loadS[t] = bytes * path.secondsPerByte()
		c.latS[t] = path.latencySeconds()
		c.chargedS[t] = c.loadS[t] * (1 + w)
		c.configured[t] = true
		if w > 0 {
			c.uncertain = true
		}
	}
	p.fit = fit
	p.costs.Store(c)
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
	if len(p.loadPre) >= n {
		return
	}
	n = max(n, 2*len(p.loadPre))
	p.loadPre = make([]float64, n)
	p.recPre = make([]float64, n)
	p.missSuf = make([]float64, n)
	p.pathSuf = make([]float64, n)
	p.fSuf = make([]float64, n)
	p.hand = make([]float64, n)
	p.blkS = make([]float64, n)
	p.blkLat = make([]float64, n)
	p.blkC = make([]float64, n)
}

// Config returns the configuration the Planner was built with.
func (p *Planner) Config() PlannerConfig { return p.cfg }

// BlockRecomputeCost is the prefill time of block i (0-based) when the i
// blocks before it are present: what losing it costs, under the fit the
// last plan used. Safe for concurrent use, also beside Plan.
func (p *Planner) BlockRecomputeCost(i int) time.Duration {
	c := p.costs.Load()
	return seconds(c.blockCost(max(i, 0), 0, p.cfg.BlockTokens))
}

// Prefill is the prefill cost the last plan used (the fit's, or the
// presets'): what a replay executes to stay faithful to the plans.
func (p *Planner) Prefill() PrefillCost { return p.costs.Load().prefill }

// PassFloor is the shortest forward pass (Scenario.PassFloor): no plan
// takes less.
func (p *Planner) PassFloor() time.Duration { return seconds(p.costs.Load().prefill.FloorSeconds) }

// LinkBusy is how long bytes queued on the GPU's ingress (of tier t's
// path) keep it busy: the Backlog.Link of a server that counts bytes.
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

// Plan writes one Action per block into out[:len(blocks)] and returns the
// plan's time, on an idle link and GPU: PlanQueued with no backlog.
func (p *Planner) Plan(blocks []BlockSource, out []Action) (PlanResult, error) {
	return p.PlanQueued(blocks, out, Backlog{})
}

// PlanQueued writes one Action per block into out[:len(blocks)] and
// returns the plan's time from now, behind the work already queued (q).
// out MUST have at least len(blocks) elements; on error out is left
// unchanged. It allocates nothing once the scratch space holds the
// prefix (PlannerConfig.MaxBlocks).
func (p *Planner) PlanQueued(blocks []BlockSource, out []Action, q Backlog) (PlanResult, error) {
	cs, err := p.prepare(blocks, out, q)
	if err != nil {
		return PlanResult{}, err
	}
	linkQ, gpuQ := q.Link.Seconds(), q.GPU.Seconds()
	best := p.search(cs, blocks, linkQ, gpuQ)
	res := p.result(cs, blocks, out, best, linkQ, gpuQ)
	if invariants.Enabled {
		p.checkClosedForm(cs, blocks, best, linkQ, gpuQ)
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
	if q.Link < 0 || q.GPU < 0 {
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
func (p *Planner) result(cs *plannerCosts, blocks []BlockSource, out []Action, best cut, linkQ, gpuQ float64) PlanResult {
	res := PlanResult{}
	if len(blocks) > 0 {
		res.Time, res.LoadAllTime, res.RecomputeAllTime = p.exactTimes(cs, blocks, best, linkQ, gpuQ)
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

// checkClosedForm fails when the search's time for best disagrees with a
// simulation of its plan. The closed form counts the GPU's backlog as a
// path even when nothing is recomputed; finish waits for it either way.
func (p *Planner) checkClosedForm(cs *plannerCosts, blocks []BlockSource, best cut, linkQ, gpuQ float64) {
	got := max(p.simulateCut(cs, blocks, best, linkQ, gpuQ, true), gpuQ)
	if planT := max(best.t, gpuQ); math.Abs(got-planT) > 1e-9*math.Max(1, planT) {
		invariants.Failf("planner's closed form %g s disagrees with simulation %g s", planT, got)
	}
}
