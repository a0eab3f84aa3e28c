package replay

import (
	"fmt"
	"time"

	"kvtier.dev/internal/invariants"
	"kvtier.dev/kvtier"
	"kvtier.dev/kvtier/cost"
	"kvtier.dev/kvtier/costplan"
	"kvtier.dev/kvtier/policy"
	"kvtier.dev/kvtier/trace"
)

// planScratchBlocks sizes the cost model's scratch space (4,096 blocks of
// 512 tokens is 2M tokens); a longer request is planned all the same, and
// grows it.
const planScratchBlocks = 4096

// engine replays one trace under one strategy: a discrete-event simulation
// on a virtual clock. It is single-threaded; the block manager's Mover is
// the engine itself, which completes copies when the clock reaches their end.
type engine struct {
	cfg        Config
	strategy   costplan.Strategy
	progress   func(requests int)
	model      cost.Model
	gpu        cost.GPU
	scen       cost.Scenario
	cal        *cost.Calibration // nil: the presets
	prefill    cost.PrefillCost  // how long prefill takes: the calibration's, or the presets'
	hostLink   cost.Link
	drive      cost.Drive // the NVMe drive's read and write links
	nvmePath   cost.Path
	blockBytes int64         // one block's KV on one GPU rank
	codec      cost.Codec    // how the lower tiers hold blocks (codec.go)
	stored     int64         // a block as they hold it: blockBytes without a codec
	bt         int           // tokens per block
	floor      time.Duration // the shortest forward pass (kvtier/cost)
	// copyLatency and copyStream time a block copy between two tiers:
	// its path's latency (overlapping earlier copies) and its time on the
	// channel (see link.go). loadTime is a load's alone, by source tier.
	copyLatency, copyStream [kvtier.NumTiers][kvtier.NumTiers]time.Duration
	loadTime                [kvtier.NumTiers]time.Duration
	fullBlockCost           []time.Duration // prefill time of a full block i, by i

	m      *kvtier.Manager
	remote *remoteLevel // nil: no remote tier
	rspec  *RemoteSpec  // the remote tier start builds, if any
	// costs prices a block's recompute (the cost-aware policy's and the
	// report's); the manager's Planner is the strategy's (costplan).
	costs *cost.Planner
	// loading maps the lookup lease of each request prefilling to it: the
	// copies into the GPU a Batch asks for are its lease's request's.
	loading map[*kvtier.Lease]*request
	dev     *devicePath // Config.Mover "device": the devmover.Mover's copies (device.go)
	// planned, when set (tests), sees each request right after its Plan.
	planned func(r *request)
	// devStats are the device path's counts, kept when it closes.
	devStats devicePathStats

	now     time.Duration
	events  eventHeap
	seq     uint64
	servers [numChannels]server
	serving [numChannels]copyJob

	admitQueue []*request // arrived, waiting for a prefill slot
	admitHead  int
	inPrefill  int
	gpuHeld    int64 // blocks of the requests prefilling or decoding
	gpuSlots   int64 // the GPU's KV capacity in blocks

	computeRunning int // requests whose pass is running
	// memBlocked: the request first in line waits for GPU memory with a
	// prefill slot free, since memBlockedAt (memoryWait).
	memBlocked   bool
	memBlockedAt time.Duration

	// With Config.DecodeOnGPU (decode.go):
	decoding []*request // the requests decoding, in the order they started
	inRound  bool       // a decode round is running on the GPU

	inFlight int // copies submitted and not completed

	layerEvents []kvtier.Event // scratch of layerLanded
	// Requests waiting for GPU slots (space.go), in arrival order, and
	// the other buffer of waiting; gpuFreed counts the slots the copies
	// out of the GPU and the released leases may have freed so far, and
	// wake is the least count at which a waiting request may fit.
	waiting, retry []*request
	gpuFreed, wake int64
	// free and keptLeases are done requests and their leases, kept for
	// the next requests (budget.go).
	free       []*request
	keptLeases []*leasePair

	src     *trace.Reader
	next    trace.Request
	pending bool // next holds a request not yet arrived

	res   tally
	ttfts []time.Duration
	// salts tally each salt's lookups (tenants.go); otherSalts those past
	// maxSaltTallies.
	salts      map[kvtier.Salt]*saltTally
	otherSalts saltTally

	// onRequest, when set, gets each request's record as it ends
	// (Options.OnRequest); its first error stops the replay.
	onRequest func(RequestRecord) error
	recordErr error

	flight inFlight   // the requests in flight and their memory (budget.go)
	clock  clockGuard // the first event time that overflowed (clock.go)
	name   string     // the trace's name, for errors
}

