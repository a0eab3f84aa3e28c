package nvme

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"time"

	"kvtier.dev/kvtier/nvme/internal/sysio"
)

// ProbeConfig bounds a drive probe. Zero fields take the defaults named.
type ProbeConfig struct {
	// Dir is the directory the tier will use: the probe writes a scratch
	// file there (removed after) so that it measures that drive.
	Dir string
	// BlockBytes is one I/O, the tier's block (a multiple of 4 KiB); 0
	// means 2 MiB.
	BlockBytes int
	// Bytes is how much it writes and then reads back; 0 means 256 MiB.
	Bytes int64
	// MaxTime stops each direction early; 0 means 2 s.
	MaxTime time.Duration
}

// DriveProbe is what ProbeDrive measured: the drive as the tier uses it,
// one block-sized direct I/O at a time (the mover writes one block at a
// time; a staged load reads one), and the latency of one small I/O (what a
// block's I/O costs beyond its bytes).
type DriveProbe struct {
	ReadBytesPerS, WriteBytesPerS float64
	ReadLatency, WriteLatency     time.Duration // the median 4 KiB I/O's
	BlockBytes                    int
	Reads, Writes                 int  // block I/Os measured
	Direct                        bool // O_DIRECT (else buffered, synced)
}

// probeFile is the probe's scratch file in Dir.
const probeFile = ".kvtier-probe"

// ProbeDrive measures the drive under cfg.Dir: it writes cfg.Bytes in
// blocks of cfg.BlockBytes, one after another, synced at the end, then
// reads them back, each direction for at most cfg.MaxTime, and removes its
// file. It is bounded (a quarter GiB and a few seconds by default) so that
// a server can run it in the background at start. A bad config is an
// error that names the field.
func ProbeDrive(ctx context.Context, cfg ProbeConfig) (DriveProbe, error) {
	if err := cfg.fill(); err != nil {
		return DriveProbe{}, err
	}
	dirfd, err := sysio.OpenDir(cfg.Dir)
	if err != nil {
		return DriveProbe{}, fmt.Errorf("nvme: probe: %w", err)
	}
	defer sysio.Close(dirfd)
	p := DriveProbe{BlockBytes: cfg.BlockBytes, Direct: true}
	fd, _, err := sysio.OpenAt(dirfd, probeFile, true)
	if errors.Is(err, sysio.EINVAL) {
		p.Direct = false
		fd, _, err = sysio.OpenAt(dirfd, probeFile, false)
	}
	if err != nil {
		return p, fmt.Errorf("nvme: probe: %w", err)
	}
	defer func() {
		sysio.Close(fd)
		_ = sysio.UnlinkAt(dirfd, probeFile)
	}()
	buf, err := sysio.AllocAligned(cfg.BlockBytes)
	if err != nil {
		return p, fmt.Errorf("nvme: probe: %w", err)
	}
	defer sysio.FreeAligned(buf)
	for i := range buf {
		buf[i] = byte(i*131 + i>>9)
	}
	n := int(cfg.Bytes / int64(cfg.BlockBytes))
	var werr, rerr error
	p.Writes, p.WriteBytesPerS, _, werr = p.pass(ctx, fd, buf, n, cfg.MaxTime, true)
	if werr != nil {
		return p, fmt.Errorf("nvme: probe: write: %w", werr)
	}
	p.Reads, p.ReadBytesPerS, _, rerr = p.pass(ctx, fd, buf, p.Writes, cfg.MaxTime, false)
	if rerr != nil {
		return p, fmt.Errorf("nvme: probe: read: %w", rerr)
	}
	// Latency: single small I/Os, spread over what was written.
	small := buf[:smallIO]
	stride := max(1, p.Writes*cfg.BlockBytes/smallIO/smallIOs) * smallIO
	if p.WriteLatency, werr = smallPass(ctx, fd, small, stride, true); werr != nil {
		return p, fmt.Errorf("nvme: probe: small write: %w", werr)
	}
	if p.ReadLatency, rerr = smallPass(ctx, fd, small, stride, false); rerr != nil {
		return p, fmt.Errorf("nvme: probe: small read: %w", rerr)
	}
	return p, nil
}

