package devmover

import (
	"math"
	"sync"
	"sync/atomic"
	"time"

	"kvtier.dev/kvtier"
)

// drive schedules the NVMe store's I/O so that a slower tier never makes
// loads wait on writes: a request's reads go at once; a background read (a
// prefetch: no request waits for it) starts only when no request's read,
// no write and no other background read is in flight; a write starts only
// when no read of either kind is in flight or waiting and no other write
// is, in the order its ticket was handed out. So a request's read waits on the drive
// behind at most one write or background read. Writes that cannot start
// pile up only as far as the manager's WriteGate lets them (QueuedWrites).
// It also measures both directions, every I/O.
type drive struct {
	mu      sync.Mutex
	cond    sync.Cond
	reads   int    // reads in flight, background ones included
	demand  int    // requests' reads in flight
	bg      bool   // a background read in flight
	bgWait  int    // background reads waiting: writes let them go first
	writing bool   // a write in flight
	next    uint64 // write tickets handed out
	serving uint64 // the ticket whose turn it is

	queued      atomic.Int64 // write ops waiting or in flight
	writingNow  atomic.Bool  // writing, for Backlog
	readPending atomic.Int64 // bytes of reads in flight

	readBps, writeBps atomic.Uint64 // float64 bits: EWMA of measured rates
	readN, writeN     atomic.Uint64 // samples taken
	onIO              func(write bool, bytes int64, d time.Duration)
}

// ewmaWeight is a new sample's weight in the measured rates: about the
// last 20 I/Os count.
const ewmaWeight = 0.05

func newDrive(onIO func(bool, int64, time.Duration)) *drive {
	v := &drive{onIO: onIO}
	v.cond.L = &v.mu
	return v
}

// ticket queues one write and returns its place in line.
func (v *drive) ticket() uint64 {
	v.mu.Lock()
	t := v.next
	v.next++
	v.mu.Unlock()
	v.queued.Add(1)
	return t
}

// write runs f, a write of bytes, in ticket t's turn: after the writes
// ticketed before it, with no read in flight.
func (v *drive) write(t uint64, bytes int64, f func()) {
	v.mu.Lock()
	for v.serving != t || v.writing || v.reads > 0 || v.bgWait > 0 {
		v.cond.Wait()
	}
	v.writing = true
	v.writingNow.Store(true)
	v.mu.Unlock()
	start := time.Now()
	f()
	v.measure(true, bytes, time.Since(start))
	v.mu.Lock()
	v.writing = false
	v.writingNow.Store(false)
	v.serving++
	v.cond.Broadcast()
	v.mu.Unlock()
	v.queued.Add(-1)
}

// skip gives up ticket t's turn without writing (a write not wanted),
// waiting for it so that the order holds.
func (v *drive) skip(t uint64) {
	v.mu.Lock()
	for v.serving != t || v.writing {
		v.cond.Wait()
	}
	v.serving++
	v.cond.Broadcast()
	v.mu.Unlock()
	v.queued.Add(-1)
}

// read runs f, a request's read of bytes, at once; background reads and
// writes wait until it is done.
func (v *drive) read(bytes int64, f func()) {
	v.mu.Lock()
	v.reads++
	v.demand++
	v.mu.Unlock()
	v.readPending.Add(bytes)
	start := time.Now()
	f()
	v.measure(false, bytes, time.Since(start))
	v.readPending.Add(-bytes)
	v.mu.Lock()
	v.reads--
	v.demand--
	v.cond.Broadcast()
	v.mu.Unlock()
}

// background runs f, a read of bytes no request waits for, once the drive
// has no request's read, write or other background read in flight; writes
// wait until it is done.
func (v *drive) background(bytes int64, f func()) {
	v.mu.Lock()
	v.bgWait++
	for v.demand > 0 || v.writing || v.bg {
		v.cond.Wait()
	}
	v.bgWait--
	v.reads++
	v.bg = true
	v.mu.Unlock()
	start := time.Now()
	f()
	v.measure(false, bytes, time.Since(start))
	v.mu.Lock()
	v.reads--
	v.bg = false
	v.cond.Broadcast()
	v.mu.Unlock()
}

func (v *drive) measure(write bool, bytes int64, d time.Duration) {
	if bytes <= 0 || d <= 0 {
		return
	}
	rate, n := &v.readBps, &v.readN
	if write {
		rate, n = &v.writeBps, &v.writeN
	}
	sample := float64(bytes) / d.Seconds()
	for {
		old := rate.Load()
		next := sample
		if n.Load() > 0 {
			next = (1-ewmaWeight)*math.Float64frombits(old) + ewmaWeight*sample
		}
		if rate.CompareAndSwap(old, math.Float64bits(next)) {
			break
		}
	}
	n.Add(1)
	if v.onIO != nil {
		v.onIO(write, bytes, d)
	}
}

// seed sets the rates before any I/O measured them (a probe's).
func (v *drive) seed(readBps, writeBps float64) {
	if readBps > 0 && v.readN.Load() == 0 {
		v.readBps.Store(math.Float64bits(readBps))
	}
	if writeBps > 0 && v.writeN.Load() == 0 {
		v.writeBps.Store(math.Float64bits(writeBps))
	}
}

// DriveRates are the NVMe tier's drive as the Mover measured it: the
// moving averages of its I/Os (or a probe's figures until the first).
type DriveRates struct {
	ReadBytesPerS, WriteBytesPerS float64
	Reads, Writes                 uint64 // I/Os measured
}

// DriveRates returns the drive's measured rates (zeros without a store).
func (d *Mover) DriveRates() DriveRates {
	v := d.drive
	return DriveRates{
		ReadBytesPerS: math.Float64frombits(v.readBps.Load()), WriteBytesPerS: math.Float64frombits(v.writeBps.Load()),
		Reads: v.readN.Load(), Writes: v.writeN.Load(),
	}
}

// SeedDriveRates gives the drive rates (a probe's) to use until the
// Mover's own I/Os have measured them.
func (d *Mover) SeedDriveRates(readBytesPerS, writeBytesPerS float64) {
	d.drive.seed(readBytesPerS, writeBytesPerS)
}

// WriteBytesPerS is the drive's measured write rate (costplan.Drive).
func (d *Mover) WriteBytesPerS() float64 { return math.Float64frombits(d.drive.writeBps.Load()) }

// QueuedWrites is the number of NVMe writes waiting or in flight
// (costplan.Drive).
func (d *Mover) QueuedWrites() int { return int(d.drive.queued.Load()) }

// Backlog implements kvtier.Backlogger: a load from NVMe planned now waits
// on the drive for the reads in flight and the write in flight, if any.
func (d *Mover) Backlog() kvtier.Backlog {
	v, r := d.drive, d.DriveRates()
	var s float64
	if r.ReadBytesPerS > 0 {
		s += float64(v.readPending.Load()) / r.ReadBytesPerS
	}
	if r.WriteBytesPerS > 0 && v.writingNow.Load() {
		s += float64(d.blockBytes) / r.WriteBytesPerS
	}
	return kvtier.Backlog{Drive: time.Duration(s * float64(time.Second))}
}
