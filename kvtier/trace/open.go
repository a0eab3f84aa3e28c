package trace

import (
	"bufio"
	"compress/gzip"
	"fmt"
	"io"
	"os"
)

// File is a trace file opened for reading, gzip-compressed or not.
type File struct {
	f  *os.File
	zr *gzip.Reader
	r  io.Reader
}

// Open opens a trace file; a gzip-compressed one (told by its magic bytes,
// whatever its name) is decompressed as it is read.
func Open(path string) (*File, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("trace: %w", err)
	}
	br := bufio.NewReaderSize(f, 64<<10)
	magic, _ := br.Peek(2)
	tf := &File{f: f, r: br}
	if len(magic) == 2 && magic[0] == 0x1f && magic[1] == 0x8b {
		if tf.zr, err = gzip.NewReader(br); err != nil {
			f.Close()
			return nil, fmt.Errorf("trace: %s: %w", path, err)
		}
		tf.r = tf.zr
	}
	return tf, nil
}

// Read reads the trace's (decompressed) bytes.
func (f *File) Read(p []byte) (int, error) { return f.r.Read(p) }

// Close closes the file.
func (f *File) Close() error {
	if f.zr != nil {
		f.zr.Close()
	}
	return f.f.Close()
}
