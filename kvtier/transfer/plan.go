package transfer

import (
	"fmt"

	"kvtier.dev/cudastream"
)

// checkPairs rejects pairs that point outside the GPU layout or the host
// pool, before any copy is issued, so that bad input changes nothing.
func checkPairs(g *GPULayout, h *HostLayout, pairs []Pair) error {
	slots := h.Slots()
	for i, p := range pairs {
		if p.GPUBlock < 0 || int(p.GPUBlock) >= g.NumBlocks {
			return fmt.Errorf("transfer: pair %d: GPU block %d outside the layout's %d blocks", i, p.GPUBlock, g.NumBlocks)
		}
		if p.HostSlot < 0 || int(p.HostSlot) >= slots {
			return fmt.Errorf("transfer: pair %d: host slot %d outside the pool's %d slots", i, p.HostSlot, slots)
		}
	}
	return nil
}

// coalescer appends copy descriptors to a reusable slice, merging each new
// copy into the previous one when both sides are contiguous with it.
//
// With emit set it streams: once limit descriptors are final (a new copy
// does not merge into the last one), emit takes them and the slice starts
// over, so the first copies are on their way while later pairs are still
// being planned. flush hands over the rest.
type coalescer struct {
	ops []cudastream.Copy
	// origin[i] is the index of the pair that opened descriptor i, so that a
	// failure can be named in the caller's terms.
	origin []int32

	limit   int
	emit    func(ops []cudastream.Copy, origin []int32) bool // false: stop, drop later copies
	emitted int                                              // descriptors handed to emit since reset
	stopped bool
}

func (c *coalescer) reset() {
	c.ops = c.ops[:0]
	c.origin = c.origin[:0]
	c.emitted = 0
	c.stopped = false
}

// split forbids merging with the previous copy: the new piece starts a new
// host registration, and the driver refuses a copy that spans two.
func (c *coalescer) add(dst, src uint64, n int64, pair int, split bool) {
	if c.stopped {
		return
	}
	if k := len(c.ops) - 1; k >= 0 && !split {
		last := &c.ops[k]
		if last.Dst+uint64(last.Bytes) == dst && last.Src+uint64(last.Bytes) == src {
			last.Bytes += n
			return
		}
	}
	if c.emit != nil && len(c.ops) >= c.limit {
		if c.flush(); c.stopped {
			return
		}
	}
	c.ops = append(c.ops, cudastream.Copy{Dst: dst, Src: src, Bytes: n})
	c.origin = append(c.origin, int32(pair))
}

// flush hands the descriptors gathered so far to emit.
func (c *coalescer) flush() {
	if c.emit == nil || c.stopped || len(c.ops) == 0 {
		return
	}
	if !c.emit(c.ops, c.origin) {
		c.stopped = true
	}
	c.emitted += len(c.ops)
	c.ops = c.ops[:0]
	c.origin = c.origin[:0]
}

// addLayer appends the copies of one layer of every pair. toDevice selects
// the direction: host slot to GPU block, or back.
func (c *coalescer) addLayer(g *GPULayout, h *HostLayout, hostBase uint64, pairs []Pair, layer int, toDevice bool) {
	for i, p := range pairs {
		split := h.startsRegistration(p.HostSlot)
		for part := 0; part < g.Parts; part++ {
			c.addPart(g, h, hostBase, p, i, layer, part, toDevice, split)
			split = false
		}
	}
}

// addBlocks appends the copies of whole blocks, layer after layer within each
// block, so that a block-first GPU layout moves each block as one copy.
func (c *coalescer) addBlocks(g *GPULayout, h *HostLayout, hostBase uint64, pairs []Pair, toDevice bool) {
	for i, p := range pairs {
		split := h.startsRegistration(p.HostSlot)
		for layer := 0; layer < g.Layers; layer++ {
			for part := 0; part < g.Parts; part++ {
				c.addPart(g, h, hostBase, p, i, layer, part, toDevice, split)
				split = false
			}
		}
	}
}

// addPart appends the copy of one (layer, part) of pair p, the i-th.
func (c *coalescer) addPart(g *GPULayout, h *HostLayout, hostBase uint64, p Pair, i, layer, part int, toDevice, split bool) {
	dev := g.addr(p.GPUBlock, layer, part)
	host := hostBase + uint64(int64(p.HostSlot)*h.SlotBytes) + uint64(int64(layer*g.Parts+part)*g.PartBytes)
	if toDevice {
		c.add(dev, host, g.PartBytes, i, split)
	} else {
		c.add(host, dev, g.PartBytes, i, split)
	}
}
