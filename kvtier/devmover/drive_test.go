package devmover

import (
	"context"
	"errors"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"kvtier.dev/kvtier"
	"kvtier.dev/kvtier/nvme"
)

// slowFile is a slab file whose reads and writes take a while and which
// watches what runs at once: the reads and writes in flight at every call.
type slowFile struct {
	nvme.File
	w                     *watch
	readDelay, writeDelay time.Duration
}

// watch counts the I/Os in flight and what a read or write found there.
type watch struct {
	slow                  atomic.Bool // writes sleep
	reads, writes         atomic.Int32
	mostWritesUnderRead   atomic.Int32 // writes in flight when a read started, at most
	readsSeen, writesSeen atomic.Int32
}

func (f *slowFile) ReadAtv(bufs [][]byte, off int64) (int, error) {
	f.w.readsSeen.Add(1)
	n := f.w.writes.Load()
	for {
		m := f.w.mostWritesUnderRead.Load()
		if n <= m || f.w.mostWritesUnderRead.CompareAndSwap(m, n) {
			break
		}
	}
	f.w.reads.Add(1)
	defer f.w.reads.Add(-1)
	if f.w.slow.Load() {
		time.Sleep(f.readDelay)
	}
	return f.File.ReadAtv(bufs, off)
}

func (f *slowFile) WriteAtv(bufs [][]byte, off int64) (int, error) {
	f.w.writesSeen.Add(1)
	f.w.writes.Add(1)
	defer f.w.writes.Add(-1)
	if f.w.slow.Load() {
		time.Sleep(f.writeDelay)
	}
	return f.File.WriteAtv(bufs, off)
}

// TestDriveReadsBeforeWrites: with a drive faked slow (each write takes
// 5 ms, each read 3 ms), loads from NVMe issued while a queue of writes
// drains each find at most one write in flight on the drive. The drive
// measures both directions. (TestDriveTurns checks the order itself.)
func TestDriveReadsBeforeWrites(t *testing.T) {
	w := &watch{}
	f := newDevFixture(t, devOpts{gpu: 64, host: 32, nvme: 64,
		wrap: func(_ string, file nvme.File) nvme.File {
			return &slowFile{File: file, w: w, writeDelay: 5 * time.Millisecond}
		}})
	// Blocks to read back later, written while the drive is fast.
	var old [][]int32
	for range 16 {
		r := f.request(1)
		f.prefillToNVMe(t, r)
		if n, err := f.m.Evict(context.Background(), 1, r, kvtier.NVMe); err != nil || n != 1 {
			t.Fatalf("Evict to NVMe: %d, %v", n, err)
		}
		old = append(old, r)
	}
	w.readsSeen.Store(0)
	w.slow.Store(true)
	// A queue of 24 writes: host blocks offloaded to NVMe at once.
	var hw kvtier.Lease
	tokens := f.request(24)
	f.prefill(t, tokens, &hw)
	if err := f.m.Offload(&hw, kvtier.Host); err != nil {
		t.Fatal(err)
	}
	if err := f.m.Wait(context.Background(), &hw); err != nil {
		t.Fatal(err)
	}
	if err := f.m.Offload(&hw, kvtier.NVMe); err != nil {
		t.Fatal(err)
	}
	// Meanwhile, once the writes have begun, loads from NVMe: four
	// goroutines, four loads each, one after another.
	for w.writesSeen.Load() == 0 {
		time.Sleep(time.Millisecond)
	}
	var wg sync.WaitGroup
	for g := range 4 {
		wg.Go(func() {
			for _, r := range old[4*g : 4*g+4] {
				var l kvtier.Lease
				if err := f.m.Lookup(1, r, &l); err != nil {
					t.Error(err)
					return
				}
				if err := f.load(t, &l); err != nil {
					t.Error(err)
				}
				f.m.Release(&l)
			}
		})
	}
	wg.Wait()
	if err := f.m.Wait(context.Background(), &hw); err != nil {
		t.Fatal(err)
	}
	f.m.Release(&hw)
	if w.readsSeen.Load() < 16 || w.writesSeen.Load() < 24 {
		t.Fatalf("%d reads and %d writes reached the drive; mover %+v, recomputes %v", w.readsSeen.Load(), w.writesSeen.Load(), f.mover.Stats(), f.m.Metrics().Recomputes)
	}
	if got := w.mostWritesUnderRead.Load(); got > 1 {
		t.Errorf("a read found %d writes in flight, want at most 1", got)
	}
	if r := f.mover.DriveRates(); r.Reads == 0 || r.Writes == 0 || r.ReadBytesPerS <= 0 || r.WriteBytesPerS <= 0 {
		t.Errorf("drive rates %+v, want both directions measured", r)
	}
	if q := f.mover.QueuedWrites(); q != 0 {
		t.Errorf("%d writes still queued after every copy completed", q)
	}
	if bad := f.checkAll(t); len(bad) > 0 {
		t.Errorf("ready copies that differ: %v", bad)
	}
}

