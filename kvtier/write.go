package kvtier

// Writes into a slow tier are admitted, not assumed: the copies the manager
// makes on its own account into a tier (write-through, demotion, Offload)
// pass its Admitter (is the block used often enough?) and its WriteGate (is
// a later load from the tier worth it, and does the tier's budget allow the
// write now?). A refused copy is simply not made: the block stays where it
// is, or, for a demotion, leaves the faster tier unwritten.

// Refusal says why a copy into a tier was not made (Allowed: it was).
type Refusal uint8

const (
	Allowed       Refusal = iota
	NotAdmitted           // the tier's Admitter: not used often enough
	NotWorth              // a load from the tier would not beat recomputing the block
	OverRate              // the tier's share of its drive's write rate is spent
	OverEndurance         // the tier's drive writes per day are spent
	QueueFull             // the drive's write queue is full
	NumRefusals           // counts the refusals; not one
)

// String names the refusal, as in metrics.
func (r Refusal) String() string {
	switch r {
	case Allowed:
		return "allowed"
	case NotAdmitted:
		return "not_admitted"
	case NotWorth:
		return "not_worth"
	case OverRate:
		return "over_rate"
	case OverEndurance:
		return "over_endurance"
	case QueueFull:
		return "queue_full"
	}
	return "refusal(?)"
}

// WriteGate decides the copies the manager makes on its own account into a
// tier (TierConfig.Gate). AllowWrite runs under the manager's lock: it MUST
// be cheap and MUST NOT call the manager; Allowed takes the write's bytes
// from the gate's budget.
type WriteGate interface {
	AllowWrite(position int, bytes int64) Refusal
}

// admitWrite reports whether the manager may copy block r into tier t on
// its own account, counting a refusal by its reason.
func (m *Manager) admitWrite(t Tier, r *record) bool {
	ts := &m.tiers[t]
	why := Allowed
	switch {
	case ts.admitter != nil && !ts.admitter.Admit(r.key):
		why = NotAdmitted
	case ts.gate != nil:
		why = ts.gate.AllowWrite(int(r.depth), ts.slotBytes)
	}
	if why != Allowed {
		m.metrics.tier(t).refused(why)
		return false
	}
	return true
}

// Wanted reports whether op i's block is still wanted at its destination
// (false once invalidated): a Mover that queues a copy completes an unwanted
// op with an error wrapping ErrNotWanted instead of starting it.
func (b *Batch) Wanted(i int) bool {
	if b.relay != nil {
		return b.relay.Wanted(i)
	}
	m, op := b.m, &b.Ops[i]
	st := &m.stripes[0]
	m.rlock(st)
	defer m.runlock(st)
	r := m.recs.at(op.Ref)
	return r.key == op.Key && r.flags&flagInvalid == 0
}
