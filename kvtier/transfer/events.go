package transfer

import (
	"errors"
	"sync"

	"kvtier.dev/cudastream"
)

// eventPool recycles events between transfers.
type eventPool struct {
	dev  cudastream.Device
	mu   sync.Mutex
	free []cudastream.Event
}

func (p *eventPool) get() (cudastream.Event, error) {
	p.mu.Lock()
	if n := len(p.free); n > 0 {
		ev := p.free[n-1]
		p.free = p.free[:n-1]
		p.mu.Unlock()
		return ev, nil
	}
	p.mu.Unlock()
	return p.dev.NewEvent(cudastream.EventOptions{BlockingSync: true})
}

func (p *eventPool) put(ev cudastream.Event) {
	p.mu.Lock()
	p.free = append(p.free, ev)
	p.mu.Unlock()
}

func (p *eventPool) close() error {
	p.mu.Lock()
	defer p.mu.Unlock()
	var errs []error
	for _, ev := range p.free {
		errs = append(errs, ev.Destroy())
	}
	p.free = nil
	return errors.Join(errs...)
}
