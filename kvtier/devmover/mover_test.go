package devmover

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"kvtier.dev/cudastream"
	"kvtier.dev/internal/checksum"
	"kvtier.dev/internal/gputest"
	"kvtier.dev/kvtier"
	"kvtier.dev/kvtier/nvme"
	"kvtier.dev/kvtier/policy"
	"kvtier.dev/kvtier/transfer"
)

// The device fixture: a simulated GPU with a block-first KV region, a
// page-aligned host pool registered with it, an NVMe store in a temporary
// directory, the two engines, the Mover and a Manager over them.
const (
	dmLayers     = 2
	dmParts      = 2
	dmPartBytes  = 1024
	dmBlockBytes = dmLayers * dmParts * dmPartBytes // 4 KiB: O_DIRECT-sized
	dmTokens     = 4                                // tokens per block
	dmStaging    = 2                                // staging buffers of 2 slots
	dmBounce     = 3                                // bounce slots
)

type devFixture struct {
	dev    cudastream.Device
	st     cudastream.Stream // the test's own stream, to write and read KV
	base   cudastream.DevicePtr
	host   transfer.HostLayout
	store  *nvme.Store
	mover  *Mover
	m      *kvtier.Manager
	want   map[kvtier.Key][]byte // each block's KV
	rng    *rand.Rand
	tokens int32 // next token id, so that requests never share blocks
}

type devOpts struct {
	gpu, host, nvme int // slots; nvme 0: no NVMe tier
	simCfg          cudastream.SimConfig
	early           bool
	writeThrough    bool
	// nvmeDir holds the store (default: a new temporary directory); keep
	// sets Config.KeepBlocks.
	nvmeDir string
	keep    bool
	// wrap wraps the store's slab files (nvme.Config.WrapFile).
	wrap func(path string, f nvme.File) nvme.File
	// real runs on GPU 0 instead of the sim: the test skips without a
	// driver, and fails then if KVTIER_REQUIRE_GPU=1.
	real bool
	// sums makes both engines sum their transfers on the device
	// (transfer.Config.Sums): NVMe payloads are then checksummed there.
	sums bool
}

func openDevice(t *testing.T, o devOpts) cudastream.Device {
	t.Helper()
	if o.real {
		return gputest.Device(t)
	}
	if o.simCfg.MemoryBytes == 0 {
		o.simCfg.MemoryBytes = 16 << 20
	}
	sim, err := cudastream.NewSim(o.simCfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { sim.Close() })
	return sim
}

// pinnedBytes maps page-aligned memory, as kvtier/pinned would hand out,
// and registers it with the device.
func pinnedBytes(t *testing.T, dev cudastream.Device, n int) []byte {
	t.Helper()
	return gputest.HostRegistered(t, dev, int64(n))
}

func newDevFixture(t *testing.T, o devOpts) *devFixture {
	t.Helper()
	f, cfg := newDevShard(t, o)
	f.m = mustNew(t, cfg)
	return f
}

// newDevShard builds the fixture's device, memory, engines, store and
// mover, and returns them with the manager's Config (Mover set), so that a
// tensor-parallel test can build one per GPU and one manager over them.
func newDevShard(t *testing.T, o devOpts) (*devFixture, kvtier.Config) {
	t.Helper()
	dev := openDevice(t, o)
	var err error
	f := &devFixture{dev: dev, want: map[kvtier.Key][]byte{}, rng: rand.New(rand.NewPCG(uint64(o.gpu), uint64(o.host)))}
	if f.st, err = dev.NewStream(0); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { f.st.Destroy() })
	if f.base, err = dev.Alloc(int64(o.gpu) * dmBlockBytes); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { dev.Free(f.base) })
	gpu, err := transfer.BlockFirstLayout(f.base, dmLayers, dmParts, o.gpu, dmPartBytes)
	if err != nil {
		t.Fatal(err)
	}
	mem := pinnedBytes(t, dev, (o.host+2*dmStaging+dmBounce)*dmBlockBytes)
	f.host = transfer.HostLayout{Pool: mem[:o.host*dmBlockBytes], SlotBytes: dmBlockBytes}
	rest := mem[o.host*dmBlockBytes:]
	staging := [][]byte{rest[:dmStaging*dmBlockBytes], rest[dmStaging*dmBlockBytes : 2*dmStaging*dmBlockBytes]}
	bounceHost := transfer.HostLayout{Pool: rest[2*dmStaging*dmBlockBytes:], SlotBytes: dmBlockBytes}
	var now func() time.Duration // wall time on a GPU
	if sim, ok := dev.(*cudastream.Sim); ok {
		now = sim.Clock().Now
	}
	eng, err := transfer.New(dev, transfer.Config{GPU: gpu, Host: f.host, Staging: staging, Now: now, Sums: o.sums})
	if err != nil {
		t.Fatal(err)
	}
	bounce, err := transfer.New(dev, transfer.Config{GPU: gpu, Host: bounceHost, Now: now, Sums: o.sums})
	if err != nil {
		t.Fatal(err)
	}
	mc := Config{Engine: eng, Host: f.host, BlockBytes: dmBlockBytes, Bounce: bounce, BounceHost: bounceHost, StoreTokens: true}
	cfg := kvtier.Config{BlockTokens: dmTokens, WriteThrough: o.writeThrough}
	tier := func(n int) kvtier.TierConfig {
		p, err := policy.NewDenseLRU[kvtier.BlockRef](n)
		if err != nil {
			t.Fatal(err)
		}
		return kvtier.TierConfig{CapacityBytes: int64(n) * dmBlockBytes, SlotBytes: dmBlockBytes, Policy: p}
	}
	cfg.Tiers[kvtier.GPU], cfg.Tiers[kvtier.Host] = tier(o.gpu), tier(o.host)
	if o.nvme > 0 {
		dir := o.nvmeDir
		if dir == "" {
			dir = t.TempDir()
		}
		f.store, err = nvme.Open(nvme.Config{Dirs: []string{dir}, SlotsPerFile: o.nvme, BlockBytes: dmBlockBytes, MaxTokens: dmTokens, WrapFile: o.wrap})
		if err != nil {
			t.Fatal(err)
		}
		mc.Store, mc.NVMeSlots, mc.KeepBlocks = f.store, o.nvme, o.keep
		cfg.Tiers[kvtier.NVMe] = tier(o.nvme)
	}
	if f.mover, err = New(mc); err != nil {
		t.Fatal(err)
	}
	f.mover.testEarly = o.early
	cfg.Mover = f.mover
	t.Cleanup(func() {
		f.mover.Close()
		if err := eng.Close(); err != nil {
			t.Error(err)
		}
		if err := bounce.Close(); err != nil {
			t.Error(err)
		}
		if f.store != nil {
			if err := f.store.Close(); err != nil {
				t.Error(err)
			}
		}
	})
	return f, cfg
}