func (c *ProbeConfig) fill() error {
	bad := func(field, format string, args ...any) error {
		return fmt.Errorf("%w: ProbeConfig.%s: %s", ErrConfig, field, fmt.Sprintf(format, args...))
	}
	switch {
	case c.Dir == "":
		return bad("Dir", "is empty")
	case c.BlockBytes < 0 || c.BlockBytes%4096 != 0:
		return bad("BlockBytes", "%d is not a multiple of 4 KiB", c.BlockBytes)
	case c.Bytes < 0:
		return bad("Bytes", "%d is negative", c.Bytes)
	case c.MaxTime < 0:
		return bad("MaxTime", "%v is negative", c.MaxTime)
	}
	if c.BlockBytes == 0 {
		c.BlockBytes = 2 << 20
	}
	if c.Bytes == 0 {
		c.Bytes = 256 << 20
	}
	if c.Bytes < int64(c.BlockBytes) {
		return bad("Bytes", "%d holds no block of %d bytes", c.Bytes, c.BlockBytes)
	}
	if c.MaxTime == 0 {
		c.MaxTime = 2 * time.Second
	}
	return nil
}

// pass writes or reads up to n blocks of buf at consecutive offsets, for at
// most maxTime, and returns how many it did, their rate and the median
// I/O's time. A buffered write pass ends with an fdatasync, counted in.
func (p *DriveProbe) pass(ctx context.Context, fd int, buf []byte, n int, maxTime time.Duration, write bool) (int, float64, time.Duration, error) {
	iov := make([]sysio.Iovec, 1)
	bufs := [][]byte{buf}
	times := make([]time.Duration, 0, n)
	start := time.Now()
	done := 0
	for ; done < n && time.Since(start) < maxTime; done++ {
		if err := ctx.Err(); err != nil {
			return done, 0, 0, err
		}
		t0 := time.Now()
		var err error
		var got int
		if write {
			got, err = sysio.Pwritev(fd, iov, bufs, int64(done)*int64(len(buf)))
		} else {
			got, err = sysio.Preadv(fd, iov, bufs, int64(done)*int64(len(buf)))
		}
		if err == nil && got != len(buf) {
			err = fmt.Errorf("%d of %d bytes", got, len(buf))
		}
		if err != nil {
			return done, 0, 0, err
		}
		times = append(times, time.Since(t0))
	}
	if write {
		if err := sysio.Fdatasync(fd); err != nil {
			return done, 0, 0, err
		}
	}
	total := time.Since(start)
	if done == 0 || total <= 0 {
		return done, 0, 0, errors.New("no I/O completed")
	}
	slices.Sort(times)
	return done, float64(done) * float64(len(buf)) / total.Seconds(), times[len(times)/2], nil
}

// smallIO and smallIOs shape the latency figure: the median of this many
// single I/Os of this size.
const smallIO, smallIOs = 4096, 64

// smallPass times smallIOs single I/Os of small at offsets stride apart
// and returns the median; writes are synced one by one, as a durable
// header is.
func smallPass(ctx context.Context, fd int, small []byte, stride int, write bool) (time.Duration, error) {
	iov := make([]sysio.Iovec, 1)
	bufs := [][]byte{small}
	times := make([]time.Duration, smallIOs)
	for i := range times {
		if err := ctx.Err(); err != nil {
			return 0, err
		}
		off := int64(i) * int64(stride)
		t0 := time.Now()
		var got int
		var err error
		if write {
			if got, err = sysio.Pwritev(fd, iov, bufs, off); err == nil {
				err = sysio.Fdatasync(fd)
			}
		} else {
			got, err = sysio.Preadv(fd, iov, bufs, off)
		}
		if err == nil && got != len(small) {
			err = fmt.Errorf("%d of %d bytes", got, len(small))
		}
		if err != nil {
			return 0, err
		}
		times[i] = time.Since(t0)
	}
	slices.Sort(times)
	return times[len(times)/2], nil
}
