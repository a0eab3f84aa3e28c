package devmover

import (
	"context"
	"fmt"

	"kvtier.dev/cudastream"
	"kvtier.dev/kvtier"
	"kvtier.dev/kvtier/nvme"
	"kvtier.dev/kvtier/transfer"
)

// job is the ops of one Submit, sorted by path, each path a list of its own
// ops. What a path needs of an op is copied out of the Batch, which the
// manager recycles after its last Complete.
type job struct {
	b      *kvtier.Batch
	afters []cudastream.Event // the producer events of its ops out of the GPU

	offload engineOps // GPU to host
	onboard engineOps // host to GPU
	writes  []write   // host to NVMe
	reads   []read    // NVMe to host
	staged  []staged  // NVMe to GPU
	bounce  []bounced // GPU to NVMe
	failed  []failure // ops that could not start
}

// engineOps are the ops of one engine transfer, as pairs of slots.
type engineOps struct {
	pairs  []transfer.Pair
	idx    []int     // each pair's op in the batch
	blocks []blockID // with sums, offloads only: each pair's block
}

func (e *engineOps) add(i int, p transfer.Pair) {
	e.pairs = append(e.pairs, p)
	e.idx = append(e.idx, i)
}

// write is a host slot written to the manager's NVMe slot to, in its
// ticket's turn on the drive.
type write struct {
	i      int
	to     kvtier.Slot
	op     nvme.WriteOp
	ticket uint64
}

// read is an NVMe slot read into host slot to, which must name want.
type read struct {
	i     int
	to    kvtier.Slot
	want  wantMeta
	block blockID
	op    nvme.ReadOp
}

// staged is an NVMe block loaded into GPU block gpu through the staging
// ring.
type staged struct {
	i    int
	gpu  int32
	from kvtier.Slot // the manager's NVMe slot
	key  kvtier.Key
	want wantMeta
}

// bounced is a GPU block written to the manager's NVMe slot to through a
// bounce slot.
type bounced struct {
	i    int
	gpu  int32
	meta nvme.BlockMeta
	to   kvtier.Slot
}

type failure struct {
	i   int
	err error
}

func (j *job) fail(i int, err error) { j.failed = append(j.failed, failure{i, err}) }

// addAfter adds a producer event to the job's (once each), and reports
// false for one that is not a device event.
func (j *job) addAfter(e kvtier.Event) bool {
	ev, ok := e.(cudastream.Event)
	if !ok {
		return false
	}
	for _, have := range j.afters {
		if have == ev {
			return true
		}
	}
	j.afters = append(j.afters, ev)
	return true
}

// Submit implements kvtier.Mover. It never returns an error: an op it cannot
// start is completed with the error at once.
func (d *Mover) Submit(b *kvtier.Batch) error {
	j := &job{b: b}
	for i := range b.Ops {
		d.route(j, i, &b.Ops[i])
	}
	d.start(j)
	return nil
}