// request returns the tokens of a new request of n blocks.
func (f *devFixture) request(n int) []int32 {
	tok := make([]int32, n*dmTokens)
	for i := range tok {
		tok[i] = f.tokens
		f.tokens++
	}
	return tok
}

func (f *devFixture) gpuAddr(s kvtier.Slot) cudastream.DevicePtr {
	return f.base + cudastream.DevicePtr(int64(s)*dmBlockBytes)
}

// writeGPU writes block k's KV (random, remembered) into GPU slot s, as a
// prefill kernel would, and waits for it.
func (f *devFixture) writeGPU(t *testing.T, k kvtier.Key, s kvtier.Slot) {
	t.Helper()
	kv := make([]byte, dmBlockBytes)
	for i := range kv {
		kv[i] = byte(f.rng.Uint32())
	}
	f.want[k] = kv
	if err := f.st.CopyHtoD(f.gpuAddr(s), kv); err != nil {
		t.Fatal(err)
	}
	if err := f.st.Synchronize(); err != nil {
		t.Fatal(err)
	}
}

func (f *devFixture) readGPU(t *testing.T, s kvtier.Slot) []byte {
	t.Helper()
	b := make([]byte, dmBlockBytes)
	if err := f.st.CopyDtoH(b, f.gpuAddr(s)); err != nil {
		t.Fatal(err)
	}
	if err := f.st.Synchronize(); err != nil {
		t.Fatal(err)
	}
	return b
}

// prefill inserts a request into the GPU, writes its new blocks' KV and
// commits them. The caller releases w.
func (f *devFixture) prefill(t *testing.T, tokens []int32, w *kvtier.Lease) {
	t.Helper()
	prefillOn(t, f.m, tokens, w, func(b kvtier.Block) { f.writeGPU(t, b.Key, b.Slot) })
}

// prefillOn inserts tokens into m's GPU tier, calls write for each block
// the lease must write (as a prefill would) and commits. When the GPU is
// full of blocks being demoted (write-back), it waits for the copies and
// tries again. The caller releases w.
func prefillOn(t *testing.T, m *kvtier.Manager, tokens []int32, w *kvtier.Lease, write func(kvtier.Block)) {
	t.Helper()
	for {
		err := m.Insert(1, tokens, kvtier.GPU, w)
		if err == nil {
			break
		}
		if !errors.Is(err, kvtier.ErrNoSpace) {
			t.Fatal(err)
		}
		m.Release(w)
		if err := m.Drain(context.Background()); err != nil {
			t.Fatal(err)
		}
	}
	for _, b := range w.Blocks {
		if b.Write {
			write(b)
		}
	}
	if err := m.Commit(w, nil); err != nil {
		t.Fatal(err)
	}
}

// planOnboard plans and onboards l, and returns how many of its blocks are
// loading, counting them by the tier they come from in byTier.
func planOnboard(t *testing.T, m *kvtier.Manager, l *kvtier.Lease, byTier *[kvtier.NumTiers]int) int {
	t.Helper()
	if err := m.Plan(l); err != nil {
		t.Fatal(err)
	}
	if err := m.Onboard(l); err != nil {
		t.Fatal(err)
	}
	loading := 0
	for _, b := range l.Blocks {
		if b.Loading {
			loading++
			byTier[b.Tier]++
		}
	}
	return loading
}

// gpuSlot is the GPU slot that holds block b's KV once Onboard's loads are
// done; false when b is to be recomputed.
func gpuSlot(b kvtier.Block) (kvtier.Slot, bool) {
	switch {
	case b.Loading:
		return b.GPUSlot, true
	case b.Tier == kvtier.GPU:
		return b.Slot, true
	}
	return 0, false
}

// eachReady calls fn for every copy of a block that is ready in a tier.
func eachReady(m *kvtier.Manager, fn func(k kvtier.Key, tier kvtier.Tier, s kvtier.Slot)) {
	m.Range(func(b kvtier.BlockInfo) bool {
		for tier := range kvtier.NumTiers {
			if b.Ready[tier] {
				fn(b.Key, tier, b.Slot[tier])
			}
		}
		return true
	})
}

// checkAll compares every ready copy in every tier with the block's KV. It
// returns the mismatches it found (so that a test can also expect some).
func (f *devFixture) checkAll(t *testing.T) []string {
	t.Helper()
	var bad []string
	page, err := unix.Mmap(-1, 0, dmBlockBytes, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_ANON|unix.MAP_PRIVATE)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Munmap(page)
	eachReady(f.m, func(k kvtier.Key, tier kvtier.Tier, s kvtier.Slot) {
		var got []byte
		switch tier {
		case kvtier.GPU:
			got = f.readGPU(t, s)
		case kvtier.Host:
			got = f.host.Slot(int32(s))
		case kvtier.NVMe:
			meta, err := f.store.Read(context.Background(), f.mover.nvmeSlot[s], page)
			if err != nil || meta.Key != uint64(k) {
				bad = append(bad, fmt.Sprintf("block %#x nvme slot %d: read %v, key %#x", uint64(k), s, err, meta.Key))
				return
			}
			got = page
		}
		want, ok := f.want[k]
		if !ok {
			want = detKV(k)
		}
		if !bytes.Equal(got, want) {
			bad = append(bad, fmt.Sprintf("block %#x in %v slot %d holds other bytes", uint64(k), tier, s))
		}
	})
	return bad
}

// TestDeviceMoverRoundTrip moves random KV through every path the mover has
// (GPU to host, host to NVMe, GPU to NVMe by bounce, NVMe to host, NVMe to
// GPU staged, host to GPU) under eviction pressure, through the Manager's
// API only, and compares every ready copy and every onboarded block byte for
// byte.
func TestDeviceMoverRoundTrip(t *testing.T) { testDeviceMoverRoundTrip(t, false) }

