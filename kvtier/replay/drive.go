package replay

import (
	"strings"
	"time"

	"kvtier.dev/kvtier"
	"kvtier.dev/kvtier/cost"
	"kvtier.dev/kvtier/costplan"
)

// The NVMe drive as the replay models it: one channel (chanNVMe) that
// serves one copy at a time, loads first, then prefetches, then writes, a
// load waiting behind at most the copy in service: as devmover's drive
// scheduler runs a real one. Reads go at the drive's read rate, writes at its write rate
// (Config.NVMeLink), and the gated writes ask costplan.Gate, as a server
// does, whether they are worth a write and within the drive's budget.

// loadDrive is Config.NVMeLink's drive: a preset, or a probe's file.
func loadDrive(name string) (cost.Drive, error) {
	if strings.Contains(name, "/") || strings.HasSuffix(name, ".json") {
		return cost.LoadDrive(name)
	}
	l, err := cost.LookupLink(name)
	if err != nil {
		return cost.Drive{}, err
	}
	return cost.PresetDrive(l), nil
}

// modelledDrive is the replay's drive as costplan.Gate sees it.
type modelledDrive struct{ e *engine }

// WriteBytesPerS implements costplan.Drive.
func (d modelledDrive) WriteBytesPerS() float64 { return d.e.drive.Write.BandwidthBytesPerS }

// QueuedWrites implements costplan.Drive: the writes queued on the drive,
// and the one in service.
func (d modelledDrive) QueuedWrites() int {
	s := &d.e.servers[chanNVMe]
	n := s.queue[prioOffload].len()
	if s.busy && d.e.serving[chanNVMe].write {
		n++
	}
	return n
}

// nvmeGate is the NVMe tier's gate under Config.NVMeWrites "gated", nil
// under "all".
func (e *engine) nvmeGate() (kvtier.WriteGate, error) {
	cfg := &e.cfg
	if cfg.NVMeWrites == "all" {
		return nil, nil
	}
	g, err := costplan.NewGate(costplan.GateConfig{Model: e.costs, Tier: cost.TierNVMe, Drive: modelledDrive{e},
		WriteShare: cfg.NVMeWriteShare, DriveWritesPerDay: cfg.NVMeDWPD, DriveBytes: int64(cfg.NVMeBytes),
		Persist: cfg.NVMePersist, Now: func() time.Duration { return e.now }})
	if err != nil {
		return nil, cfgErr("nvme_writes", "%v", err)
	}
	return g, nil
}

// driveBacklog is how long a read submitted now waits for the drive: the
// copy in service, then the reads queued before it. Only under Config.Mover
// "device" do loads from NVMe queue on the drive (under "model" they cross
// the NVMe path alone, as the planner times them).
func (e *engine) driveBacklog() time.Duration {
	if e.dev == nil {
		return 0
	}
	s := &e.servers[chanNVMe]
	var d time.Duration
	if s.busy {
		d = max(0, s.servingEnd-e.now)
	}
	return d + s.queue[prioOnboard].streamSum()
}