// newEngine resolves cfg's presets.
func newEngine(cfg Config, strategy costplan.Strategy) (*engine, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	e := &engine{cfg: cfg, strategy: strategy, wake: noWake}
	var err error
	if e.codec, err = cfg.lowerCodec(); err != nil {
		return nil, err
	}
	if e.model, err = cost.LookupModel(cfg.Model); err != nil {
		return nil, cfgErr("model", "%v", err)
	}
	if e.gpu, err = cost.LookupGPU(cfg.GPU); err != nil {
		return nil, cfgErr("gpu", "%v", err)
	}
	if cfg.GPUMemoryBytes > 0 {
		e.gpu.MemoryBytes = int64(cfg.GPUMemoryBytes)
		if err := e.gpu.Validate(); err != nil {
			return nil, cfgErr("gpu_memory", "%v", err)
		}
	}
	if e.hostLink, err = cost.LookupLink(cfg.HostLink); err != nil {
		return nil, cfgErr("host_link", "%v", err)
	}
	if e.drive, err = loadDrive(cfg.NVMeLink); err != nil {
		return nil, cfgErr("nvme_link", "%v", err)
	}
	var fit *cost.Fit
	if cfg.Calibration != "" {
		if e.cal, err = cost.LoadCalibrationFile(cfg.Calibration, e.gpu, e.model); err != nil {
			return nil, cfgErr("calibration", "%v", err)
		}
		fit = e.cal.Current()
		e.hostLink, _ = fit.Link(e.hostLink)
		e.drive.Read, _ = fit.Link(e.drive.Read)
		e.drive.Write, _ = fit.Link(e.drive.Write)
	}
	e.nvmePath = cost.Path{Source: e.drive.Read, Ingress: e.hostLink, Pipelined: true}
	e.scen = cost.Scenario{Model: e.model, GPU: e.gpu, TP: cfg.TP, Path: cost.DirectPath(e.hostLink), Fit: fit}
	if err := e.scen.Validate(); err != nil {
		return nil, fmt.Errorf("replay: %w", err)
	}
	e.prefill = fit.PrefillCost(&e.model, &e.gpu, cfg.TP)
	if err := e.scen.CheckFits(int64(cfg.GPUBytes)); err != nil {
		return nil, cfgErr("gpu_bytes", "%v", err)
	}
	return e, nil
}