func testDeviceMoverRoundTrip(t *testing.T, real bool) {
	for _, wt := range []bool{false, true} {
		for _, sums := range []bool{false, true} {
			t.Run(fmt.Sprintf("writeThrough=%v/sums=%v", wt, sums), func(t *testing.T) { roundTrip(t, real, wt, sums) })
		}
	}
}

// roundTrip moves blocks along every path and checks every byte served.
// With sums, the NVMe payloads are checksummed on the device: the store
// hashes none it writes from an offload, and leaves the check of the
// blocks it loads into the GPU to the device.
func roundTrip(t *testing.T, real, writeThrough, sums bool) {
	f := newDevFixture(t, devOpts{gpu: 8, host: 6, nvme: 64, writeThrough: writeThrough, sums: sums,
		simCfg: cudastream.SimConfig{Link: cudastream.H200Link(), Clock: cudastream.SimVirtualClock}, real: real})
	ctx := context.Background()
	var reqs [][]int32
	for i := range 10 {
		tokens := f.request(3)
		reqs = append(reqs, tokens)
		var w kvtier.Lease
		f.prefill(t, tokens, &w)
		if err := f.m.Offload(&w, kvtier.Host); err != nil {
			t.Fatal(err)
		}
		if err := f.m.Wait(ctx, &w); err != nil {
			t.Fatal(err)
		}
		if i%2 == 0 { // the others reach NVMe when the host evicts them
			if err := f.m.Offload(&w, kvtier.NVMe); err != nil {
				t.Fatal(err)
			}
			if err := f.m.Wait(ctx, &w); err != nil {
				t.Fatal(err)
			}
		}
		f.m.Release(&w)
		if bad := f.checkAll(t); len(bad) > 0 {
			t.Fatalf("after request %d: %v", i, bad)
		}
	}
	served, layered := [kvtier.NumTiers]int{}, [kvtier.NumTiers]int{}
	for round, i := range f.rng.Perm(len(reqs)) {
		var l kvtier.Lease
		if err := f.m.Lookup(1, reqs[i], &l); err != nil {
			t.Fatal(err)
		}
		if round%2 == 0 { // bring NVMe-only blocks back to the host first
			f.promote(t, &l)
			f.m.Release(&l)
			if err := f.m.Lookup(1, reqs[i], &l); err != nil {
				t.Fatal(err)
			}
		}
		for _, b := range l.Blocks {
			served[b.Tier]++
		}
		// Per-layer readiness, from the host and from NVMe alike: once
		// every layer's events have completed, the loads are on the GPU,
		// before Wait has seen the copies complete.
		loading := planOnboard(t, f.m, &l, &layered)
		// The test's stream waits for every layer on the device (readGPU
		// reads on it): the bytes checked below are there by then.
		var evs []kvtier.Event
		for layer := range dmLayers {
			n := len(evs)
			var err error
			evs, err = l.LayerEvents(layer, evs)
			if err != nil || (loading > 0) != (len(evs) > n) {
				t.Fatalf("%d blocks loading, layer %d: %d events (%v)", loading, layer, len(evs)-n, err)
			}
			for _, ev := range evs[n:] {
				if err := f.st.WaitEvent(ev.(cudastream.Event)); err != nil {
					t.Fatal(err)
				}
			}
		}
		for j, b := range l.Blocks {
			s, ok := gpuSlot(b)
			if !ok {
				continue // no GPU slot free now: recomputed
			}
			if got := f.readGPU(t, s); !bytes.Equal(got, f.want[b.Key]) {
				t.Fatalf("request %d block %d (from %v): GPU slot %d holds other bytes", i, j, b.Tier, s)
			}
		}
		for layer := range dmLayers { // and the host-side wait agrees
			if err := l.WaitLayer(ctx, layer); err != nil {
				t.Fatal(err)
			}
		}
		for _, ev := range evs {
			if done, err := ev.Query(); !done || err != nil {
				t.Fatalf("a layer event is not complete (%v) after WaitLayer", err)
			}
		}
		if err := f.m.Wait(ctx, &l); err != nil {
			t.Fatal(err)
		}
		f.m.Release(&l)
		if bad := f.checkAll(t); len(bad) > 0 {
			t.Fatalf("after lookup %d: %v", round, bad)
		}
	}
	f.mover.Wait()
	st := f.mover.Stats()
	t.Logf("served by tier %v; mover %+v; metrics %+v", served, st, f.m.Metrics())
	if writeThrough { // blocks reach NVMe on commit: no GPU-to-NVMe copy
		st.BounceWrites = 1
	}
	for name, n := range map[string]uint64{"gpu to host": st.Offloads, "host to gpu": st.Onboards,
		"host to nvme": st.NVMeWrites, "nvme to host": st.NVMeReads, "nvme to gpu": st.StagedLoads, "gpu to nvme": st.BounceWrites} {
		if n == 0 {
			t.Errorf("no op took the %s path: the test does not cover it", name)
		}
	}
	if st.Failures != 0 {
		t.Errorf("%d ops failed", st.Failures)
	}
	if layered[kvtier.Host] == 0 || layered[kvtier.NVMe] == 0 {
		t.Errorf("blocks checked layer by layer, by tier they loaded from: %v: a path is not covered", layered)
	}
	if ss := f.store.Stats(); sums != (ss.DeferredChecks > 0) {
		t.Errorf("sums %v, but the store left %d payload checks to the device", sums, ss.DeferredChecks)
	}
}

// hostToNVMe inserts a request of one block straight into the host tier
// (writing its KV there unless it is there already) and offloads it to NVMe.
func (f *devFixture) hostToNVMe(t *testing.T, tokens []int32) kvtier.Key {
	t.Helper()
	var w kvtier.Lease
	if err := f.m.Insert(1, tokens, kvtier.Host, &w); err != nil {
		t.Fatal(err)
	}
	b := w.Blocks[0]
	if b.Write {
		kv := f.host.Slot(int32(b.Slot))
		for i := range kv {
			kv[i] = byte(f.rng.Uint32())
		}
		f.want[b.Key] = bytes.Clone(kv)
	}
	if err := f.m.Commit(&w, nil); err != nil {
		t.Fatal(err)
	}
	if err := f.m.Offload(&w, kvtier.NVMe); err != nil {
		t.Fatal(err)
	}
	if err := f.m.Wait(context.Background(), &w); err != nil {
		t.Fatal(err)
	}
	f.m.Release(&w)
	return b.Key
}

