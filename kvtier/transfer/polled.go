package transfer

// Poll completes, in stream order, the transfers of a polled engine
// (Config.Polled) whose copies the device has completed: it marks their
// layers and then them done and runs their OnDone functions, on the
// caller's goroutine and with no lock held, so that they may submit more
// transfers. It returns how many transfers it completed. It never blocks
// the host: it queries events. Onboards are completed before offloads. On
// the simulator's virtual clock, poll after moving the clock
// (Sim.AdvanceTo). Poll on an engine that is not polled completes nothing.
func (e *Engine) Poll() int {
	if !e.polled {
		return 0
	}
	n := 0
	for _, d := range [2]*direction{&e.on, &e.off} {
		for {
			d.mu.Lock()
			if d.qhead == len(d.queue) {
				d.queue, d.qhead = d.queue[:0], 0
				d.mu.Unlock()
				break
			}
			t := d.queue[d.qhead]
			done, err := t.poll()
			if !done {
				d.mu.Unlock()
				break
			}
			d.queue[d.qhead] = nil
			d.qhead++
			d.mu.Unlock()
			t.finish(err)
			n++
		}
	}
	return n
}

// poll is a polled engine's await: it marks done the layers whose events
// have completed, in order, and reports whether the whole transfer has
// (true with the device's error if a query failed). It never blocks.
func (t *Transfer) poll() (bool, error) {
	for t.layersClosed < len(t.layerEv) {
		ok, err := t.layerEv[t.layersClosed].Query()
		if err != nil {
			return true, err
		}
		if !ok {
			return false, nil
		}
		close(t.layerDone[t.layersClosed])
		t.layersClosed++
	}
	ok, err := t.final.Query()
	return ok || err != nil, err
}

// drainPolled completes, after Close has marked the engine closed, the
// transfers a polled engine still holds: it waits for each on the host, in
// stream order (on the virtual clock this moves the clock).
func (e *Engine) drainPolled(d *direction) {
	for {
		d.mu.Lock()
		if d.qhead == len(d.queue) {
			d.queue, d.qhead = nil, 0
			d.mu.Unlock()
			return
		}
		t := d.queue[d.qhead]
		d.queue[d.qhead] = nil
		d.qhead++
		d.mu.Unlock()
		t.await()
	}
}
