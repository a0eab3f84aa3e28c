package transfer

import (
	"reflect"
	"slices"
	"strings"
	"testing"

	"kvtier.dev/cudastream"
)

func TestLayoutsAddressTheSameBlockDifferently(t *testing.T) {
	const layers, parts, blocks, part = 3, 2, 10, 1024
	lf, err := LayerFirstLayout(1<<20, layers, parts, blocks, part)
	if err != nil {
		t.Fatal(err)
	}
	bf, err := BlockFirstLayout(1<<20, layers, parts, blocks, part)
	if err != nil {
		t.Fatal(err)
	}
	// Layer-first: (layer 1, V) of block 4 is after 3 whole tensors.
	if got, want := lf.addr(4, 1, 1), uint64(1<<20+3*blocks*part+4*part); got != want {
		t.Errorf("layer-first addr = %#x, want %#x", got, want)
	}
	// Block-first: block 4 starts after 4 whole blocks, then layer 1 V.
	if got, want := bf.addr(4, 1, 1), uint64(1<<20+4*layers*parts*part+3*part); got != want {
		t.Errorf("block-first addr = %#x, want %#x", got, want)
	}
	k := []cudastream.DevicePtr{0x1000000, 0x2000000, 0x3000000}
	v := []cudastream.DevicePtr{0x1800000, 0x2800000, 0x3800000}
	pl, err := PerLayerLayout(k, v, blocks, part)
	if err != nil {
		t.Fatal(err)
	}
	if got, want := pl.addr(7, 2, 1), uint64(0x3800000+7*part); got != want {
		t.Errorf("per-layer addr = %#x, want %#x", got, want)
	}
	mla, err := PerLayerLayout(k, nil, blocks, part)
	if err != nil {
		t.Fatal(err)
	}
	if mla.Parts != 1 || mla.BlockBytes() != 3*part {
		t.Errorf("MLA layout: parts %d block bytes %d", mla.Parts, mla.BlockBytes())
	}
}

func TestLayoutRejectsBadShapes(t *testing.T) {
	for _, tc := range []struct {
		name  string
		build func() error
		want  string
	}{
		{"zero layers", func() error { _, err := LayerFirstLayout(4096, 0, 2, 1, 64); return err }, "Layers"},
		{"three parts", func() error { _, err := BlockFirstLayout(4096, 1, 3, 1, 64); return err }, "Parts"},
		{"zero part bytes", func() error { _, err := BlockFirstLayout(4096, 1, 2, 1, 0); return err }, "PartBytes"},
		{"zero blocks", func() error { _, err := LayerFirstLayout(4096, 1, 2, 0, 64); return err }, "NumBlocks"},
		{"K/V mismatch", func() error {
			_, err := PerLayerLayout([]cudastream.DevicePtr{1, 2}, []cudastream.DevicePtr{3}, 4, 64)
			return err
		}, "V tensors"},
		{"null base", func() error {
			_, err := PerLayerLayout([]cudastream.DevicePtr{4096, 0}, nil, 4, 64)
			return err
		}, "Base[1]"},
		{"overlapping stride", func() error {
			g := GPULayout{Layers: 1, Parts: 1, PartBytes: 64, NumBlocks: 2, BlockStride: 32, Base: []cudastream.DevicePtr{4096}}
			return g.Validate()
		}, "overlap"},
	} {
		err := tc.build()
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: err = %v, want one naming %q", tc.name, err, tc.want)
		}
	}
}