// promote copies the blocks of l whose fastest copy is in NVMe into the
// host tier (Manager.Promote), and waits for the copies. A copy that fails
// is the test's to look for: promote only retries while the host tier has
// no free slot (write-back: its demotions are under way).
func (f *devFixture) promote(t *testing.T, l *kvtier.Lease) {
	t.Helper()
	m := f.m
	for attempt := 1; ; attempt++ {
		if err := m.Promote(l, kvtier.Host); err != nil {
			t.Fatal(err)
		}
		f.mover.Wait()
		_ = m.Wait(context.Background(), l)
		left := false
		for _, b := range l.Blocks {
			if b.Tier == kvtier.NVMe {
				if in, ok := m.Peek(1, b.Key); ok && in.Held[kvtier.NVMe] && !in.Held[kvtier.Host] {
					left = true
				}
			}
		}
		if !left {
			return
		}
		if attempt == 3 {
			t.Fatal("no host slot to promote into")
		}
		if err := m.Drain(context.Background()); err != nil {
			t.Fatal(err)
		}
	}
}

// notServed fails the test if a lookup of any of the requests finds a block.
func (f *devFixture) notServed(t *testing.T, requests ...[]int32) {
	t.Helper()
	for _, tokens := range requests {
		var l kvtier.Lease
		if err := f.m.Lookup(1, tokens, &l); err != nil {
			t.Fatal(err)
		}
		if len(l.Blocks) != 0 {
			t.Errorf("a corrupt block is still served: %+v", l.Blocks)
		}
		f.m.Release(&l)
	}
}

// load plans and onboards l and returns what Wait says of its copies.
func (f *devFixture) load(t *testing.T, l *kvtier.Lease) error {
	t.Helper()
	if err := f.m.Plan(l); err != nil {
		t.Fatal(err)
	}
	if err := f.m.Onboard(l); err != nil {
		t.Fatal(err)
	}
	return f.m.Wait(context.Background(), l)
}

