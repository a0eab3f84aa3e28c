package nvme

import (
	"sync"

	"kvtier.dev/kvtier/nvme/internal/sysio"
)

// Advice is a page-cache hint, used only in buffered mode.
type Advice int

const (
	// AdviceDontNeed drops a range from the page cache once written back.
	AdviceDontNeed Advice = iota
	// AdviceWillNeed starts readahead of a range.
	AdviceWillNeed
)

// File is what the Store needs from a slab file. The Store opens real files;
// tests wrap them (Config.WrapFile) to inject faults. Implementations MUST be
// safe for concurrent use, like pread and pwrite.
type File interface {
	// ReadAtv fills bufs, in order, from the bytes at off, with one preadv.
	// It returns the number of bytes read; fewer than asked with a nil error
	// is a short read.
	ReadAtv(bufs [][]byte, off int64) (int, error)
	// WriteAtv writes bufs, in order, at off, with one pwritev.
	WriteAtv(bufs [][]byte, off int64) (int, error)
	// Datasync makes written data durable (fdatasync).
	Datasync() error
	// Advise passes a page-cache hint for [off, off+length).
	Advise(off, length int64, advice Advice) error
	// Close releases the file.
	Close() error
}

// osFile is a File on a file descriptor.
type osFile struct {
	fd   int
	iovs sync.Pool // of *[]sysio.Iovec, so that calls allocate nothing
}

func newOSFile(fd int) *osFile {
	f := &osFile{fd: fd}
	f.iovs.New = func() any { v := make([]sysio.Iovec, 0, 64); return &v }
	return f
}

func (f *osFile) ReadAtv(bufs [][]byte, off int64) (int, error) {
	iov := f.iovs.Get().(*[]sysio.Iovec)
	if cap(*iov) < len(bufs) {
		*iov = make([]sysio.Iovec, 0, len(bufs))
	}
	n, err := sysio.Preadv(f.fd, *iov, bufs, off)
	f.iovs.Put(iov)
	return n, err
}

func (f *osFile) WriteAtv(bufs [][]byte, off int64) (int, error) {
	iov := f.iovs.Get().(*[]sysio.Iovec)
	if cap(*iov) < len(bufs) {
		*iov = make([]sysio.Iovec, 0, len(bufs))
	}
	n, err := sysio.Pwritev(f.fd, *iov, bufs, off)
	f.iovs.Put(iov)
	return n, err
}

func (f *osFile) Datasync() error { return sysio.Fdatasync(f.fd) }

func (f *osFile) Advise(off, length int64, advice Advice) error {
	a := sysio.AdviceDontNeed
	if advice == AdviceWillNeed {
		a = sysio.AdviceWillNeed
	}
	return sysio.Fadvise(f.fd, off, length, a)
}

func (f *osFile) Close() error { return sysio.Close(f.fd) }
