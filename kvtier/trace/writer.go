package trace

import (
	"bufio"
	"fmt"
	"io"
	"strconv"
)

// AppendMooncake appends req as one Mooncake line (with its newline) to dst.
// Arrival is written in whole milliseconds, rounded down; Salt and Tokens
// are not part of the format and are dropped.
func AppendMooncake(dst []byte, req *Request) []byte {
	dst = append(dst, `{"timestamp": `...)
	dst = strconv.AppendInt(dst, req.Arrival.Milliseconds(), 10)
	dst = append(dst, `, "input_length": `...)
	dst = strconv.AppendInt(dst, int64(req.InputTokens), 10)
	dst = append(dst, `, "output_length": `...)
	dst = strconv.AppendInt(dst, int64(req.OutputTokens), 10)
	dst = append(dst, `, "hash_ids": [`...)
	for i, k := range req.Keys {
		if i > 0 {
			dst = append(dst, ", "...)
		}
		dst = strconv.AppendUint(dst, k, 10)
	}
	return append(dst, "]}\n"...)
}

// AppendNative appends req as one native line (with its newline) to dst.
// Arrival is written in whole microseconds, rounded down. The line gives
// token ids when req has them, keys otherwise.
func AppendNative(dst []byte, req *Request) []byte {
	dst = append(dst, `{"arrival_us":`...)
	dst = strconv.AppendInt(dst, req.Arrival.Microseconds(), 10)
	dst = append(dst, `,"salt":`...)
	dst = strconv.AppendUint(dst, req.Salt, 10)
	dst = append(dst, `,"block_tokens":`...)
	dst = strconv.AppendInt(dst, int64(req.BlockTokens), 10)
	dst = append(dst, `,"input_tokens":`...)
	dst = strconv.AppendInt(dst, int64(req.InputTokens), 10)
	dst = append(dst, `,"output_tokens":`...)
	dst = strconv.AppendInt(dst, int64(req.OutputTokens), 10)
	if len(req.Tokens) > 0 {
		dst = append(dst, `,"tokens":[`...)
		for i, t := range req.Tokens {
			if i > 0 {
				dst = append(dst, ',')
			}
			dst = strconv.AppendInt(dst, int64(t), 10)
		}
	} else {
		dst = append(dst, `,"keys":[`...)
		for i, k := range req.Keys {
			if i > 0 {
				dst = append(dst, ',')
			}
			dst = strconv.AppendUint(dst, k, 10)
		}
	}
	return append(dst, "]}\n"...)
}

// Writer writes requests as trace lines, buffered: call Flush at the end.
type Writer struct {
	w      *bufio.Writer
	format Format
	line   []byte
}

// NewWriter returns a Writer of format (FormatMooncake or FormatNative).
func NewWriter(w io.Writer, format Format) (*Writer, error) {
	if format != FormatMooncake && format != FormatNative {
		return nil, fmt.Errorf("trace: cannot write format %v: want mooncake or native", format)
	}
	return &Writer{w: bufio.NewWriterSize(w, 64<<10), format: format}, nil
}

// Write writes one request.
func (w *Writer) Write(req *Request) error {
	if w.format == FormatMooncake {
		w.line = AppendMooncake(w.line[:0], req)
	} else {
		w.line = AppendNative(w.line[:0], req)
	}
	_, err := w.w.Write(w.line)
	return err
}

// Flush writes what is buffered.
func (w *Writer) Flush() error { return w.w.Flush() }
