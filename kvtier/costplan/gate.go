package costplan

import (
	"fmt"
	"sync"
	"time"

	"kvtier.dev/kvtier"
	"kvtier.dev/kvtier/cost"
)

// Drive is what a Gate needs of the drive under its tier: its measured
// write rate and its queue. devmover.Mover measures a real one; the replay
// models one.
type Drive interface {
	// WriteBytesPerS is the drive's measured write rate; 0 until it has
	// been measured (the Gate then uses GateConfig.WriteBytesPerS).
	WriteBytesPerS() float64
	// QueuedWrites is the number of writes queued or in flight.
	QueuedWrites() int
}

// GateConfig configures a Gate. Zero fields take the defaults named.
type GateConfig struct {
	// Model prices a block's recompute at its position and one block's
	// load from Tier, under its current fit (calibrated links included).
	// Nil: every write is worth it, and only the budgets refuse (a model
	// the cost model has no figures for).
	Model *cost.Planner
	Tier  cost.Tier // the gated tier, cost.TierNVMe say
	// Drive is the gated tier's drive; nil: no rate or queue limit.
	Drive Drive
	// WriteBytesPerS is the drive's write rate until Drive has measured
	// one, for example a probe's (0: the rate limit waits for a measure).
	WriteBytesPerS float64
	// WriteShare is the share of the drive's write rate the tier's writes
	// may use on average: 0.5 leaves half of it to reads. 0 means 0.5.
	WriteShare float64
	// MaxQueueDelay refuses a write (QueueFull) when the writes queued or
	// in flight, it included, would keep the drive busy longer than this
	// at its write rate: a prefill's burst of writes is taken, a backlog
	// that would hold host slots for long is not (reads pass the queued
	// writes anyway: see devmover). A write to an idle drive is always
	// taken; with no rate known, only that one. 0 means 100 ms.
	MaxQueueDelay time.Duration
	// DriveWritesPerDay and DriveBytes bound the bytes written to
	// DriveWritesPerDay × DriveBytes a day, on average (a 7.68 TB drive
	// rated at 1 DWPD: 7.68 TB a day, 89 MB/s). 0: no endurance limit.
	DriveWritesPerDay float64
	DriveBytes        int64
	// Persist writes blocks that a load would not be worth, for a tier kept
	// across restarts; the budgets still hold.
	Persist bool
	// Now is the gate's clock; nil means the wall clock. The replay gives
	// its virtual clock.
	Now func() time.Duration
}

// Gate is a kvtier.WriteGate over the cost model: a copy into the tier is
// made only when a later load of the block from it would beat recomputing
// the block at its position (NotWorth otherwise), and only within the
// drive's budgets: a share of its measured write rate (OverRate), its
// drive writes per day (OverEndurance), and a short queue (QueueFull). It
// is safe for concurrent use.
type Gate struct {
	cfg   GateConfig
	start time.Time

	mu        sync.Mutex
	rate      bucket
	endurance bucket
}

// bucket is a token bucket of bytes.
type bucket struct {
	tokens float64
	at     time.Duration
}

// take refills b at rate bytes a second up to depth, and takes n bytes if
// it holds them.
func (b *bucket) take(now time.Duration, rate, depth, n float64) bool {
	b.tokens = min(depth, b.tokens+rate*max(0, now-b.at).Seconds())
	b.at = now
	if b.tokens < n {
		return false
	}
	b.tokens -= n
	return true
}

// rateDepth and enduranceDepth are the buckets' depths in seconds of their
// rates: a burst of writes may go at once after a quiet spell, the average
// holds.
const rateDepth, enduranceDepth = 1, 600