// route puts op i on its path's list in j, or among the failed.
func (d *Mover) route(j *job, i int, op *kvtier.MoveOp) {
	const gpu, host, nvm = kvtier.GPU, kvtier.Host, kvtier.NVMe
	if op.After != nil && !j.addAfter(op.After) {
		j.fail(i, fmt.Errorf("%w: MoveOp.After is a %T, not a cudastream.Event", kvtier.ErrBadInput, op.After))
		return
	}
	switch {
	case (op.From == host && int(op.FromSlot) >= d.host.Slots()) || (op.To == host && int(op.ToSlot) >= d.host.Slots()):
		j.fail(i, fmt.Errorf("%w: host slot out of the pool's %d (devmover.Config.Host)", kvtier.ErrBadInput, d.host.Slots()))
	case op.From == gpu && op.To == host:
		d.forgetHostSum(op.ToSlot)
		j.offload.add(i, transfer.Pair{GPUBlock: int32(op.FromSlot), HostSlot: int32(op.ToSlot)})
		if d.sums {
			j.offload.blocks = append(j.offload.blocks, blockID{op.Key, op.Salt})
		}
	case op.From == host && op.To == gpu:
		j.onboard.add(i, transfer.Pair{GPUBlock: int32(op.ToSlot), HostSlot: int32(op.FromSlot)})
	case d.store == nil && (op.From == nvm || op.To == nvm):
		j.fail(i, fmt.Errorf("%w: %v to %v: the mover has no NVMe store", ErrNoPath, op.From, op.To))
	case int(op.FromSlot) >= len(d.nvmeSlot) && op.From == nvm, int(op.ToSlot) >= len(d.nvmeSlot) && op.To == nvm:
		j.fail(i, fmt.Errorf("%w: nvme slot out of the mover's %d (devmover.Config.NVMeSlots)", kvtier.ErrBadInput, len(d.nvmeSlot)))
	case op.From == host && op.To == nvm:
		w := nvme.WriteOp{Slot: d.nvmeSlot[op.ToSlot], Meta: blockMeta(op, d.tokens), Payload: d.host.Slot(int32(op.FromSlot))[:d.blockBytes]}
		w.Meta.Codec = uint8(d.nvmeCodec)
		w.WordSum, w.WordSummed = d.hostSumOf(op.FromSlot, op)
		j.writes = append(j.writes, write{i: i, to: op.ToSlot, op: w})
	case op.From == nvm && op.To == host:
		d.forgetHostSum(op.ToSlot)
		meta := blockMeta(op, d.tokens)
		r := read{i: i, to: op.ToSlot, want: wantOf(meta), block: blockID{op.Key, op.Salt}}
		r.op = nvme.ReadOp{Slot: d.nvmeSlot[op.FromSlot], Dst: d.host.Slot(int32(op.ToSlot)), Meta: nvme.BlockMeta{Tokens: make([]uint32, 0, len(meta.Tokens))},
			WantCodec: uint8(d.nvmeCodec)}
		j.reads = append(j.reads, r)
	case op.From == nvm && op.To == gpu:
		j.staged = append(j.staged, staged{i: i, gpu: int32(op.ToSlot), from: op.FromSlot, key: op.Key, want: wantOf(blockMeta(op, d.tokens))})
	case op.From == gpu && op.To == nvm && d.bounce != nil:
		j.bounce = append(j.bounce, bounced{i: i, gpu: int32(op.FromSlot), meta: blockMeta(op, d.tokens), to: op.ToSlot})
	default:
		j.fail(i, fmt.Errorf("%w: %v to %v (GPU to NVMe needs devmover.Config.Bounce)", ErrNoPath, op.From, op.To))
	}
}

// start starts every path of j, then fails the ops that could not start.
// Everything starts before anything completes: a Complete may be the
// batch's last and recycle it. An engine call that fails fails its ops with
// the others that could not start, at the end.
func (d *Mover) start(j *job) {
	started := func(ops *engineOps, tr *transfer.Transfer, err error, what string, src *storeSource, each func(int, *transfer.Transfer) error) {
		if err == nil {
			d.finishEngine(j.b, ops.idx, tr, what, src, each)
			return
		}
		err = fmt.Errorf("%s of %d blocks: %w", what, len(ops.idx), err)
		for _, i := range ops.idx {
			j.fail(i, err)
		}
	}
	if n := len(j.offload.pairs); n > 0 {
		d.stats.offloads.Add(uint64(n))
		tr, err := d.eng.Offload(context.Background(), j.offload.pairs, j.afters...)
		started(&j.offload, tr, err, "offload", nil, d.keepHostSums(j.offload.pairs, j.offload.blocks))
	}
	if n := len(j.onboard.pairs); n > 0 {
		d.stats.onboards.Add(uint64(n))
		tr, err := d.eng.Onboard(context.Background(), j.onboard.pairs)
		started(&j.onboard, tr, err, "onboard", nil, nil)
	}
	if n := len(j.staged); n > 0 {
		d.stats.staged.Add(uint64(n))
		src := &storeSource{d: d, blocks: j.staged, lost: -1}
		gpus := make([]int32, n)
		ops := engineOps{idx: make([]int, n)}
		for k, s := range j.staged {
			gpus[k], ops.idx[k] = s.gpu, s.i
		}
		if d.sums {
			src.checks = make([]nvme.PayloadCheck, n)
		}
		tr, err := d.eng.OnboardStaged(context.Background(), src, gpus)
		started(&ops, tr, err, "staged onboard from nvme", src, src.checkSum)
	}
	if n := len(j.writes); n > 0 {
		for k := range j.writes {
			j.writes[k].ticket = d.drive.ticket()
		}
		d.stats.nvmeWrites.Add(uint64(n))
		d.wg.Add(1)
		go d.runWrites(j)
	}
	if n := len(j.reads); n > 0 {
		d.stats.nvmeReads.Add(uint64(n))
		d.wg.Add(1)
		go d.runReads(j)
	}
	if n := len(j.bounce); n > 0 {
		d.stats.bounce.Add(uint64(n))
		d.wg.Add(1)
		go d.runBounce(j)
	}
	for _, f := range j.failed {
		d.stats.failed(1, f.err)
		j.b.Complete(f.i, f.err)
	}
}
