package nvme

import (
	"errors"
	"fmt"
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
	key    []byte // the directory's checksum key (keyFileName)
}

// openDirs opens, checks and locks every directory of cfg, and reads (or
// makes) each one's checksum key. On error it
// releases what it took.
func openDirs(cfg *Config) (dirs []*slabDir, err error) {
	defer func() {
		if err != nil {
			closeDirs(dirs)
			dirs = nil
		}
	}()
	for i, p := range cfg.Dirs {
		d, err := openDir(i, p, cfg.Reformat)
		if err != nil {
			return dirs, err
		}
		dirs = append(dirs, d)
	}
	return dirs, nil
}

// openDir creates path with mode 0700 if it is absent (its parent must
// exist), refuses it if it is a symbolic link, if another user owns it or
// group or others may write it, or if its parent could be changed by
// another user, and takes its lock and its checksum key. reformat replaces
// a key file the tier cannot use (Config.Reformat).
func openDir(i int, path string, reformat bool) (_ *slabDir, err error) {
	field := fmt.Sprintf("Config.Dirs[%d] %q", i, path)
	d := &slabDir{index: i, path: path, fd: -1, lockFD: -1}
	defer func() {
		if err != nil {
			d.close()
		}
	}()
	if d.fd, err = openDirNoFollow(field, path); err != nil {
		return nil, err
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
	var perm uint32
	if d.lockFD, _, perm, err = openFileAt(d, lockFileName, false); err != nil {
		return nil, err
	}
	if perm&0o077 != 0 {
		// It holds a pid, nothing the tier trusts; but whoever can open it
		// can hold its lock and keep every Store out.
		if err := sysio.Fchmod(d.lockFD, 0o600); err != nil {
			return nil, fmt.Errorf("nvme: make %s 0600: %w", filepath.Join(path, lockFileName), err)
		}
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
	if d.key, err = dirKey(d, reformat); err != nil {
		return nil, err
	}
	return d, nil
}

// openDirNoFollow opens the directory path, creating it with mode 0700 if
// it is absent, through its parent: the parent must be this user's or
// root's and, unless its sticky bit is set, writable by no one else
// (whoever can write it can swap the directory for another), and path's
// last component must not be a symbolic link (O_NOFOLLOW).
func openDirNoFollow(field, path string) (int, error) {
	abs, err := filepath.Abs(path)
	if err != nil {
		return -1, fmt.Errorf("%w: %s: %w", ErrConfig, field, err)
	}
	parent, base := filepath.Dir(abs), filepath.Base(abs)
	if parent == abs {
		return -1, fmt.Errorf("%w: %s is the root directory: name a directory of the tier's own", ErrConfig, field)
	}
	pfd, err := sysio.OpenDir(parent)
	if err != nil {
		return -1, fmt.Errorf("%w: %s: its parent: %w", ErrConfig, field, err)
	}
	defer sysio.Close(pfd)
	pst, err := sysio.Fstat(pfd)
	if err != nil {
		return -1, fmt.Errorf("nvme: %s: its parent %s: %w", field, parent, err)
	}
	if uid := sysio.Geteuid(); pst.UID != uid && pst.UID != 0 {
		return -1, fmt.Errorf("%w: %s: its parent %s is owned by uid %d, neither this process's user (uid %d) nor root: its owner could swap the directory for another",
			ErrUnsafeDir, field, parent, pst.UID, uid)
	}
	if pst.Perm&0o022 != 0 && !pst.Sticky {
		return -1, fmt.Errorf("%w: %s: its parent %s is writable by group or others without the sticky bit (mode %04o): anyone who can write it can swap the directory for another; put the tier in a directory of this user's",
			ErrUnsafeDir, field, parent, pst.Perm)
	}
	if err := sysio.MkdirAt(pfd, base, 0o700); err != nil {
		return -1, fmt.Errorf("%w: %s: %w", ErrConfig, field, err)
	}
	fd, err := sysio.OpenDirAt(pfd, base)
	switch {
	case errors.Is(err, sysio.ELOOP) || errors.Is(err, sysio.ENOTDIR) && sysio.IsLinkAt(pfd, base):
		return -1, fmt.Errorf("%w: %s is a symbolic link: the tier follows none (whoever planted it would choose where the slab files go); name the directory itself", ErrUnsafeDir, field)
	case errors.Is(err, sysio.ENOTDIR):
		return -1, fmt.Errorf("%w: %s is not a directory", ErrConfig, field)
	case err != nil:
		return -1, fmt.Errorf("%w: %s: %w", ErrConfig, field, err)
	}
	return fd, nil
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
// (created says so) with mode 0600, with O_NOFOLLOW: a symbolic link, or
// anything but a regular file of this user, is refused with ErrUnsafeDir.
// perm is its permission bits; the caller decides what group or others'
// bits mean for the file.
func openFileAt(d *slabDir, name string, direct bool) (fd int, created bool, perm uint32, err error) {
	path := filepath.Join(d.path, name)
	fd, created, err = sysio.OpenAt(d.fd, name, direct)
	if errors.Is(err, sysio.ELOOP) {
		return -1, false, 0, fmt.Errorf("%w: %s is a symbolic link: the tier follows none (remove it)", ErrUnsafeDir, path)
	}
	if err != nil {
		return -1, false, 0, fmt.Errorf("nvme: %s: %w", path, err)
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
		return -1, false, 0, err
	}
	return fd, created, st.Perm, nil
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
