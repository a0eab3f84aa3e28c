package main

import (
	"fmt"
	"time"
)

// caseMode is one case timed in one mode.
type caseMode struct {
	c int // index in cases
	m mode
}

// tally is what the timed rounds measured, per case and mode.
type tally struct {
	gibps       map[caseMode][]float64 // payload GiB/s, one per round
	cpuPerBlock map[caseMode][]float64 // CPU µs per block, one per round
	cpu         map[caseMode]time.Duration
	reqs        map[caseMode]diskDelta
}

// timeRounds times every case in every mode --rounds times, the order of
// the modes rotating by round.
func (b *bench) timeRounds() (*tally, error) {
	t := &tally{gibps: map[caseMode][]float64{}, cpuPerBlock: map[caseMode][]float64{},
		cpu: map[caseMode]time.Duration{}, reqs: map[caseMode]diskDelta{}}
	for r := range b.o.rounds {
		for c, cs := range cases {
			for i := range numModes {
				m := (mode(r) + i) % numModes
				if m == modeRawHdr && cs.write {
					continue // it would overwrite the tier's headers
				}
				if (m == modeRawCopy || m == modeTierGPU) && b.gpu == nil {
					continue
				}
				if err := b.timePass(t, caseMode{c, m}); err != nil {
					return nil, err
				}
			}
		}
	}
	return t, nil
}

// timePass times one pass of k's case in k's mode into t: its GiB/s, its
// CPU time and the device requests it took.
func (b *bench) timePass(t *tally, k caseMode) error {
	cs := cases[k.c]
	before, cpu0 := b.dev.read(), cpuTime()
	v, err := b.pass(cs.write, cs.random, k.m)
	used := cpuTime() - cpu0
	t.cpu[k] += used
	t.cpuPerBlock[k] = append(t.cpuPerBlock[k], float64(used.Nanoseconds())/1e3/float64(b.nslots))
	if err != nil {
		return fmt.Errorf("%s (%s): %w", cs.name, modeNames[k.m], err)
	}
	t.gibps[k] = append(t.gibps[k], v)
	t.reqs[k] = t.reqs[k].add(b.dev.read().sub(before, cs.write))
	return nil
}

// checkStores fails if a store dropped a corrupt slot, or if the
// word-summed one checked no payload on the GPU.
func (b *bench) checkStores() error {
	if st := b.s.Stats(); st.CorruptDrops != 0 {
		return fmt.Errorf("the tier dropped %d corrupt slots during the run", st.CorruptDrops)
	}
	if b.s2 != nil {
		if st := b.s2.Stats(); st.CorruptDrops != 0 || st.DeferredChecks == 0 {
			return fmt.Errorf("the GPU-summed tier dropped %d corrupt slots and deferred %d checks during the run", st.CorruptDrops, st.DeferredChecks)
		}
	}
	return nil
}