// start builds the block manager once the trace's block size is known.
func (e *engine) start(blockTokens int) error {
	cfg := &e.cfg
	if cfg.BlockTokens != 0 && cfg.BlockTokens != blockTokens {
		return cfgErr("block_tokens", "%d, but the trace's blocks have %d tokens", cfg.BlockTokens, blockTokens)
	}
	e.bt = blockTokens
	e.blockBytes = e.model.KVBytesPerTokenPerRank(cfg.TP) * int64(blockTokens)
	var err error
	if e.res.CodecChoice, err = e.chooseCodec(blockTokens); err != nil {
		return err
	}
	if e.cal != nil { // the codec's kernels as the calibration learned them
		e.codec = e.cal.Current().Codec(e.codec, int64(e.codec.ChunkBlocks)*e.blockBytes)
	}
	e.stored = e.codec.EncodedBlockBytes(&e.model, blockTokens, cfg.TP)
	if err := e.checkCodecShape(); err != nil {
		return err
	}
	hostPath, read, write := cost.DirectPath(e.hostLink), cost.DirectPath(e.drive.Read), cost.DirectPath(e.drive.Write)
	for from := range kvtier.NumTiers {
		for to := range kvtier.NumTiers {
			p := &hostPath // GPU <-> host
			switch {
			case from == kvtier.NVMe && to == kvtier.GPU:
				p = &e.nvmePath // the drive, then the GPU's ingress
			case from == kvtier.NVMe:
				p = &read
			case to == kvtier.NVMe:
				p = &write
			}
			e.copyLatency[from][to], e.copyStream[from][to] = p.Latency(), max(p.StreamTime(e.stored), e.codingTime(from == kvtier.GPU, to == kvtier.GPU))
		}
	}
	for t := range kvtier.NumTiers {
		e.loadTime[t] = e.copyLatency[t][kvtier.GPU] + e.copyStream[t][kvtier.GPU]
	}
	e.floor = e.scen.PassFloor()
	e.res.BlockBytes = e.blockBytes
	e.gpuSlots = int64(cfg.GPUBytes) / e.blockBytes
	if e.gpuSlots == 0 {
		return cfgErr("gpu_bytes", "%v holds no block of %d bytes", cfg.GPUBytes, e.blockBytes)
	}
	if e.strategy == costplan.None {
		return nil
	}
	pcfg := cost.PlannerConfig{Model: e.model, GPU: e.gpu, TP: cfg.TP, BlockTokens: blockTokens,
		MaxBlocks: planScratchBlocks, Calibration: e.cal}
	pcfg.Paths[cost.TierHost] = cost.DirectPath(e.hostLink)
	pcfg.Paths[cost.TierNVMe] = e.nvmePath
	pcfg.Paths[cost.TierHost].Codec, pcfg.Paths[cost.TierNVMe].Codec = e.codec, e.codec
	if e.costs, err = cost.NewPlanner(pcfg); err != nil {
		return fmt.Errorf("replay: %w", err)
	}
	mc := kvtier.Config{
		BlockTokens:      blockTokens,
		Mover:            e,
		RecomputeSeconds: costplan.RecomputeSeconds(e.costs),
		WriteThrough:     cfg.WriteThrough,
		MaxHoleBlocks:    cfg.MaxHoleBlocks,
	}
	if mc.Planner, err = e.strategy.Planner(e.costs); err != nil {
		return fmt.Errorf("replay: %w", err)
	}
	e.loading = make(map[*kvtier.Lease]*request)
	capacity := [kvtier.NumTiers]Bytes{cfg.GPUBytes, cfg.HostBytes, cfg.NVMeBytes}
	if e.strategy == costplan.GPUOnly {
		capacity[kvtier.Host], capacity[kvtier.NVMe] = 0, 0
	}
	if mc.Tenants, err = cfg.managerTenants([kvtier.NumTiers]int64{e.blockBytes, e.stored, e.stored}, capacity); err != nil {
		return err
	}
	for t := range kvtier.NumTiers {
		if capacity[t] == 0 {
			continue
		}
		if mc.Tiers[t], err = e.tierConfig(t, capacity[t]); err != nil {
			return err
		}
		e.res.CapacityBlocks[t] = mc.Tiers[t].CapacityBytes / mc.Tiers[t].SlotBytes
	}
	if cfg.Mover == MoverDevice && (capacity[kvtier.Host] > 0 || capacity[kvtier.NVMe] > 0) {
		if e.dev, err = newDevicePath(e, int64(capacity[kvtier.Host])/e.stored); err != nil {
			return err
		}
	}
	if e.m, err = kvtier.New(mc); err != nil {
		return fmt.Errorf("replay: %w", err)
	}
	if e.rspec != nil && capacity[kvtier.Host] > 0 {
		if e.remote, err = newRemoteLevel(e.rspec, e.stored); err != nil {
			return err
		}
	}
	return nil
}