func TestCoalescing(t *testing.T) {
	const layers, parts, blocks, part = 2, 2, 8, 256
	host := HostLayout{Pool: make([]byte, 8*layers*parts*part), SlotBytes: layers * parts * part}
	base := uint64(1 << 30)
	t.Run("block-first, consecutive blocks and slots: one copy per block, merged across blocks", func(t *testing.T) {
		g, _ := BlockFirstLayout(1<<20, layers, parts, blocks, part)
		var c coalescer
		c.addBlocks(&g, &host, base, []Pair{{0, 0}, {1, 1}, {2, 2}}, true)
		if len(c.ops) != 1 || c.ops[0].Bytes != 3*host.SlotBytes {
			t.Fatalf("ops = %+v, want one copy of 3 slots", c.ops)
		}
	})
	t.Run("block-first, scattered blocks: one copy per block", func(t *testing.T) {
		g, _ := BlockFirstLayout(1<<20, layers, parts, blocks, part)
		var c coalescer
		c.addBlocks(&g, &host, base, []Pair{{5, 0}, {1, 1}, {7, 2}}, false)
		if len(c.ops) != 3 {
			t.Fatalf("got %d ops, want 3", len(c.ops))
		}
		for i, op := range c.ops {
			if op.Bytes != host.SlotBytes {
				t.Errorf("op %d moves %d bytes, want a whole slot %d", i, op.Bytes, host.SlotBytes)
			}
		}
		if c.ops[1].Src != uint64(g.addr(1, 0, 0)) || c.ops[1].Dst != base+uint64(host.SlotBytes) {
			t.Errorf("op 1 = %+v: wrong direction or address", c.ops[1])
		}
	})
	t.Run("block-first, consecutive blocks across a registration boundary", func(t *testing.T) {
		g, _ := BlockFirstLayout(1<<20, layers, parts, blocks, part)
		reg := host
		reg.RegistrationBytes = 2 * host.SlotBytes
		var c coalescer
		c.addBlocks(&g, &reg, base, []Pair{{0, 0}, {1, 1}, {2, 2}, {3, 3}, {4, 4}}, true)
		if len(c.ops) != 3 || c.ops[0].Bytes != 2*host.SlotBytes || c.ops[2].Bytes != host.SlotBytes {
			t.Fatalf("ops = %+v, want copies of 2, 2 and 1 slots split at every second slot", c.ops)
		}
	})
	t.Run("block-first, a pool that starts inside its registration", func(t *testing.T) {
		g, _ := BlockFirstLayout(1<<20, layers, parts, blocks, part)
		reg := host
		reg.RegistrationBytes, reg.RegistrationOffset = 3*host.SlotBytes, host.SlotBytes
		var c coalescer
		c.addBlocks(&g, &reg, base, []Pair{{0, 0}, {1, 1}, {2, 2}, {3, 3}, {4, 4}}, true)
		// Registrations begin at pool slots 2 and 5: copies of 2 and 3 slots.
		if len(c.ops) != 2 || c.ops[0].Bytes != 2*host.SlotBytes || c.ops[1].Bytes != 3*host.SlotBytes {
			t.Fatalf("ops = %+v, want copies of 2 and 3 slots split at slot 2", c.ops)
		}
	})
	t.Run("layer-first, per layer: K and V are separate tensors", func(t *testing.T) {
		g, _ := LayerFirstLayout(1<<20, layers, parts, blocks, part)
		var c coalescer
		c.addLayer(&g, &host, base, []Pair{{3, 0}, {4, 1}}, 1, true)
		// Blocks 3 and 4 are adjacent on the GPU within each tensor but the
		// host slots interleave K and V, so nothing merges.
		if len(c.ops) != 4 {
			t.Fatalf("got %d ops, want 4", len(c.ops))
		}
		if c.origin[2] != 1 {
			t.Errorf("origin of op 2 = %d, want pair 1", c.origin[2])
		}
	})
}

func TestCheckPairs(t *testing.T) {
	g, _ := BlockFirstLayout(1<<20, 1, 2, 4, 64)
	h := HostLayout{Pool: make([]byte, 2*128), SlotBytes: 128}
	if err := checkPairs(&g, &h, []Pair{{3, 1}}); err != nil {
		t.Fatal(err)
	}
	if err := checkPairs(&g, &h, []Pair{{0, 0}, {4, 0}}); err == nil || !strings.Contains(err.Error(), "pair 1: GPU block 4") {
		t.Errorf("GPU block out of range: %v", err)
	}
	if err := checkPairs(&g, &h, []Pair{{0, 2}}); err == nil || !strings.Contains(err.Error(), "host slot 2") {
		t.Errorf("host slot out of range: %v", err)
	}
	if err := checkPairs(&g, &h, []Pair{{-1, 0}}); err == nil {
		t.Error("negative block accepted")
	}
}

// TestCoalescerStreams: with emit set, descriptors leave in groups of at
// most limit, each group only once no later copy can merge into it, and a
// refusing emit drops everything after it.
func TestCoalescerStreams(t *testing.T) {
	var got [][]cudastream.Copy
	var emittedBefore []int
	c := coalescer{limit: 2}
	c.emit = func(ops []cudastream.Copy, origin []int32) bool {
		got = append(got, slices.Clone(ops))
		emittedBefore = append(emittedBefore, c.emitted)
		return true
	}
	c.add(0, 1000, 10, 0, false)   // A
	c.add(100, 1100, 10, 1, false) // B
	c.add(110, 1110, 10, 2, false) // merges into B although the group is full
	if len(got) != 0 {
		t.Fatalf("emitted %v before a copy failed to merge", got)
	}
	c.add(500, 1500, 10, 3, false) // C: A and B+ leave
	c.flush()
	want := [][]cudastream.Copy{
		{{Dst: 0, Src: 1000, Bytes: 10}, {Dst: 100, Src: 1100, Bytes: 20}},
		{{Dst: 500, Src: 1500, Bytes: 10}},
	}
	if !reflect.DeepEqual(got, want) || !slices.Equal(emittedBefore, []int{0, 2}) {
		t.Fatalf("emitted %v (after %v), want %v (after [0 2])", got, emittedBefore, want)
	}

	got = nil
	c.reset()
	c.emit = func(ops []cudastream.Copy, origin []int32) bool {
		got = append(got, slices.Clone(ops))
		return false
	}
	for i := range 5 {
		c.add(uint64(i*100), uint64(i*100), 10, i, false)
	}
	c.flush()
	if len(got) != 1 || len(got[0]) != 2 || !c.stopped || len(c.ops) != 0 {
		t.Fatalf("after a refusal: emitted %v, stopped %v, holding %d ops; want one group of 2, stopped, none held", got, c.stopped, len(c.ops))
	}
}