// corrupt flips one payload byte of the block in the manager's NVMe slot s,
// on disk, behind the store's back.
func (f *devFixture) corrupt(t *testing.T, s kvtier.Slot) {
	t.Helper()
	info := f.store.Info()
	fh, err := os.OpenFile(info.Files[0], os.O_RDWR, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer fh.Close()
	off := info.FirstSlotOffset + int64(f.mover.nvmeSlot[s])*info.SlotBytes + int64(info.HeaderBytes) + 100
	var one [1]byte
	if _, err := fh.ReadAt(one[:], off); err != nil {
		t.Fatal(err)
	}
	one[0] ^= 0x40
	if _, err := fh.WriteAt(one[:], off); err != nil {
		t.Fatal(err)
	}
	if err := fh.Sync(); err != nil {
		t.Fatal(err)
	}
}

// TestDeviceMoverCorruptNVMe flips a payload byte of two blocks on disk:
// loading one into the GPU (staged) and copying the other to the host both
// fail, Wait reports it, neither block is ever served, and the manager
// forgets their NVMe copies (ErrSourceLost) instead of failing on them again.
// A lease that looked a block up before its copy was lost recomputes it.
func TestDeviceMoverCorruptNVMe(t *testing.T) { testDeviceMoverCorruptNVMe(t, false) }

func testDeviceMoverCorruptNVMe(t *testing.T, real bool) {
	f := newDevFixture(t, devOpts{gpu: 4, host: 2, nvme: 8,
		simCfg: cudastream.SimConfig{Link: cudastream.H200Link(), Clock: cudastream.SimVirtualClock}, real: real})
	a, b := f.request(1), f.request(1)
	f.hostToNVMe(t, a)
	f.hostToNVMe(t, b)
	for range 2 { // push both out of the host tier
		f.hostToNVMe(t, f.request(1))
	}
	var la, la2, lb kvtier.Lease
	for _, c := range []struct {
		tokens []int32
		l      *kvtier.Lease
	}{{a, &la}, {a, &la2}, {b, &lb}} {
		if err := f.m.Lookup(1, c.tokens, c.l); err != nil {
			t.Fatal(err)
		}
		if len(c.l.Blocks) != 1 || c.l.Blocks[0].Tier != kvtier.NVMe {
			t.Fatalf("looked up as %+v, want one block in nvme", c.l.Blocks)
		}
	}
	if err := f.mover.LastError(); err != nil {
		t.Errorf("LastError() = %v before any op failed", err)
	}
	f.corrupt(t, la.Blocks[0].Slot)
	f.corrupt(t, lb.Blocks[0].Slot)

	// NVMe to GPU, staged.
	err := f.load(t, &la)
	if !errors.Is(err, kvtier.ErrMove) || !errors.Is(err, nvme.ErrCorrupt) || !errors.Is(err, kvtier.ErrSourceLost) {
		t.Fatalf("Wait after loading a corrupt block = %v, want ErrMove wrapping nvme.ErrCorrupt and ErrSourceLost", err)
	}
	// The other lease of the same block finds its copy gone: recompute.
	if err := f.load(t, &la2); err != nil {
		t.Errorf("onboard of a block whose copy was lost: %v, want no copy at all", err)
	}
	if b := la2.Blocks[0]; b.Loading || b.Action != kvtier.Recompute {
		t.Errorf("block whose copy was lost: %+v, want Recompute and not Loading", b)
	}
	// NVMe to host.
	f.promote(t, &lb)
	if in, ok := f.m.Peek(1, lb.Blocks[0].Key); ok && (in.Held[kvtier.Host] || in.Held[kvtier.NVMe]) {
		t.Errorf("after its copy to the host failed, the corrupt block holds a host slot %v and an nvme slot %v", in.Held[kvtier.Host], in.Held[kvtier.NVMe])
	}
	for _, l := range []*kvtier.Lease{&la, &la2, &lb} {
		f.m.Release(l)
	}

	f.notServed(t, a, b)
	if got := f.m.Metrics().MoveFailures; got != 2 {
		t.Errorf("MoveFailures = %d, want 2", got)
	}
	if err := f.mover.LastError(); !errors.Is(err, kvtier.ErrSourceLost) && !errors.Is(err, nvme.ErrCorrupt) {
		t.Errorf("LastError() = %v, want the corrupt block's read error", err)
	}
	if got := f.store.Stats(); got.CorruptDrops != 2 {
		t.Errorf("the store dropped %d corrupt slots, want 2: %+v", got.CorruptDrops, got)
	}
	if bad := f.checkAll(t); len(bad) > 0 {
		t.Errorf("ready copies that differ: %v", bad)
	}
	verify(t, f.m)
	// The freed NVMe slots take new blocks.
	for range 4 {
		f.hostToNVMe(t, f.request(1))
	}
	if bad := f.checkAll(t); len(bad) > 0 {
		t.Errorf("ready copies that differ after reuse: %v", bad)
	}
}

// TestDeviceMoverCorruptWordSummed: blocks whose NVMe copies carry word
// sums from the device (one written from the host tier after an offload,
// one through the bounce slots) have a payload byte flipped on disk.
// Loading the first into the GPU fails its device-side check: the op fails
// with ErrSourceLost, the store is told (the slot is dropped and its
// header cleared), and the block is not served again. Copying the second
// to the host is checked by the store itself, and fails likewise.
func TestDeviceMoverCorruptWordSummed(t *testing.T) { testDeviceMoverCorruptWordSummed(t, false) }

func testDeviceMoverCorruptWordSummed(t *testing.T, real bool) {
	f := newDevFixture(t, devOpts{gpu: 4, host: 4, nvme: 8, sums: true,
		simCfg: cudastream.SimConfig{Link: cudastream.H200Link(), Clock: cudastream.SimVirtualClock}, real: real})
	ctx := context.Background()
	a, b := f.request(1), f.request(1)
	var w kvtier.Lease
	f.prefill(t, a, &w)
	for _, to := range []kvtier.Tier{kvtier.Host, kvtier.NVMe} {
		if err := f.m.Offload(&w, to); err != nil {
			t.Fatal(err)
		}
		if err := f.m.Wait(ctx, &w); err != nil {
			t.Fatal(err)
		}
	}
	f.m.Release(&w)
	f.prefillToNVMe(t, b)
	f.mover.Wait()
	for _, tokens := range [][]int32{a, b} {
		if _, err := f.m.Evict(ctx, 1, tokens, kvtier.NVMe); err != nil {
			t.Fatal(err)
		}
	}
	var la, lb kvtier.Lease
	for _, c := range []struct {
		tokens []int32
		l      *kvtier.Lease
	}{{a, &la}, {b, &lb}} {
		if err := f.m.Lookup(1, c.tokens, c.l); err != nil {
			t.Fatal(err)
		}
		if len(c.l.Blocks) != 1 || c.l.Blocks[0].Tier != kvtier.NVMe {
			t.Fatalf("looked up as %+v, want one block in nvme only", c.l.Blocks)
		}
		blk := c.l.Blocks[0]
		ops := []nvme.ReadOp{{Slot: f.mover.nvmeSlot[blk.Slot], Dst: pinnedBytes(t, f.dev, dmBlockBytes), DeferWordSum: true}}
		if err := f.store.ReadBatch(ctx, ops); err != nil || ops[0].Err != nil {
			t.Fatal(err, ops[0].Err)
		}
		if !ops[0].Deferred || ops[0].Check.WordSum != checksum.WordSum(f.want[blk.Key]) {
			t.Fatalf("block %#x on nvme: deferred %v, sum %#x, want the device's sum of its KV %#x", uint64(blk.Key), ops[0].Deferred, ops[0].Check.WordSum, checksum.WordSum(f.want[blk.Key]))
		}
		f.corrupt(t, blk.Slot)
	}
	before := f.store.Stats()
	err := f.load(t, &la)
	if !errors.Is(err, kvtier.ErrMove) || !errors.Is(err, nvme.ErrCorrupt) || !errors.Is(err, kvtier.ErrSourceLost) {
		t.Fatalf("Wait after loading a corrupt word-summed block = %v, want ErrMove wrapping nvme.ErrCorrupt and ErrSourceLost", err)
	}
	if st := f.store.Stats(); st.ReportedCorrupt != before.ReportedCorrupt+1 || st.SlotsInvalidated != before.SlotsInvalidated+1 {
		t.Errorf("store after the failed check: %+v; before %+v: want one more reported and invalidated", st, before)
	}
	f.promote(t, &lb)
	if st := f.store.Stats(); st.CorruptDrops != before.CorruptDrops+2 {
		t.Errorf("store after the copy to the host: %d corrupt drops, want %d", st.CorruptDrops, before.CorruptDrops+2)
	}
	f.m.Release(&la)
	f.m.Release(&lb)
	f.notServed(t, a, b)
	if bad := f.checkAll(t); len(bad) > 0 {
		t.Errorf("ready copies that differ: %v", bad)
	}
	verify(t, f.m)
}

// earlyReuse offloads blocks from a two-slot GPU and releases them at once,
// while device-to-host copies take 40 ms and the test's writes into the GPU
// are instant: if an offload completed before its copy, the manager would
// evict its GPU block and hand the slot to the next request, whose KV the
// copy would then read. It returns the mismatches found afterwards.
func earlyReuse(t *testing.T, early bool) []string {
	f := newDevFixture(t, devOpts{gpu: 2, host: 8, early: early, simCfg: cudastream.SimConfig{
		Link:  cudastream.LinkModel{DtoHBytesPerSec: dmBlockBytes / 0.040},
		Clock: cudastream.SimWallClock,
	}})
	for range 5 {
		tokens := f.request(1)
		var w kvtier.Lease
		for {
			err := f.m.Insert(1, tokens, kvtier.GPU, &w)
			if err == nil {
				break
			}
			if !errors.Is(err, kvtier.ErrNoSpace) {
				t.Fatal(err)
			}
			// Both GPU blocks are still being copied out: wait for the
			// copies, then retry.
			f.m.Release(&w)
			f.mover.Wait()
		}
		for _, b := range w.Blocks {
			if b.Write {
				f.writeGPU(t, b.Key, b.Slot)
			}
		}
		if err := f.m.Commit(&w, nil); err != nil {
			t.Fatal(err)
		}
		if err := f.m.Offload(&w, kvtier.Host); err != nil {
			t.Fatal(err)
		}
		f.m.Release(&w) // the copy keeps its own reference
	}
	f.mover.Wait()
	return f.checkAll(t)
}

// TestDeviceMoverNoEarlyReuse: the copies' slots stay theirs until the
// copies complete. The same run with the mover completing ops at submission
// must find corruption, which shows the test can fail.
func TestDeviceMoverNoEarlyReuse(t *testing.T) {
	if bad := earlyReuse(t, false); len(bad) > 0 {
		t.Errorf("corrupt copies: %v", bad)
	}
	if bad := earlyReuse(t, true); len(bad) == 0 {
		t.Error("completing ops before their copies corrupted nothing: the test cannot catch early reuse")
	}
}

func TestDeviceMoverConfigErrors(t *testing.T) {
	sim, err := cudastream.NewSim(cudastream.SimConfig{MemoryBytes: 1 << 20, Clock: cudastream.SimVirtualClock})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { sim.Close() })
	base, err := sim.Alloc(4 * dmBlockBytes)
	if err != nil {
		t.Fatal(err)
	}
	gpu, err := transfer.BlockFirstLayout(base, dmLayers, dmParts, 4, dmPartBytes)
	if err != nil {
		t.Fatal(err)
	}
	host := transfer.HostLayout{Pool: pinnedBytes(t, sim, 4*dmBlockBytes), SlotBytes: dmBlockBytes}
	eng, err := transfer.New(sim, transfer.Config{GPU: gpu, Host: host})
	if err != nil {
		t.Fatal(err)
	}
	defer eng.Close()
	store, err := nvme.Open(nvme.Config{Dirs: []string{t.TempDir()}, SlotsPerFile: 4, BlockBytes: dmBlockBytes})
	if err != nil {
		t.Fatal(err)
	}
	defer store.Close()
	good := Config{Engine: eng, Host: host, BlockBytes: dmBlockBytes}
	for _, c := range []struct {
		field string
		edit  func(*Config)
	}{
		{"Engine", func(c *Config) { c.Engine = nil }},
		{"Host", func(c *Config) { c.Host.Pool = nil }},
		{"BlockBytes", func(c *Config) { c.BlockBytes = 2 * dmBlockBytes }},
		{"NVMeSlots", func(c *Config) { c.NVMeSlots = 4 }},
		{"NVMeSlots", func(c *Config) { c.Store, c.NVMeSlots = store, 5 }},
		{"BounceHost", func(c *Config) { c.Bounce = eng }},
		{"Config.Codec", func(c *Config) { c.Codec = 9 }},
	} {
		cfg := good
		c.edit(&cfg)
		_, err := New(cfg)
		if !errors.Is(err, kvtier.ErrConfig) || !bytes.Contains([]byte(err.Error()), []byte(c.field)) {
			t.Errorf("%s: New = %v, want ErrConfig naming it", c.field, err)
		}
	}
	if n := store.Len(); n != 0 {
		t.Errorf("a refused config left %d blocks in the store", n)
	}
	// A GPU-to-NVMe op without a bounce engine fails, naming the path.
	mc := good
	mc.Store, mc.NVMeSlots = store, 4
	d, err := New(mc)
	if err != nil {
		t.Fatal(err)
	}
	m := mustNew(t, kvtier.Config{BlockTokens: dmTokens, Mover: d, Tiers: [kvtier.NumTiers]kvtier.TierConfig{
		kvtier.GPU:  {CapacityBytes: 4 * dmBlockBytes, SlotBytes: dmBlockBytes, Policy: newLRU(t, 4)},
		kvtier.NVMe: {CapacityBytes: 4 * dmBlockBytes, SlotBytes: dmBlockBytes, Policy: newLRU(t, 4)},
	}})
	var w kvtier.Lease
	if err := m.Insert(1, make([]int32, dmTokens), kvtier.GPU, &w); err != nil {
		t.Fatal(err)
	}
	m.Commit(&w, nil)
	m.Offload(&w, kvtier.NVMe)
	if err := m.Wait(context.Background(), &w); !errors.Is(err, ErrNoPath) {
		t.Errorf("gpu to nvme without a bounce engine: %v, want ErrNoPath", err)
	}
	m.Release(&w)
	if err := d.Close(); err != nil {
		t.Error(err)
	}
}

