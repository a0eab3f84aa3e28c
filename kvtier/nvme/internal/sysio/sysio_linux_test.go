//go:build linux

package sysio

import (
	"bytes"
	"errors"
	"os"
	"path/filepath"
	"testing"

	"golang.org/x/sys/unix"
)

func TestVectoredRoundTripAndAlign(t *testing.T) {
	for _, direct := range []bool{true, false} {
		dir := t.TempDir()
		dfd, err := OpenDir(dir)
		if err != nil {
			t.Fatal(err)
		}
		defer Close(dfd)
		fd, created, err := OpenAt(dfd, "f", direct)
		if errors.Is(err, unix.EINVAL) {
			t.Skipf("O_DIRECT refused here: %v", err)
		}
		if err != nil {
			t.Fatal(err)
		}
		if !created {
			t.Fatal("OpenAt of a new file says it did not create it")
		}
		a := DirectIOAlign(fd)
		if a.MemBytes < 512 || a.OffsetBytes < 512 || a.Source == "" {
			t.Fatalf("alignment %+v", a)
		}
		if _, err := Fallocate(fd, 1<<20); err != nil {
			t.Fatal(err)
		}
		if n, err := Size(fd); err != nil || n != 1<<20 {
			t.Fatalf("size %d %v", n, err)
		}
		mem, err := AllocAligned(3 * 4096)
		if err != nil {
			t.Fatal(err)
		}
		for i := range mem {
			mem[i] = byte(i * 7)
		}
		iov := make([]Iovec, 0, 4)
		bufs := [][]byte{mem[:4096], mem[4096:8192], nil}
		if n, err := Pwritev(fd, iov, bufs, 8192); err != nil || n != 8192 {
			t.Fatalf("pwritev %d %v", n, err)
		}
		if err := Fdatasync(fd); err != nil {
			t.Fatal(err)
		}
		got := mem[8192:]
		if n, err := Preadv(fd, iov, [][]byte{got}, 12288); err != nil || n != 4096 || !bytes.Equal(got, mem[4096:8192]) {
			t.Fatalf("preadv %d %v", n, err)
		}
		if !direct {
			if err := Fadvise(fd, 0, 1<<20, AdviceDontNeed); err != nil {
				t.Fatal(err)
			}
		}
		if ErrnoName(unix.EIO) != "EIO" || ErrnoName(errors.New("x")) != "" {
			t.Fatal("ErrnoName")
		}
		if err := FreeAligned(mem); err != nil {
			t.Fatal(err)
		}
		if err := Close(fd); err != nil {
			t.Fatal(err)
		}
	}
}

func TestOpenAtRefusesLinksAndLocksOnce(t *testing.T) {
	dir := t.TempDir()
	if err := os.Symlink("/etc/hostname", filepath.Join(dir, "link")); err != nil {
		t.Fatal(err)
	}
	dfd, err := OpenDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	defer Close(dfd)
	if _, _, err := OpenAt(dfd, "link", false); !errors.Is(err, ELOOP) {
		t.Fatalf("OpenAt of a symlink: %v, want ELOOP", err)
	}
	a, _, err := OpenAt(dfd, "lock", false)
	if err != nil {
		t.Fatal(err)
	}
	defer Close(a)
	b, created, err := OpenAt(dfd, "lock", false)
	if err != nil || created {
		t.Fatalf("second OpenAt: created %v, %v", created, err)
	}
	defer Close(b)
	if err := TryLock(a); err != nil {
		t.Fatal(err)
	}
	if err := TryLock(b); !errors.Is(err, ErrLocked) {
		t.Fatalf("second lock: %v, want ErrLocked", err)
	}
	if err := ReplaceContents(a, []byte("42\n")); err != nil {
		t.Fatal(err)
	}
	var buf [8]byte
	if n, err := ReadSmall(b, buf[:]); err != nil || string(buf[:n]) != "42\n" {
		t.Fatalf("ReadSmall: %q %v", buf[:n], err)
	}
	if st, err := Fstat(a); err != nil || !st.Reg || st.UID != Geteuid() || st.Perm != 0o600 {
		t.Fatalf("Fstat: %+v %v", st, err)
	}
}