// tierConfig is tier t's configuration at capacity: its policy and, for
// NVMe, its write gate and admitter.
func (e *engine) tierConfig(t kvtier.Tier, capacity Bytes) (kvtier.TierConfig, error) {
	cfg := &e.cfg
	slotBytes := e.stored // as the lower tiers hold a block
	if t == kvtier.GPU {
		slotBytes = e.blockBytes
	}
	slots := int64(capacity) / slotBytes
	field := [...]string{"gpu_bytes", "host_bytes", "nvme_bytes"}[t]
	if slots == 0 {
		return kvtier.TierConfig{}, cfgErr(field, "%v holds no block of %d bytes", capacity, slotBytes)
	}
	if slots > 1<<31 {
		return kvtier.TierConfig{}, cfgErr(field, "%v makes %d slots, more than 2^31", capacity, slots)
	}
	p, err := policy.NewDenseNamed[kvtier.BlockRef](cfg.Policy, int(slots))
	if err != nil {
		return kvtier.TierConfig{}, cfgErr("policy", "%v", err)
	}
	tc := kvtier.TierConfig{CapacityBytes: int64(capacity), SlotBytes: slotBytes, Policy: p}
	if len(cfg.Tenants) > 0 {
		tc.NewPolicy = func(n int) (policy.Policy[kvtier.BlockRef], error) {
			return policy.NewDenseNamed[kvtier.BlockRef](cfg.Policy, n)
		}
	}
	if t != kvtier.NVMe {
		return tc, nil
	}
	if tc.Gate, err = e.nvmeGate(); err != nil {
		return tc, err
	}
	if cfg.NVMeAdmission == "seen-twice" {
		counters := max(1<<16, 4*int(min(slots, 1<<24)))
		if tc.Admitter, err = policy.NewSeenTwice(counters, counters, func(k kvtier.Key) uint64 { return uint64(k) }); err != nil {
			return tc, cfgErr("nvme_admission", "%v", err)
		}
	}
	return tc, nil
}

// run replays the trace to its end.
func (e *engine) run(src *trace.Reader) (err error) {
	defer func() {
		if cerr := e.closeDevice(); err == nil {
			err = cerr
		}
	}()
	e.src = src
	if err := e.readNext(); err != nil {
		return err
	}
	if e.pending && e.bt == 0 { // not started by a test that seeded the tiers
		if err := e.start(e.next.BlockTokens); err != nil {
			return err
		}
	}
	for {
		if e.dev != nil {
			// The device's next event first, when it comes no later than
			// the replay's own: its completions happen at their times.
			if at, ok := e.dev.next(); ok && (len(e.events) == 0 || at <= e.events[0].at) {
				e.now = at
				if err := e.dev.advance(at); err != nil {
					return err
				}
				if err := e.afterEvent(); err != nil {
					return err
				}
				continue
			}
		}
		if len(e.events) == 0 {
			break
		}
		ev := e.events.pop()
		e.now = ev.at
		if e.dev != nil { // nothing of the device's ends by then: move its clock only
			if err := e.dev.setClock(ev.at); err != nil {
				return err
			}
		}
		switch ev.kind {
		case evArrival:
			if err := e.arrive(); err != nil {
				return err
			}
		case evCopyDone:
			e.copyDone(ev.ch)
		case evComputeDone:
			e.computeDone(ev.r)
		case evDecodeDone:
			e.decodeDone(ev.r)
		case evRoundDone:
			e.roundDone()
		case evRemoteDone:
			e.fetchDone(ev.r)
		}
		if err := e.afterEvent(); err != nil {
			return err
		}
	}
	return e.checkEnd()
}

// afterEvent is what follows every event: the requests that waited for
// space or a prefill slot go on, and the first error stops the replay.
func (e *engine) afterEvent() error {
	if e.slotsMayFit() {
		e.retryWaiting()
	}
	if e.admitHead < len(e.admitQueue) {
		e.admit() // a release or a copy may have made room
	}
	if e.clock.err != nil {
		return e.clock.err
	}
	if e.flight.err != nil {
		return e.flight.err
	}
	if e.recordErr != nil {
		return e.recordErr
	}
	if e.dev != nil && e.dev.err != nil {
		return e.dev.err
	}
	if invariants.Enabled {
		e.check()
	}
	return nil
}

// closeDevice closes the device path, if any, and adds its copy engines'
// busy time to the links'.
func (e *engine) closeDevice() error {
	d := e.dev
	if d == nil {
		return nil
	}
	e.devStats = devicePathStats{mover: d.mv.Stats(), engine: d.eng.Stats(), registrations: len(d.regs)}
	err := d.close()
	e.servers[chanHostToGPU].busyTime += d.busyToGPU
	e.servers[chanGPUToHost].busyTime += d.busyFromGPU
	e.dev = nil
	return err
}