// TestDriveDropsUnwantedWrites: writes queued behind a slow one whose
// blocks are invalidated before their turn are dropped, not written: the
// store never holds them, the mover counts them, and the manager counts no
// failure.
func TestDriveDropsUnwantedWrites(t *testing.T) {
	w := &watch{}
	f := newDevFixture(t, devOpts{gpu: 16, host: 16, nvme: 16,
		wrap: func(_ string, file nvme.File) nvme.File {
			return &slowFile{File: file, w: w, writeDelay: 20 * time.Millisecond}
		}})
	w.slow.Store(true)
	var hw kvtier.Lease
	tokens := f.request(8)
	f.prefill(t, tokens, &hw)
	if err := f.m.Offload(&hw, kvtier.Host); err != nil {
		t.Fatal(err)
	}
	if err := f.m.Wait(context.Background(), &hw); err != nil {
		t.Fatal(err)
	}
	keys := make([]kvtier.Key, len(hw.Blocks))
	for i, b := range hw.Blocks {
		keys[i] = b.Key
	}
	if err := f.m.Offload(&hw, kvtier.NVMe); err != nil {
		t.Fatal(err)
	}
	f.m.Release(&hw) // the copies hold their own references
	if n, err := f.m.Invalidate(1, tokens); err != nil || n != 8 {
		t.Fatalf("Invalidate: %d, %v", n, err)
	}
	if err := f.m.Drain(context.Background()); err != nil {
		t.Fatal(err)
	}
	st := f.mover.Stats()
	if st.Dropped == 0 || st.Dropped+uint64(w.writesSeen.Load()) < 8 {
		t.Errorf("%d writes dropped, %d reached the drive; want the queued ones dropped", st.Dropped, w.writesSeen.Load())
	}
	for _, k := range keys[len(keys)-int(st.Dropped):] {
		if _, ok := f.store.Lookup(uint64(k)); ok {
			t.Errorf("block %#x was dropped but the store holds it", uint64(k))
		}
	}
	if mt := f.m.Metrics(); mt.MoveFailures != 0 || mt.Tiers[kvtier.NVMe].ResidentBlocks != 0 {
		t.Errorf("after the drops: %d failures, %d NVMe blocks; want none", mt.MoveFailures, mt.Tiers[kvtier.NVMe].ResidentBlocks)
	}
	if err := f.m.Verify(); err != nil {
		t.Fatal(err)
	}
	if !errors.Is(f.mover.LastError(), nil) && st.Failures > 0 {
		t.Errorf("mover failures %d: %v", st.Failures, f.mover.LastError())
	}
}

// TestDriveTurns: the drive's order, step by step. A write in flight
// finishes; a read goes at once, beside it; the next write waits for the
// read, and writes go in ticket order; a skipped ticket passes its turn.
func TestDriveTurns(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		v := newDrive(nil)
		t1, t2, t3 := v.ticket(), v.ticket(), v.ticket()
		if v.queued.Load() != 3 {
			t.Fatalf("%d queued, want 3", v.queued.Load())
		}
		var order []string
		inWrite1, endWrite1 := make(chan struct{}), make(chan struct{})
		go v.write(t1, 1, func() { order = append(order, "w1"); close(inWrite1); <-endWrite1 })
		<-inWrite1
		inRead, endRead := make(chan struct{}), make(chan struct{})
		go v.read(1, func() { order = append(order, "r"); close(inRead); <-endRead })
		<-inRead // the read started while write 1 is in flight
		done := make(chan struct{})
		go func() {
			v.write(t3, 1, func() { order = append(order, "w3") })
			close(done)
		}()
		close(endWrite1)
		v.skip(t2)      // returns once write 1 is done: write 3's turn, behind the read
		synctest.Wait() // write 3 has started, or waits
		select {
		case <-done:
			t.Fatal("a write started while a read was in flight")
		default:
		}
		close(endRead)
		<-done
		if got := strings.Join(order, " "); got != "w1 r w3" {
			t.Errorf("order %q, want w1 r w3", got)
		}
		if v.queued.Load() != 0 {
			t.Errorf("%d queued after every write ended", v.queued.Load())
		}
	})
}

// TestDriveBackgroundReadsYield: a background read (a prefetch) waits for
// the requests' reads in flight, goes before a queued write, and does not
// hold up a request's read that comes while it runs.
func TestDriveBackgroundReadsYield(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		v := newDrive(nil)
		var mu sync.Mutex
		var order []string
		note := func(s string) { mu.Lock(); order = append(order, s); mu.Unlock() }
		inRead, endRead := make(chan struct{}), make(chan struct{})
		go v.read(1, func() { note("r1"); close(inRead); <-endRead })
		<-inRead
		inBg, endBg, bgDone := make(chan struct{}), make(chan struct{}), make(chan struct{})
		go func() {
			v.background(1, func() { note("bg"); close(inBg); <-endBg })
			close(bgDone)
		}()
		synctest.Wait()
		select {
		case <-inBg:
			t.Fatal("a background read started beside a request's read")
		default:
		}
		tk := v.ticket()
		wDone := make(chan struct{})
		go func() { v.write(tk, 1, func() { note("w") }); close(wDone) }()
		close(endRead)
		<-inBg // the background read goes before the queued write
		// and a request's read passes it
		v.read(1, func() { note("r2") })
		synctest.Wait()
		select {
		case <-wDone:
			t.Fatal("a write started beside a background read")
		default:
		}
		close(endBg)
		<-bgDone
		<-wDone
		if got := strings.Join(order, " "); got != "r1 bg r2 w" {
			t.Errorf("order %q, want r1 bg r2 w", got)
		}
	})
}
