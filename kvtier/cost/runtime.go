package cost

import "fmt"

// maxRuntimeLen bounds PrefillSample.Runtime.
const maxRuntimeLen = 256

// SetRuntime names what computes the passes c learns from: a model
// runtime and its kernels as its caller identifies them (examples/server
// names its GPU attention kernel and the device's compute capability). A
// sample added without a Runtime is taken as this runtime's, one of
// another is refused, and those already held of another runtime, or of
// none (a file written before samples named theirs), are dropped: a pass's
// time is a fact about the code that ran it, and a faster kernel's passes
// fitted beside a slower one's leave the fit wrong for both. The fit they
// gave becomes the prior, as a file of terms alone is, with at least the
// presets' width: c starts from it and moves to its own runtime's
// samples as they come. It returns how many samples it dropped; an empty
// name keeps every sample and takes any.
func (c *Calibration) SetRuntime(name string) (dropped int, err error) {
	if len(name) > maxRuntimeLen {
		return 0, fieldErr("runtime", name, "must be at most %d bytes", maxRuntimeLen)
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	c.runtime = name
	if name == "" {
		return 0, nil
	}
	before := c.cur.Load().Prefill
	droppedLoaded := c.loaded.keep(func(e *prefillEntry) bool { return e.s.Runtime == name })
	dropped = c.prefill.keep(func(e *prefillEntry) bool { return e.s.Runtime == name }) + droppedLoaded
	if dropped == 0 {
		return 0, nil
	}
	if p := before; p.Samples > 0 {
		c.prior, c.priorWidth = c.thetaOf(p), max(p.ErrorWidth, PriorPrefillWidth)
	}
	if droppedLoaded > 0 && before.LoadSlowdownSamples > 0 {
		c.priorSlowdown = before.LoadSlowdown
	}
	c.publishLocked()
	return dropped, nil
}

// keep keeps, in order, the values ok says to, and returns how many it
// dropped.
func (r *ring[T]) keep(ok func(*T) bool) int {
	var kept []T
	dropped := 0
	r.each(func(v *T) {
		if ok(v) {
			kept = append(kept, *v)
		} else {
			dropped++
		}
	})
	r.next, r.n = 0, 0
	for _, v := range kept {
		r.add(v)
	}
	return dropped
}

// maxAttentionWave bounds SetAttentionWave: rows × heads of a wave.
const maxAttentionWave = 1 << 24

// SetAttentionWave says how many query rows × heads one wave of the
// runtime's attention kernel holds: its rows a CTA times the GPU's SMs
// (the server's wgmma kernel on the H200: 128 × 132). From then on a
// pass's prefix pairs count for its rows past wave/heads only, the sweep
// of the prefix that fewer rows still take being priced by the read term
// (PrefillCost.PrefixFullRows), and the samples are refitted so. 0 goes
// back to counting every row. The fit carries it (PrefillFit.AttentionWave)
// and so does the file WriteJSON writes.
func (c *Calibration) SetAttentionWave(wave int) error {
	if wave < 0 || wave > maxAttentionWave {
		return fieldErr("attention_wave", wave, "must be between 0 (unknown) and %d", maxAttentionWave)
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if wave == c.wave {
		return nil
	}
	c.wave = wave
	for _, r := range []*ring[prefillEntry]{&c.prefill, &c.loaded} {
		var err error
		r.each(func(e *prefillEntry) {
			m, merr := c.modelLocked(e.s.Model)
			if merr != nil {
				err = merr // registered when added: cannot happen
				return
			}
			e.row.x = c.prefillFeatures(&m, &e.s)
		})
		if err != nil {
			return fmt.Errorf("calibration: attention wave: %w", err)
		}
	}
	c.publishLocked()
	return nil
}
