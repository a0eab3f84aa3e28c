package kvtier

import (
	"errors"
	"fmt"
	"math"
	"time"

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
	// CapacityBytes is a hard limit: 512 GiB of 2.5 MiB slots (16 tokens of
	// a 70B model), say, is 209,715 slots.
	CapacityBytes int64
	SlotBytes     int64 // one block's size in this tier
	// Policy picks victims, for example policy.NewDenseLRU[BlockRef](slots).
	// The manager OWNS it after New: one per tier and manager.
	Policy policy.Policy[BlockRef]
	// Admitter filters the copies the manager makes into this tier (not
	// Insert) by how often requests used the block; then Gate decides if
	// the write is worth it and within budget (costplan.Gate). Nil: all.
	Admitter policy.Admitter[Key]
	Gate     WriteGate
	// NewPolicy makes the policy of each tenant of Config.Tenants in this
	// tier, with room for slots blocks (the tenant's cap, or the tier's
	// slots): policy.NewDenseNamed with the tier's policy name, say.
	// Required with Tenants; unused without.
	NewPolicy func(slots int) (policy.Policy[BlockRef], error)
}

// Config configures a Manager.
type Config struct {
	BlockTokens int                  // tokens per block, for example 16 (vLLM)
	Tiers       [NumTiers]TierConfig // indexed by Tier; at least one present
	// WriteThrough copies a block to the next present tier as soon as it is
	// ready in a tier. Otherwise it is copied when evicted (write-back):
	// a call that finds its tier full of blocks to demote starts demotions
	// and fails (Insert: ErrNoSpace) or skips until they complete.
	WriteThrough bool
	Mover        Mover   // the copies; required with two or more tiers
	Planner      Planner // load or recompute; nil means LoadAll
	// RecomputeSeconds, when set, gives cost-aware policies the prefill
	// seconds of a block at a position (costplan.RecomputeSeconds).
	RecomputeSeconds func(position int) float64
	// MaxHoleBlocks lets a lookup go on past up to this many missing blocks
	// (holes) and return the cached blocks after them. Example: with 2, a
	// request whose blocks 3 and 7 were evicted still gets 4-6 and 8-...
	MaxHoleBlocks  int
	DisableMetrics bool // counters off: Metrics returns zeros
	// EventBuffer turns the event stream on (Manager.Subscribe): the ring
	// keeps the last EventBuffer events (rounded up to a power of two) for
	// subscribers that fall behind. 65,536 events of 16-token blocks take
	// 6 MiB. 0: no events.
	EventBuffer int
	// Tenants gives these salts eviction of their own (TenantLimit): one
	// tenant flooding a tier evicts its own blocks first. Salts not listed
	// share the tier's Policy as the default group, of weight 1. Example:
	// {Salt: s, Slots: {GPU: 4096}, Weight: 2}. Nil: one policy for all.
	Tenants []TenantLimit
	// Now is the clock of pin time limits (Pin), called with and without
	// the manager's lock, so safe for concurrent use; nil is time.Now.
	Now func() time.Time
}

// Errors returned by the manager. Wrapped errors name the field, block or
// tier; test them with errors.Is.
var (
	ErrConfig     = errors.New("kvtier: invalid config")        // a Config field is wrong
	ErrNoSpace    = errors.New("kvtier: no evictable slot")     // a tier has no free slot and no evictable block now
	ErrBadInput   = errors.New("kvtier: bad input")             // an unknown tier, a lease in use, a wrong argument
	ErrMove       = errors.New("kvtier: copy failed")           // a copy the Mover reported as failed
	ErrSourceLost = errors.New("kvtier: source copy lost")      // in an op's error: its NVMe source is gone, the copy forgotten
	ErrNotWanted  = errors.New("kvtier: copy no longer wanted") // in an op's error: Batch.Wanted was false; not a failure
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
	if c.EventBuffer < 0 || c.EventBuffer > maxEventBuffer || c.EventBuffer*c.BlockTokens > maxEventBufferToken {
		return slots, configErr("EventBuffer", "%d is not in [0, %d], or keeps more than %d tokens of %d-token blocks", c.EventBuffer, maxEventBuffer, maxEventBufferToken, c.BlockTokens)
	}
	present := 0
	for t := range NumTiers {
		tc := &c.Tiers[t]
		name := func(f string) string { return fmt.Sprintf("Tiers[%v].%s", t, f) }
		if tc.CapacityBytes < 0 {
			return slots, configErr(name("CapacityBytes"), "%d is negative", tc.CapacityBytes)
		}
		if tc.CapacityBytes == 0 {
			if tc.Policy != nil || tc.Admitter != nil || tc.Gate != nil || tc.SlotBytes != 0 || tc.NewPolicy != nil {
				return slots, configErr(name("CapacityBytes"), "is 0 (tier absent) but SlotBytes, Policy, NewPolicy, Admitter or Gate is set")
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
	if err := c.validateTenants(slots); err != nil {
		return slots, err
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
