package cost

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