// detKV is block k's KV in the concurrent test: a function of the key, so
// that goroutines writing the same block agree.
func detKV(k kvtier.Key) []byte {
	kv := make([]byte, dmBlockBytes)
	for i := range kv {
		kv[i] = byte(uint64(k)>>(8*(i%8))) ^ byte(i/8)
	}
	return kv
}

// TestDeviceMoverConcurrent serves requests sharing prefixes from four
// goroutines at once under eviction pressure in every tier (blocks leave
// NVMe and come back to other slots), checking each block loaded into the
// GPU, and every ready copy at the end.
func TestDeviceMoverConcurrent(t *testing.T) { testDeviceMoverConcurrent(t, false) }

func testDeviceMoverConcurrent(t *testing.T, real bool) {
	for _, sums := range []bool{false, true} {
		t.Run(fmt.Sprintf("sums=%v", sums), func(t *testing.T) { deviceMoverConcurrent(t, real, sums) })
	}
}

func deviceMoverConcurrent(t *testing.T, real, sums bool) {
	f := newDevFixture(t, devOpts{gpu: 24, host: 12, nvme: 32, sums: sums,
		simCfg: cudastream.SimConfig{Link: cudastream.H200Link(), Clock: cudastream.SimVirtualClock}, real: real})
	const workers, requests = 4, 60
	errs := make(chan error, workers)
	for w := range workers {
		go func() {
			errs <- f.serveRandom(uint64(w), requests)
		}()
	}
	for range workers {
		if err := <-errs; err != nil {
			t.Error(err)
		}
	}
	f.mover.Wait()
	if bad := f.checkAll(t); len(bad) > 0 {
		t.Errorf("ready copies that differ: %v", bad)
	}
	verify(t, f.m)
	st := f.mover.Stats()
	t.Logf("mover %+v", st)
	if st.Failures != 0 {
		t.Errorf("%d ops failed", st.Failures)
	}
	if st.StagedLoads == 0 || st.Onboards == 0 || st.NVMeWrites == 0 {
		t.Errorf("a path was not exercised: %+v", st)
	}
}

