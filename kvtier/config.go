package kvtier

import (
	"errors"
	"fmt"
	"math"

	"kvtier.dev/kvtier/policy"
)

// MaxBlockTokens bounds Config.BlockTokens so that one block's tokens and its
// hashing buffer stay small.
const MaxBlockTokens = 1 << 16

// maxSlots bounds a tier's slot count: slots and BlockRefs are uint32 and the
// all-ones value marks "no slot".
const maxSlots = math.MaxUint32 - 1

// TierConfig sizes one tier. A tier with CapacityBytes 0 is absent.
type TierConfig struct {
	// CapacityBytes is a hard limit on the bytes the tier holds (invariant 4).
	// For example 512 GiB of host pool with SlotBytes of 2.5 MiB (a 16-token
	// block of a 70B model, all 80 layers, K and V, fp16) gives 209,715 slots.
	CapacityBytes int64
	// SlotBytes is one block's size in this tier; every slot has this size.
	SlotBytes int64
	// Policy picks this tier's victims. The manager OWNS it after New and
	// locks around every call; it MUST NOT be shared with another tier or
	// manager. BlockRefs are dense, so the dense policies, for example
	// policy.NewDenseLRU[BlockRef](slots), index them with a slice instead
	// of a map: cheaper per touch and per resident block.
	Policy policy.Policy[BlockRef]
	// Admitter, when set, filters the copies the manager makes into this
	// tier (write-through, demotion, Offload); an explicit Insert is not
	// filtered. For NVMe, policy's SeenTwice spares the drive. The manager
	// records every block a lookup or insert names. Nil admits everything.
	Admitter policy.Admitter[Key]
}

// Config configures a Manager.
type Config struct {
	// BlockTokens is the number of tokens per block, for example 16 (vLLM)
	// or 512 (the Mooncake traces). Only full blocks are cached.
	BlockTokens int
	// Tiers sizes each tier, indexed by Tier. At least one must be present.
	Tiers [NumTiers]TierConfig
	// WriteThrough copies a block to the next present tier as soon as it is
	// ready in a tier (so that evicting it later is free). Otherwise the copy
	// is made when the block is evicted (write-back demotion): the victim's
	// slot frees only when that copy completes, so a call that finds its tier
	// full of blocks to demote starts demotions for as many slots as it
	// needs, returns ErrNoSpace (Insert) or skips (Onboard, Offload), and
	// succeeds when retried after the copies complete.
	WriteThrough bool
	// Mover performs the copies between tiers. Required when two or more
	// tiers are present.
	Mover Mover
	// Planner decides, per looked-up block, load or recompute. Nil means
	// LoadAll.
	Planner Planner
	// RecomputeSeconds, when set, tells cost-aware policies what losing the
	// block at a position would cost in seconds of prefill (kvtier/cost): a
	// block deep in a long prefix costs more than an early one. Nil means 0.
	RecomputeSeconds func(position int) float64
	// MaxHoleBlocks lets a lookup go on past missing blocks (holes), up to
	// this many per lookup, and return the cached blocks after them, so
	// that the planner can recompute the holes and load the rest. Example:
	// with 2, a request whose blocks 3 and 7 were evicted everywhere still
	// gets blocks 4-6 and 8-... from the cache. 0 stops at the first
	// missing block (the cached prefix only). Misses cost a lookup an index
	// probe each, so keep it small.
	MaxHoleBlocks int
	// DisableMetrics turns the counters off; Metrics then returns zeros.
	DisableMetrics bool
}

// Errors returned by the manager. Wrapped errors name the field, block or
// tier; test them with errors.Is.
var (
	// ErrConfig marks an invalid Config.
	ErrConfig = errors.New("kvtier: invalid config")
	// ErrNoSpace means a tier has no free slot and no evictable block now.
	ErrNoSpace = errors.New("kvtier: no evictable slot")
	// ErrBadInput marks invalid arguments (an unknown tier, a lease in use).
	ErrBadInput = errors.New("kvtier: bad input")
	// ErrMove marks a copy the Mover reported as failed.
	ErrMove = errors.New("kvtier: copy failed")
	// ErrSourceLost, wrapped in the error a Mover completes an op with,
	// says the op's source copy is gone (an NVMe slot that failed its
	// checksum or could not be read): the manager then forgets that copy
	// too, instead of serving the block from it again and failing again.
	// It is honoured for sources in the NVMe tier, which one copy at a time
	// reads (into the GPU); elsewhere the failure counts as any other.
	ErrSourceLost = errors.New("kvtier: source copy lost")
)

func configErr(field, format string, args ...any) error {
	return fmt.Errorf("%w: %s: %s", ErrConfig, field, fmt.Sprintf(format, args...))
}

// validate checks c and returns the slot count of each tier.
func (c *Config) validate() ([NumTiers]uint32, error) {
	var slots [NumTiers]uint32
	if c.MaxHoleBlocks < 0 {
		return slots, configErr("MaxHoleBlocks", "%d is negative", c.MaxHoleBlocks)
	}
	if c.BlockTokens <= 0 || c.BlockTokens > MaxBlockTokens {
		return slots, configErr("BlockTokens", "%d is not in [1, %d]", c.BlockTokens, MaxBlockTokens)
	}
	present := 0
	for t := range NumTiers {
		tc := &c.Tiers[t]
		name := func(f string) string { return fmt.Sprintf("Tiers[%v].%s", t, f) }
		if tc.CapacityBytes < 0 {
			return slots, configErr(name("CapacityBytes"), "%d is negative", tc.CapacityBytes)
		}
		if tc.CapacityBytes == 0 {
			if tc.Policy != nil || tc.Admitter != nil || tc.SlotBytes != 0 {
				return slots, configErr(name("CapacityBytes"), "is 0 (tier absent) but SlotBytes, Policy or Admitter is set")
			}
			continue
		}
		if tc.SlotBytes <= 0 {
			return slots, configErr(name("SlotBytes"), "%d is not positive", tc.SlotBytes)
		}
		n := tc.CapacityBytes / tc.SlotBytes
		if n == 0 {
			return slots, configErr(name("CapacityBytes"), "%d holds no slot of %d bytes", tc.CapacityBytes, tc.SlotBytes)
		}
		if n > maxSlots {
			return slots, configErr(name("CapacityBytes"), "%d bytes make %d slots, more than %d", tc.CapacityBytes, n, int64(maxSlots))
		}
		if tc.Policy == nil {
			return slots, configErr(name("Policy"), "is nil")
		}
		for u := range t {
			if c.Tiers[u].Policy != nil && samePolicy(c.Tiers[u].Policy, tc.Policy) {
				return slots, configErr(name("Policy"), "is the same policy as Tiers[%v].Policy", u)
			}
		}
		slots[t] = uint32(n)
		present++
	}
	if present == 0 {
		return slots, configErr("Tiers", "no tier has a capacity")
	}
	if present > 1 && c.Mover == nil {
		return slots, configErr("Mover", "is nil but %d tiers are present", present)
	}
	return slots, nil
}

// samePolicy reports whether two policies are one object, without panicking
// on dynamic types that are not comparable.
func samePolicy(a, b policy.Policy[BlockRef]) (same bool) {
	defer func() {
		if recover() != nil {
			same = false
		}
	}()
	return a == b
}
