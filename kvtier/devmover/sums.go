package devmover

import (
	"kvtier.dev/kvtier"
	"kvtier.dev/kvtier/transfer"
)

// hostSum is a host slot's word sum and the block it is of. The manager
// may hand a slot to writers the mover does not see (an Insert into the
// host tier, RemoteTier.Fetch), so a sum counts only for the block an op
// names: a slot rewritten with another block is hashed by the store. The
// same block written into the slot by someone else is assumed to hold the
// same bytes; if it does not, its NVMe copy fails its check on the GPU at
// its first load and is recomputed, never served.
type hostSum struct {
	block blockID
	sum   uint64
	ok    bool
}

// blockID names a block for its host sum.
type blockID struct {
	key  kvtier.Key
	salt kvtier.Salt
}

// forgetHostSum drops host slot s's sum: new bytes are coming.
func (d *Mover) forgetHostSum(s kvtier.Slot) {
	if !d.sums {
		return
	}
	d.sumMu.Lock()
	d.hostSums[s] = hostSum{}
	d.sumMu.Unlock()
}

// hostSumOf returns host slot s's word sum, if it has one for op's block.
func (d *Mover) hostSumOf(s kvtier.Slot, op *kvtier.MoveOp) (uint64, bool) {
	if !d.sums {
		return 0, false
	}
	d.sumMu.Lock()
	defer d.sumMu.Unlock()
	h := d.hostSums[s]
	return h.sum, h.ok && h.block == blockID{op.Key, op.Salt}
}

// setHostSum records host slot s's word sum for block b.
func (d *Mover) setHostSum(s int32, b blockID, sum uint64) {
	d.sumMu.Lock()
	d.hostSums[s] = hostSum{block: b, sum: sum, ok: true}
	d.sumMu.Unlock()
}

// keepHostSums is an offload's per-block step (finishEngine's each): the
// sums of the GPU blocks it copied become their host slots', for blocks
// (one per pair). nil without sums.
func (d *Mover) keepHostSums(pairs []transfer.Pair, blocks []blockID) func(int, *transfer.Transfer) error {
	if !d.sums {
		return nil
	}
	return func(k int, tr *transfer.Transfer) error {
		if sums := tr.Sums(); k < len(sums) {
			d.setHostSum(pairs[k].HostSlot, blocks[k], sums[k])
		}
		return nil
	}
}
