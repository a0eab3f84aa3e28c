package kvtier

import (
	"errors"
	"math/rand/v2"
	"sync"
	"testing"

	"kvtier.dev/kvtier/policy"
)

func newLRU(t testing.TB, n int) policy.Policy[BlockRef] {
	t.Helper()
	p, err := policy.NewDenseLRU[BlockRef](n)
	if err != nil {
		t.Fatal(err)
	}
	return p
}

// tierCfg is a tier of n slots of 1 KiB with an LRU.
func tierCfg(t testing.TB, n int) TierConfig {
	return TierConfig{CapacityBytes: int64(n) << 10, SlotBytes: 1 << 10, Policy: newLRU(t, n)}
}

func mustNew(t testing.TB, cfg Config) *Manager {
	t.Helper()
	m, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	return m
}

// check runs the full invariant walk under the lock.
func (m *Manager) check(t testing.TB) {
	t.Helper()
	m.lock()
	defer m.unlock()
	m.checkInvariants()
}

// fakeMover holds submitted copies until the test completes them, in any
// order, with success or failure. It moves data between per-tier slot
// contents so that tests can check what a hit would read.
type fakeMover struct {
	mu      sync.Mutex
	pending []pendingOp
	// data[tier][slot] is the block key "stored" in a slot; copies carry it.
	data      [NumTiers]map[Slot]Key
	submitErr error
	inline    bool          // complete every op inside Submit
	notify    chan struct{} // signalled on Submit, when not nil
}

type pendingOp struct {
	t *Batch
	i int
}

func newFakeMover() *fakeMover {
	f := &fakeMover{}
	for i := range f.data {
		f.data[i] = map[Slot]Key{}
	}
	return f
}

func (f *fakeMover) Submit(t *Batch) error {
	f.mu.Lock()
	if f.submitErr != nil {
		f.mu.Unlock()
		return f.submitErr
	}
	start := len(f.pending)
	for i := range t.Ops {
		f.pending = append(f.pending, pendingOp{t, i})
	}
	inline := f.inline
	f.mu.Unlock()
	if f.notify != nil {
		select {
		case f.notify <- struct{}{}:
		default:
		}
	}
	if inline {
		for {
			f.mu.Lock()
			if len(f.pending) <= start {
				f.mu.Unlock()
				return nil
			}
			p := f.pending[len(f.pending)-1]
			f.pending = f.pending[:len(f.pending)-1]
			f.copy(p)
			f.mu.Unlock()
			p.t.Complete(p.i, nil)
		}
	}
	return nil
}

// copy moves the simulated contents; f.mu held.
func (f *fakeMover) copy(p pendingOp) {
	op := p.t.Ops[p.i]
	f.data[op.To][op.ToSlot] = f.data[op.From][op.FromSlot]
}

func (f *fakeMover) len() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return len(f.pending)
}

// completeOne completes a random pending op (fail: with an error) and
// reports whether there was one.
func (f *fakeMover) completeOne(rng *rand.Rand, fail bool) bool {
	f.mu.Lock()
	if len(f.pending) == 0 {
		f.mu.Unlock()
		return false
	}
	j := rng.IntN(len(f.pending))
	p := f.pending[j]
	f.pending[j] = f.pending[len(f.pending)-1]
	f.pending = f.pending[:len(f.pending)-1]
	var err error
	if fail {
		err = errMoveTest
	} else {
		f.copy(p)
	}
	f.mu.Unlock()
	p.t.Complete(p.i, err)
	return true
}

// drain completes everything pending, in order, including copies that
// completions start.
func (f *fakeMover) drain() {
	for {
		f.mu.Lock()
		if len(f.pending) == 0 {
			f.mu.Unlock()
			return
		}
		p := f.pending[0]
		f.pending = f.pending[1:]
		f.copy(p)
		f.mu.Unlock()
		p.t.Complete(p.i, nil)
	}
}

var errMoveTest = errors.New("injected copy failure")

// toks returns n blocks of bt tokens starting at value base.
func toks(n, bt int, base int32) []int32 {
	s := make([]int32, n*bt)
	for i := range s {
		s[i] = base + int32(i)
	}
	return s
}

// write stores what a prefill wrote into a slot.
func (f *fakeMover) write(t Tier, s Slot, content Key) {
	f.mu.Lock()
	f.data[t][s] = content
	f.mu.Unlock()
}

func (f *fakeMover) read(t Tier, s Slot) Key {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.data[t][s]
}

// readLock read-locks one stripe: enough to read the metadata in tests.
func (m *Manager) readLock()   { m.rlock(&m.stripes[0]) }
func (m *Manager) readUnlock() { m.runlock(&m.stripes[0]) }