// NewGate checks cfg and returns its Gate.
func NewGate(cfg GateConfig) (*Gate, error) {
	bad := func(field, format string, args ...any) error {
		return fmt.Errorf("%w: costplan.GateConfig.%s: %s", kvtier.ErrConfig, field, fmt.Sprintf(format, args...))
	}
	switch {
	case cfg.Tier != cost.TierHost && cfg.Tier != cost.TierNVMe && cfg.Tier != cost.TierRemote:
		return nil, bad("Tier", "%v is not a tier below the GPU", cfg.Tier)
	case cfg.WriteBytesPerS < 0:
		return nil, bad("WriteBytesPerS", "%g is negative", cfg.WriteBytesPerS)
	case cfg.WriteShare < 0 || cfg.WriteShare > 1:
		return nil, bad("WriteShare", "%g is not in [0, 1]", cfg.WriteShare)
	case cfg.MaxQueueDelay < 0:
		return nil, bad("MaxQueueDelay", "%v is negative", cfg.MaxQueueDelay)
	case cfg.DriveWritesPerDay < 0:
		return nil, bad("DriveWritesPerDay", "%g is negative", cfg.DriveWritesPerDay)
	case cfg.DriveWritesPerDay > 0 && cfg.DriveBytes <= 0:
		return nil, bad("DriveBytes", "%d: DriveWritesPerDay %g needs the drive's size", cfg.DriveBytes, cfg.DriveWritesPerDay)
	}
	if cfg.WriteShare == 0 {
		cfg.WriteShare = 0.5
	}
	if cfg.MaxQueueDelay == 0 {
		cfg.MaxQueueDelay = 100 * time.Millisecond
	}
	g := &Gate{cfg: cfg, start: time.Now()}
	g.rate.tokens = g.rateBytesPerS() * rateDepth
	g.endurance.tokens = g.enduranceBytesPerS() * enduranceDepth
	return g, nil
}

func (g *Gate) now() time.Duration {
	if g.cfg.Now != nil {
		return g.cfg.Now()
	}
	return time.Since(g.start)
}

// writeBytesPerS is the drive's write rate, measured or configured (0:
// unknown).
func (g *Gate) writeBytesPerS() float64 {
	r := g.cfg.WriteBytesPerS
	if d := g.cfg.Drive; d != nil {
		if m := d.WriteBytesPerS(); m > 0 {
			r = m
		}
	}
	return r
}

// rateBytesPerS is the tier's share of the drive's write rate (0: unknown).
func (g *Gate) rateBytesPerS() float64 { return g.cfg.WriteShare * g.writeBytesPerS() }

// queueFull reports whether a write of bytes, behind queued writes of
// the same size, would keep the drive busy past MaxQueueDelay.
func (g *Gate) queueFull(queued int, bytes int64) bool {
	if queued == 0 {
		return false
	}
	r := g.writeBytesPerS()
	return r == 0 || float64(queued+1)*float64(bytes)/r > g.cfg.MaxQueueDelay.Seconds()
}

func (g *Gate) enduranceBytesPerS() float64 {
	return g.cfg.DriveWritesPerDay * float64(g.cfg.DriveBytes) / (24 * 3600)
}

// Worth reports whether a load of the block at position from the gated
// tier, alone on an idle path, would beat recomputing it: what writing it
// can save at all.
func (g *Gate) Worth(position int) bool {
	if g.cfg.Model == nil {
		return true
	}
	load := g.cfg.Model.BlockLoadCost(g.cfg.Tier)
	return load > 0 && load < g.cfg.Model.BlockRecomputeCost(position)
}

// BreakEven is the first position, up to maxPosition, from which a load
// from the gated tier beats recomputing a block (a block's recompute grows
// with its position, a load does not), or false when none does: then the
// tier is worth no write at all, and a server says so.
func (g *Gate) BreakEven(maxPosition int) (int, bool) {
	lo, hi := 0, maxPosition+1 // Worth is false below the answer, true from it
	for lo < hi {
		mid := lo + (hi-lo)/2
		if g.Worth(mid) {
			hi = mid
		} else {
			lo = mid + 1
		}
	}
	return lo, lo <= maxPosition
}

// AllowWrite implements kvtier.WriteGate.
func (g *Gate) AllowWrite(position int, bytes int64) kvtier.Refusal {
	if !g.cfg.Persist && !g.Worth(position) {
		return kvtier.NotWorth
	}
	d := g.cfg.Drive
	if d != nil && g.queueFull(d.QueuedWrites(), bytes) {
		return kvtier.QueueFull
	}
	now, n := g.now(), float64(bytes)
	g.mu.Lock()
	defer g.mu.Unlock()
	// Take from both buckets or from neither: work on copies, keep them
	// only when the write is allowed (a bucket not kept refills from its
	// old time, so nothing is lost).
	endurance, rate := g.endurance, g.rate
	if e := g.enduranceBytesPerS(); e > 0 && !endurance.take(now, e, max(n, e*enduranceDepth), n) {
		return kvtier.OverEndurance
	}
	if r := g.rateBytesPerS(); d != nil && r > 0 && !rate.take(now, r, max(n, r*rateDepth), n) {
		return kvtier.OverRate
	}
	g.endurance, g.rate = endurance, rate
	return kvtier.Allowed
}