// serveRandom serves n requests of 1-6 blocks drawn from 16 prefixes, each
// the whole request path, from its own stream.
func (f *devFixture) serveRandom(seed uint64, n int) error {
	ctx := context.Background()
	rng := rand.New(rand.NewPCG(seed, 99))
	st, err := f.dev.NewStream(0)
	if err != nil {
		return err
	}
	defer st.Destroy()
	got := make([]byte, dmBlockBytes)
	var l, w kvtier.Lease
	for range n {
		p, blocks := rng.IntN(16), 1+rng.IntN(6)
		tokens := make([]int32, blocks*dmTokens)
		for i := range tokens {
			tokens[i] = int32(p*1000 + i)
		}
		if err := f.m.Lookup(1, tokens, &l); err != nil {
			return err
		}
		f.m.Plan(&l)
		if err := f.m.Onboard(&l); err != nil {
			return err
		}
		if err := f.m.Wait(ctx, &l); err != nil {
			return err
		}
		for _, b := range l.Blocks {
			if !b.Loading {
				continue
			}
			if err := st.CopyDtoH(got, f.gpuAddr(b.GPUSlot)); err != nil {
				return err
			}
			if err := st.Synchronize(); err != nil {
				return err
			}
			if !bytes.Equal(got, detKV(b.Key)) {
				return fmt.Errorf("block %#x loaded from %v into GPU slot %d holds other bytes", uint64(b.Key), b.Tier, b.GPUSlot)
			}
		}
		if err := f.m.Insert(1, tokens, kvtier.GPU, &w); err != nil && !errors.Is(err, kvtier.ErrNoSpace) {
			return err
		}
		for _, b := range w.Blocks {
			if b.Write {
				if err := st.CopyHtoD(f.gpuAddr(b.Slot), detKV(b.Key)); err != nil {
					return err
				}
			}
		}
		if err := st.Synchronize(); err != nil {
			return err
		}
		if err := f.m.Commit(&w, nil); err != nil {
			return err
		}
		if err := f.m.Offload(&w, kvtier.Host); err != nil {
			return err
		}
		if rng.IntN(3) == 0 {
			if err := f.m.Offload(&w, kvtier.NVMe); err != nil {
				return err
			}
		}
		if err := f.m.Wait(ctx, &w); err != nil {
			return err
		}
		f.m.Release(&w)
		f.m.Release(&l)
	}
	return nil
}

// TestDeviceMoverReclaim: a block the manager evicted from NVMe slot 0, whose
// slot was then freed unwritten, still sits in store slot 0 under its key.
// Written again into slot 1, the store refuses the duplicate key: the mover
// empties the stale slot and writes, and the block reads back right.
func TestDeviceMoverReclaim(t *testing.T) { testDeviceMoverReclaim(t, false) }

func testDeviceMoverReclaim(t *testing.T, real bool) {
	f := newDevFixture(t, devOpts{gpu: 2, host: 2, nvme: 2,
		simCfg: cudastream.SimConfig{Link: cudastream.H200Link(), Clock: cudastream.SimVirtualClock}, real: real})
	a := f.request(1)
	keyA := f.hostToNVMe(t, a)
	f.hostToNVMe(t, f.request(1))
	// Two blocks inserted into NVMe evict both (a first, from slot 0), and
	// are released uncommitted: slots 0 and 1 are free, and hold a and the
	// other block on disk.
	var w kvtier.Lease
	if err := f.m.Insert(1, f.request(2), kvtier.NVMe, &w); err != nil {
		t.Fatal(err)
	}
	if len(w.Blocks) != 2 || w.Blocks[0].Slot != 0 {
		t.Fatalf("insert into NVMe: %+v, want two blocks, the first in slot 0", w.Blocks)
	}
	f.m.Release(&w)
	if s, ok := f.store.Lookup(uint64(keyA)); !ok || s != f.mover.nvmeSlot[0] {
		t.Fatalf("store lookup of a: slot %d %v, want the stale copy in store slot %d", s, ok, f.mover.nvmeSlot[0])
	}
	f.hostToNVMe(t, a) // into slot 1, the last freed
	if got := f.mover.Stats().Reclaims; got != 1 {
		t.Errorf("Reclaims = %d, want 1", got)
	}
	if in, ok := f.m.Peek(1, keyA); !ok || !in.Ready[kvtier.NVMe] || in.Slot[kvtier.NVMe] != 1 {
		t.Errorf("a is %+v (known %v), want ready in NVMe slot 1", in, ok)
	}
	if bad := f.checkAll(t); len(bad) > 0 {
		t.Errorf("ready copies that differ: %v", bad)
	}
}

// TestDeviceMoverGPU runs the round trip, corruption, concurrency and
// reclaim tests on GPU 0 with the real driver (go test -c, then run the
// binary with -test.run DeviceMoverGPU on the GPU machine).
func TestDeviceMoverGPU(t *testing.T) {
	for name, fn := range map[string]func(*testing.T, bool){
		"RoundTrip": testDeviceMoverRoundTrip, "CorruptNVMe": testDeviceMoverCorruptNVMe,
		"CorruptWordSummed": testDeviceMoverCorruptWordSummed,
		"Concurrent":        testDeviceMoverConcurrent, "Reclaim": testDeviceMoverReclaim,
		"Restart": testDeviceMoverRestart, "Sharded": testShardedDeviceMover,
	} {
		t.Run(name, func(t *testing.T) { fn(t, true) })
	}
}

// prefillToNVMe prefills a request into the GPU and copies it to NVMe.
func (f *devFixture) prefillToNVMe(t *testing.T, tokens []int32) {
	t.Helper()
	var w kvtier.Lease
	f.prefill(t, tokens, &w)
	defer f.m.Release(&w)
	if err := f.m.Offload(&w, kvtier.NVMe); err != nil {
		t.Fatal(err)
	}
	if err := f.m.Wait(context.Background(), &w); err != nil {
		t.Fatal(err)
	}
}

