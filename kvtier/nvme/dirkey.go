package nvme

import (
	"crypto/rand"
	"fmt"
	"path/filepath"

	"kvtier.dev/kvtier/nvme/internal/sysio"
)

// keyFileName is the file in each directory of Config.Dirs that holds the
// directory's checksum key: dirKeyBytes random bytes, mode 0600, made by
// the first Open. The slot headers of the directory's files are summed
// under it (see checksum), so that a header written by anyone who cannot
// read it, or a slab file brought from another directory, fails its check.
const keyFileName = "kvtier.key"

const dirKeyBytes = 32

// dirKey reads d's key file, or makes it where it is absent or empty (a
// crash between its creation and its write: nothing was summed under it
// then). A key file that group or others may read, or of another size, is
// an error unless reformat, which replaces it: the blocks summed under the
// old key then fail their check and are dropped.
func dirKey(d *slabDir, reformat bool) ([]byte, error) {
	fd, created, perm, err := openFileAt(d, keyFileName, false)
	if err != nil {
		return nil, err
	}
	defer sysio.Close(fd)
	path := filepath.Join(d.path, keyFileName)
	loose := perm&0o077 != 0
	if loose && !reformat {
		return nil, fmt.Errorf("%w: %s may be read or written by group or others (mode %04o): whoever read it can forge the tier's headers; remove it (a new key is made and the blocks summed under the old one are dropped) or set Config.Reformat",
			ErrUnsafeDir, path, perm)
	}
	var buf [dirKeyBytes + 1]byte
	n, err := sysio.ReadSmall(fd, buf[:])
	if err != nil {
		return nil, fmt.Errorf("nvme: read %s: %w", path, err)
	}
	switch {
	case n == dirKeyBytes && !loose:
		return buf[:dirKeyBytes:dirKeyBytes], nil
	case n != 0 && !reformat:
		return nil, fmt.Errorf("%w: %s is %d bytes, want %d: remove it (a new key is made and the blocks summed under the old one are dropped) or set Config.Reformat",
			ErrConfig, path, n, dirKeyBytes)
	}
	key := make([]byte, dirKeyBytes)
	rand.Read(key) // never fails (crypto/rand, Go 1.24+)
	if loose {
		if err := sysio.Fchmod(fd, 0o600); err != nil {
			return nil, fmt.Errorf("nvme: make %s 0600: %w", path, err)
		}
	}
	if err := sysio.ReplaceContents(fd, key); err != nil {
		return nil, fmt.Errorf("nvme: write %s: %w", path, err)
	}
	// The key is on disk before any header is summed under it.
	if err := sysio.Fsync(fd); err != nil {
		return nil, fmt.Errorf("nvme: sync %s: %w", path, err)
	}
	if created {
		if err := sysio.Fsync(d.fd); err != nil {
			return nil, fmt.Errorf("nvme: sync directory %s: %w", d.path, err)
		}
	}
	return key, nil
}
