package nvme

import (
	"context"

	"kvtier.dev/kvtier/nvme/internal/sysio"
)

// worker owns the aligned scratch memory one I/O needs besides the caller's
// buffers: the headers of a run of slots, a bounce buffer for a payload's
// unaligned tail, and zeroes for the durable mode's invalidated headers.
type worker struct {
	mem     []byte // the mapping that holds hdr, tail and zero
	hdr     []byte // maxRunSlots headers
	tail    []byte // one alignment unit
	zero    []byte // one header of zeroes
	bufs    [][]byte
	h       header
	payload []byte // one slot, for VerifyPayloadOnOpen; mapped on first use
}

// pool holds the workers' contexts. An I/O runs on the goroutine that asks
// for it, after it took a worker: the number of workers bounds the system
// calls in flight (each blocks an OS thread), and the caller pays no hand-off
// to another goroutine and back. A read holds its worker for the system call
// and the header check only: hashing the payload, the one CPU-heavy step,
// runs after the worker went back. (A write still hashes while it holds its
// worker: the header it encodes in the worker's memory carries the sum.)
type pool struct {
	idle    chan *worker
	workers []*worker
}

func newPool(n int, g *geometry, maxTokens int) (*pool, error) {
	p := &pool{idle: make(chan *worker, n)}
	for range n {
		hdr := maxRunSlots * g.hdrBytes
		mem, err := sysio.AllocAligned(hdr + g.alignBytes + g.hdrBytes)
		if err != nil {
			p.stop()
			return nil, err
		}
		w := &worker{mem: mem, hdr: mem[:hdr], tail: mem[hdr : hdr+g.alignBytes],
			zero: mem[hdr+g.alignBytes:], bufs: make([][]byte, 0, 2*maxRunSlots+1),
			h: header{tokens: make([]uint32, 0, maxTokens)}}
		p.workers = append(p.workers, w)
		p.idle <- w
	}
	return p, nil
}

// acquire takes an idle worker, waiting while all are busy. It fails only
// when ctx is done first. The caller MUST release the worker.
func (p *pool) acquire(ctx context.Context) (*worker, error) {
	select {
	case w := <-p.idle:
		return w, nil
	default:
	}
	select {
	case w := <-p.idle:
		return w, nil
	case <-ctx.Done():
		return nil, ctx.Err()
	}
}

// acquireNow takes an idle worker, waiting as long as it takes: for the
// rare paths that must finish (invalidating a corrupt slot). The caller
// MUST release it.
func (p *pool) acquireNow() *worker { return <-p.idle }

func (p *pool) release(w *worker) { p.idle <- w }

// stop waits until every worker is idle and unmaps their memory. No acquire
// may follow.
func (p *pool) stop() {
	for range p.workers {
		<-p.idle
	}
	for _, w := range p.workers {
		_ = sysio.FreeAligned(w.mem)
		if w.payload != nil {
			_ = sysio.FreeAligned(w.payload)
		}
	}
}