// TestDeviceMoverRestart: blocks one server wrote to NVMe survive a
// restart. The next server's mover keeps them (KeepBlocks), its manager
// adopts them, and they load into the GPU byte for byte and are written over
// like any others; without KeepBlocks they are freed.
func TestDeviceMoverRestart(t *testing.T) { testDeviceMoverRestart(t, false) }

func testDeviceMoverRestart(t *testing.T, real bool) {
	dir := t.TempDir()
	opts := devOpts{gpu: 16, host: 4, nvme: 16, nvmeDir: dir, real: real,
		simCfg: cudastream.SimConfig{Link: cudastream.H200Link(), Clock: cudastream.SimVirtualClock}}
	ctx := context.Background()
	var reqs [][]int32
	want := map[kvtier.Key][]byte{}
	ok := t.Run("first run", func(t *testing.T) {
		f := newDevFixture(t, opts)
		for range 4 {
			tokens := f.request(3)
			reqs = append(reqs, tokens)
			f.prefillToNVMe(t, tokens)
		}
		f.mover.Wait()
		for k, kv := range f.want {
			want[k] = kv
		}
	})
	switch {
	case !ok:
		t.Fatal("the first run failed")
	case len(reqs) == 0:
		t.Skip("the first run was skipped")
	}
	t.Run("restart", func(t *testing.T) {
		o := opts
		o.keep = true
		f := newDevFixture(t, o)
		f.want = want
		if n, err := f.m.Adopt(kvtier.NVMe, f.mover.Recovered()); err != nil || n != 12 {
			t.Fatalf("Adopt = %d, %v; want the 12 blocks of the first run", n, err)
		}
		if bad := f.checkAll(t); len(bad) > 0 {
			t.Fatalf("after adopting: %v", bad)
		}
		for i, tokens := range reqs {
			var l kvtier.Lease
			if err := f.m.Lookup(1, tokens, &l); err != nil {
				t.Fatal(err)
			}
			if l.Len() != 3 {
				t.Fatalf("request %d: %d blocks found after the restart, want 3", i, l.Len())
			}
			if err := f.m.Plan(&l); err != nil {
				t.Fatal(err)
			}
			if err := f.m.Onboard(&l); err != nil {
				t.Fatal(err)
			}
			if err := f.m.Wait(ctx, &l); err != nil {
				t.Fatal(err)
			}
			for j, b := range l.Blocks {
				if b.Tier != kvtier.NVMe || !b.Loading {
					t.Fatalf("request %d block %d: from %v, loading %v; want a load from nvme", i, j, b.Tier, b.Loading)
				}
				if got := f.readGPU(t, b.GPUSlot); !bytes.Equal(got, want[b.Key]) {
					t.Fatalf("request %d block %d: GPU slot %d holds other bytes than the first run wrote", i, j, b.GPUSlot)
				}
			}
			f.m.Release(&l)
		}
		// New blocks take the free slots, then evict adopted ones.
		for range 3 {
			tokens := f.request(3)
			for k := range tokens {
				tokens[k] += 1 << 20 // not the first run's tokens
			}
			f.prefillToNVMe(t, tokens)
		}
		f.mover.Wait()
		if bad := f.checkAll(t); len(bad) > 0 {
			t.Fatalf("after new writes: %v", bad)
		}
		if st := f.mover.Stats(); st.Failures != 0 {
			t.Errorf("%d ops failed", st.Failures)
		}
		verify(t, f.m)
	})
	t.Run("restart without KeepBlocks", func(t *testing.T) {
		f := newDevFixture(t, opts)
		if n := len(f.mover.Recovered()); n != 0 {
			t.Errorf("Recovered lists %d blocks without KeepBlocks", n)
		}
		if n := f.store.Len(); n != 0 {
			t.Errorf("the store still holds %d blocks", n)
		}
	})
}

// TestDeviceMoverStaleHostSum: a host slot that held an offloaded block
// (whose GPU sum the mover kept) and is then written by the host itself
// with another block (an Insert into the host tier) must not lend that
// block the old sum: its NVMe copy is hashed by the store, and loads back
// into the GPU byte for byte.
func TestDeviceMoverStaleHostSum(t *testing.T) {
	f := newDevFixture(t, devOpts{gpu: 4, host: 1, nvme: 8, sums: true,
		simCfg: cudastream.SimConfig{Link: cudastream.H200Link(), Clock: cudastream.SimVirtualClock}})
	ctx := context.Background()
	a := f.request(1)
	var w kvtier.Lease
	f.prefill(t, a, &w)
	if err := f.m.Offload(&w, kvtier.Host); err != nil {
		t.Fatal(err)
	}
	if err := f.m.Wait(ctx, &w); err != nil {
		t.Fatal(err)
	}
	f.m.Release(&w)
	if _, err := f.m.Invalidate(1, a); err != nil { // frees the host slot
		t.Fatal(err)
	}
	f.mover.Wait()
	b := f.request(1)
	kb := f.hostToNVMe(t, b) // the host's only slot, written by the host
	f.mover.Wait()
	if _, err := f.m.EvictKeys(ctx, 1, []kvtier.Key{kb}, kvtier.NVMe); err != nil {
		t.Fatal(err)
	}
	var l kvtier.Lease
	if err := f.m.Lookup(1, b, &l); err != nil {
		t.Fatal(err)
	}
	if len(l.Blocks) != 1 || l.Blocks[0].Tier != kvtier.NVMe {
		t.Fatalf("looked up as %+v, want one block in nvme only", l.Blocks)
	}
	if err := f.load(t, &l); err != nil {
		t.Fatalf("loading the block the host wrote: %v", err)
	}
	s, ok := gpuSlot(l.Blocks[0])
	if !ok {
		t.Fatal("the block did not load into the GPU")
	}
	if got := f.readGPU(t, s); !bytes.Equal(got, f.want[kb]) {
		t.Fatal("the block loaded with other bytes")
	}
	f.m.Release(&l)
	if st := f.store.Stats(); st.ReportedCorrupt != 0 || st.CorruptDrops != 0 {
		t.Fatalf("store %+v: a block was taken for corrupt", st)
	}
}
