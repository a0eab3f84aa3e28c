package nvme

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	"kvtier.dev/kvtier/nvme/internal/sysio"
)

// lockFileName is the lock file in each directory of Config.Dirs. It holds
// the pid of the process whose Store has the directory open.
const lockFileName = "kvtier.lock"

// slabDir is one directory of Config.Dirs, held open for the Store's life:
// every file in it is opened relative to fd, so that the directory checked
// at Open is the one used, whatever happens to its path later.
type slabDir struct {
	index  int // in Config.Dirs
	path   string
	fd     int
	lockFD int
}

// openDirs opens, checks and locks every directory of cfg. On error it
// releases what it took.
func openDirs(cfg *Config) (dirs []*slabDir, err error) {
	defer func() {
		if err != nil {
			closeDirs(dirs)
			dirs = nil
		}
	}()
	for i, p := range cfg.Dirs {
		d, err := openDir(i, p)
		if err != nil {
			return dirs, err
		}
		dirs = append(dirs, d)
	}
	return dirs, nil
}

// openDir creates path with mode 0700 if it is absent (its parent must
// exist), refuses it if another user owns it or group or others may write
// it, and takes its lock.
func openDir(i int, path string) (_ *slabDir, err error) {
	field := fmt.Sprintf("Config.Dirs[%d] %q", i, path)
	if err := os.Mkdir(path, 0o700); err != nil && !errors.Is(err, fs.ErrExist) {
		return nil, fmt.Errorf("%w: %s: %w", ErrConfig, field, err)
	}
	d := &slabDir{index: i, path: path, fd: -1, lockFD: -1}
	defer func() {
		if err != nil {
			d.close()
		}
	}()
	if d.fd, err = sysio.OpenDir(path); err != nil {
		return nil, fmt.Errorf("%w: %s: %w", ErrConfig, field, err)
	}
	st, err := sysio.Fstat(d.fd)
	if err != nil {
		return nil, fmt.Errorf("nvme: %s: %w", field, err)
	}
	if uid := sysio.Geteuid(); st.UID != uid {
		return nil, fmt.Errorf("%w: %s is owned by uid %d, not by this process's user (uid %d): blocks read from it go to the GPU, so only this user may own it",
			ErrUnsafeDir, field, st.UID, uid)
	}
	if st.Perm&0o022 != 0 {
		return nil, fmt.Errorf("%w: %s is writable by group or others (mode %04o): run chmod go-w on it, or name a directory of its own (e.g. /var/tmp/kvtier, not /var/tmp)",
			ErrUnsafeDir, field, st.Perm)
	}
	if d.lockFD, _, err = openFileAt(d, lockFileName, false); err != nil {
		return nil, err
	}
	if err := sysio.TryLock(d.lockFD); err != nil {
		if errors.Is(err, sysio.ErrLocked) {
			return nil, fmt.Errorf("%w: %s is in use by %s (it holds %s): one Store per directory at a time",
				ErrLocked, field, holder(d.lockFD), filepath.Join(path, lockFileName))
		}
		return nil, fmt.Errorf("nvme: lock %s: %w", filepath.Join(path, lockFileName), err)
	}
	if err := sysio.ReplaceContents(d.lockFD, []byte(strconv.Itoa(os.Getpid())+"\n")); err != nil {
		return nil, fmt.Errorf("nvme: write pid to %s: %w", filepath.Join(path, lockFileName), err)
	}
	return d, nil
}

// holder names the process that the lock file says holds the lock.
func holder(fd int) string {
	var buf [32]byte
	n, err := sysio.ReadSmall(fd, buf[:])
	pid, perr := strconv.Atoi(strings.TrimSpace(string(buf[:max(n, 0)])))
	if err != nil || perr != nil || pid <= 0 {
		return "another process (its pid is not written yet)"
	}
	return fmt.Sprintf("process %d", pid)
}

// openFileAt opens the regular file name in d, creating it if absent
// (created says so), with O_NOFOLLOW: a symbolic link, or anything but a
// regular file of this user, is refused with ErrUnsafeDir.
func openFileAt(d *slabDir, name string, direct bool) (fd int, created bool, err error) {
	path := filepath.Join(d.path, name)
	fd, created, err = sysio.OpenAt(d.fd, name, direct)
	if errors.Is(err, sysio.ELOOP) {
		return -1, false, fmt.Errorf("%w: %s is a symbolic link: the tier follows none (remove it)", ErrUnsafeDir, path)
	}
	if err != nil {
		return -1, false, fmt.Errorf("nvme: %s: %w", path, err)
	}
	st, err := sysio.Fstat(fd)
	if err == nil && (!st.Reg || st.UID != sysio.Geteuid()) {
		err = fmt.Errorf("%w: %s is not a regular file of this user (uid %d, regular %v)", ErrUnsafeDir, path, st.UID, st.Reg)
	}
	if err != nil {
		_ = sysio.Close(fd)
		if created {
			_ = sysio.UnlinkAt(d.fd, name)
		}
		return -1, false, err
	}
	return fd, created, nil
}

// close releases the lock and the directory.
func (d *slabDir) close() error {
	var errs []error
	for _, fd := range []int{d.lockFD, d.fd} {
		if fd >= 0 {
			if err := sysio.Close(fd); err != nil {
				errs = append(errs, fmt.Errorf("nvme: close %s: %w", d.path, err))
			}
		}
	}
	d.lockFD, d.fd = -1, -1
	return errors.Join(errs...)
}

func closeDirs(dirs []*slabDir) error {
	var errs []error
	for _, d := range dirs {
		errs = append(errs, d.close())
	}
	return errors.Join(errs...)
}
