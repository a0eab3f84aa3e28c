package openai

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"io"
)

// DoneData is the data of the event that ends a stream.
const DoneData = "[DONE]"

// AppendEvent appends a server-sent event carrying data to dst and returns
// it: "data: " + data + "\n\n". data MUST NOT contain a newline (JSON from
// encoding/json never does).
func AppendEvent(dst, data []byte) []byte {
	dst = append(dst, "data: "...)
	dst = append(dst, data...)
	return append(dst, '\n', '\n')
}

// EventReader reads server-sent events, keeping only their data: the
// "data" fields of one event joined by newlines. Comments, and the event,
// id and retry fields, are skipped; lines end in LF or CRLF (a lone CR,
// which the SSE specification also allows, is an error here).
type EventReader struct {
	r    *bufio.Reader
	data []byte
}

// MaxEventBytes bounds one event's data.
const MaxEventBytes = 16 << 20

// NewEventReader returns an EventReader over r.
func NewEventReader(r io.Reader) *EventReader {
	return &EventReader{r: bufio.NewReaderSize(r, 64<<10)}
}

// Next returns the next event's data, valid until the next call. It returns
// io.EOF at the end of the stream; an event cut off by the end of the
// stream is io.ErrUnexpectedEOF.
func (e *EventReader) Next() ([]byte, error) {
	e.data = e.data[:0]
	have := false
	for {
		line, err := e.line()
		if err == io.EOF {
			if have {
				return nil, io.ErrUnexpectedEOF
			}
			return nil, io.EOF
		}
		if err != nil {
			return nil, err
		}
		if len(line) == 0 {
			if have {
				return e.data, nil
			}
			continue
		}
		if line[0] == ':' {
			continue
		}
		name, value, _ := bytes.Cut(line, []byte{':'})
		value = bytes.TrimPrefix(value, []byte{' '})
		if string(name) != "data" {
			continue
		}
		if have {
			e.data = append(e.data, '\n')
		}
		if len(e.data)+len(value) > MaxEventBytes {
			return nil, fmt.Errorf("sse: event over %d bytes", MaxEventBytes)
		}
		e.data = append(e.data, value...)
		have = true
	}
}

// line reads one line without its end (LF, CRLF or CR).
func (e *EventReader) line() ([]byte, error) {
	var out []byte
	for {
		b, err := e.r.ReadSlice('\n')
		if err == bufio.ErrBufferFull {
			out = append(out, b...)
			if len(out) > MaxEventBytes {
				return nil, fmt.Errorf("sse: line over %d bytes", MaxEventBytes)
			}
			continue
		}
		if out != nil {
			out = append(out, b...)
			b = out
		}
		if err == io.EOF && len(b) > 0 {
			err = nil // a last line without its end
		}
		if err != nil {
			return nil, err
		}
		b = bytes.TrimSuffix(b, []byte{'\n'})
		b = bytes.TrimSuffix(b, []byte{'\r'})
		if bytes.IndexByte(b, '\r') >= 0 {
			return nil, errors.New("sse: lone CR line endings are not supported")
		}
		return b, nil
	}
}
