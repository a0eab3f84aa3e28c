package trace

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"io"
	"math"
	"strconv"
	"time"
)

// LineError is a malformed trace line: which line (from 1), which field
// ("" when the line is not a JSON object at all) and what is wrong.
type LineError struct {
	Name  string // the trace's name, from Options.Name; may be ""
	Line  int
	Field string
	Msg   string
}

func (e *LineError) Error() string {
	name := e.Name
	if name == "" {
		name = "trace"
	}
	if e.Field == "" {
		return fmt.Sprintf("%s:%d: %s", name, e.Line, e.Msg)
	}
	return fmt.Sprintf("%s:%d: %s: %s", name, e.Line, e.Field, e.Msg)
}

// Options configures a Reader. The zero value reads either format, stops at
// the first bad line and reads Mooncake ids as 512-token blocks.
type Options struct {
	// Format is the trace's format; FormatAuto tells it from the first line.
	Format Format
	// Name names the trace in errors, e.g. "mooncake.jsonl".
	Name string
	// SkipBad skips malformed lines, counting them, instead of stopping at
	// the first one.
	SkipBad bool
	// MooncakeBlockTokens is the number of tokens a Mooncake hash id stands
	// for; 0 means MooncakeBlockTokens (512).
	MooncakeBlockTokens int
	// MaxLineBytes bounds a line's length; 0 means 64 MiB. A longer line is
	// an error (a trace without newlines is not a trace).
	MaxLineBytes int
}

// maxKeptErrors is how many skipped lines' errors a Reader keeps.
const maxKeptErrors = 16

// Reader reads a trace one request at a time. It holds one line in memory,
// never the trace, and allocates nothing per line once its buffers have
// grown to the longest line. A Reader is not safe for concurrent use.
type Reader struct {
	opts   Options
	in     *bufio.Reader
	long   []byte // a line longer than in's buffer
	format Format
	line   int
	eof    bool

	scan   scanner
	raw    rawLine
	hasher KeyHasher

	lastArrival time.Duration
	requests    int
	skipped     int
	kept        []*LineError
}

// NewReader returns a Reader of the trace in r.
func NewReader(r io.Reader, opts Options) *Reader {
	if opts.MooncakeBlockTokens <= 0 {
		opts.MooncakeBlockTokens = MooncakeBlockTokens
	}
	if opts.MaxLineBytes <= 0 {
		opts.MaxLineBytes = 64 << 20
	}
	return &Reader{opts: opts, in: bufio.NewReaderSize(r, 64<<10), format: opts.Format}
}

// Format returns the trace's format: Options.Format, or once the first
// request has been read, the format told from it.
func (r *Reader) Format() Format { return r.format }

// Line returns the number of the line last read.
func (r *Reader) Line() int { return r.line }

// Requests returns the number of requests read so far.
func (r *Reader) Requests() int { return r.requests }

// Skipped returns the number of malformed lines skipped (Options.SkipBad).
func (r *Reader) Skipped() int { return r.skipped }

// SkippedErrors returns the errors of the first skipped lines (at most 16).
func (r *Reader) SkippedErrors() []*LineError { return r.kept }

// Next reads the next request into req. It returns io.EOF after the last
// one, and a *LineError for a malformed line unless Options.SkipBad is set.
// On an error req is left as it was. Blank lines are ignored.
func (r *Reader) Next(req *Request) error {
	for {
		line, err := r.readLine()
		if err != nil {
			return err
		}
		if len(bytes.TrimSpace(line)) == 0 {
			continue
		}
		lerr := r.parse(line, req)
		if lerr == nil {
			r.requests++
			return nil
		}
		lerr.Name, lerr.Line = r.opts.Name, r.line
		if !r.opts.SkipBad {
			return lerr
		}
		r.skipped++
		if len(r.kept) < maxKeptErrors {
			r.kept = append(r.kept, lerr)
		}
	}
}

// readLine returns the next line without its newline, valid until the next
// call. It returns io.EOF when no line is left.
func (r *Reader) readLine() ([]byte, error) {
	if r.eof {
		return nil, io.EOF
	}
	r.long = r.long[:0]
	for {
		frag, err := r.in.ReadSlice('\n')
		switch {
		case err == nil:
			r.line++
			if len(r.long) > 0 {
				r.long = append(r.long, frag...)
				frag = r.long
			}
			return bytes.TrimSuffix(frag[:len(frag)-1], []byte{'\r'}), nil
		case errors.Is(err, bufio.ErrBufferFull):
			r.long = append(r.long, frag...)
			if len(r.long) > r.opts.MaxLineBytes {
				return nil, &LineError{Name: r.opts.Name, Line: r.line + 1,
					Msg: "line longer than " + strconv.Itoa(r.opts.MaxLineBytes) + " bytes"}
			}
		case errors.Is(err, io.EOF):
			r.eof = true
			r.long = append(r.long, frag...)
			if len(r.long) == 0 {
				return nil, io.EOF
			}
			r.line++
			return bytes.TrimSuffix(r.long, []byte{'\r'}), nil
		default:
			return nil, fmt.Errorf("trace: reading line %d: %w", r.line+1, err)
		}
	}
}

// parse reads one line into req, which it changes only on success.
func (r *Reader) parse(line []byte, req *Request) *LineError {
	l := &r.raw
	if ferr := parseLine(&r.scan, line, fieldsOf(r.format), l); ferr != nil {
		return &LineError{Field: ferr.field, Msg: ferr.msg}
	}
	format := r.format
	if format == FormatAuto {
		switch {
		case l.has&mooncakeFields != 0 && l.has&nativeFields != 0:
			return &LineError{Msg: "mixes Mooncake fields (timestamp, input_length, output_length, hash_ids) " +
				"with native ones (arrival_us, ...): cannot tell the format"}
		case l.has&mooncakeFields != 0:
			format = FormatMooncake
		case l.has&nativeFields != 0:
			format = FormatNative
		default:
			return &LineError{Msg: "cannot tell the format: want hash_ids (Mooncake) or arrival_us (native)"}
		}
	}
	var arrival time.Duration
	var lerr *LineError
	if format == FormatMooncake {
		arrival, lerr = r.checkMooncake(l)
	} else {
		arrival, lerr = r.checkNative(l)
	}
	if lerr != nil {
		return lerr
	}
	if arrival < r.lastArrival {
		f := fieldTimestamp
		if format == FormatNative {
			f = fieldArrivalUS
		}
		return &LineError{Field: f.String(), Msg: fmt.Sprintf(
			"arrival %v is before the previous request's %v: a trace is in arrival order", arrival, r.lastArrival)}
	}
	r.format = format
	r.lastArrival = arrival
	r.fill(format, arrival, l, req)
	return nil
}

func missing(f field) *LineError { return &LineError{Field: f.String(), Msg: "missing"} }

func (r *Reader) checkMooncake(l *rawLine) (time.Duration, *LineError) {
	for _, f := range [...]field{fieldTimestamp, fieldInputLength, fieldOutputLength, fieldHashIDs} {
		if !l.has.has(f) {
			return 0, missing(f)
		}
	}
	for _, f := range [...]field{fieldTimestamp, fieldInputLength, fieldOutputLength} {
		if l.num[f] < 0 {
			return 0, &LineError{Field: f.String(), Msg: "negative: " + strconv.FormatInt(l.num[f], 10)}
		}
	}
	if ms := l.num[fieldTimestamp]; ms > math.MaxInt64/int64(time.Millisecond) {
		return 0, &LineError{Field: fieldTimestamp.String(), Msg: strconv.FormatInt(ms, 10) + " ms is too large"}
	}
	if l.num[fieldInputLength] > math.MaxInt32 || l.num[fieldOutputLength] > math.MaxInt32 {
		return 0, &LineError{Field: "input_length", Msg: "lengths must be below 2^31 tokens"}
	}
	in, bt := int(l.num[fieldInputLength]), r.opts.MooncakeBlockTokens
	if want := NumBlocks(in, bt); len(l.ids) != want {
		return 0, &LineError{Field: fieldHashIDs.String(), Msg: fmt.Sprintf(
			"has %d ids, but input_length %d needs ceil(%d/%d) = %d", len(l.ids), in, in, bt, want)}
	}
	return time.Duration(l.num[fieldTimestamp]) * time.Millisecond, nil
}

func (r *Reader) checkNative(l *rawLine) (time.Duration, *LineError) {
	for _, f := range [...]field{fieldArrivalUS, fieldBlockTokens, fieldOutputTokens} {
		if !l.has.has(f) {
			return 0, missing(f)
		}
	}
	for _, f := range [...]field{fieldArrivalUS, fieldInputTokens, fieldOutputTokens} {
		if l.num[f] < 0 {
			return 0, &LineError{Field: f.String(), Msg: "negative: " + strconv.FormatInt(l.num[f], 10)}
		}
	}
	if us := l.num[fieldArrivalUS]; us > math.MaxInt64/int64(time.Microsecond) {
		return 0, &LineError{Field: fieldArrivalUS.String(), Msg: strconv.FormatInt(us, 10) + " us is too large"}
	}
	if bt := l.num[fieldBlockTokens]; bt < 1 || bt > MaxBlockTokens {
		return 0, &LineError{Field: fieldBlockTokens.String(), Msg: strconv.FormatInt(bt, 10) + " is not in [1, 65536]"}
	}
	if l.num[fieldInputTokens] > math.MaxInt32 || l.num[fieldOutputTokens] > math.MaxInt32 {
		return 0, &LineError{Field: "input_tokens", Msg: "lengths must be below 2^31 tokens"}
	}
	bt := int(l.num[fieldBlockTokens])
	switch hasKeys, hasTokens := l.has.has(fieldKeys), l.has.has(fieldTokens); {
	case hasKeys && hasTokens:
		return 0, &LineError{Field: fieldKeys.String(), Msg: "give keys or tokens, not both"}
	case !hasKeys && !hasTokens:
		return 0, &LineError{Field: fieldKeys.String(), Msg: "missing (give keys or tokens)"}
	case hasKeys:
		if !l.has.has(fieldInputTokens) {
			return 0, missing(fieldInputTokens)
		}
		in := int(l.num[fieldInputTokens])
		if want := NumBlocks(in, bt); len(l.ids) != want {
			return 0, &LineError{Field: fieldKeys.String(), Msg: fmt.Sprintf(
				"has %d keys, but input_tokens %d needs ceil(%d/%d) = %d", len(l.ids), in, in, bt, want)}
		}
	default:
		if l.has.has(fieldInputTokens) && int(l.num[fieldInputTokens]) != len(l.tokens) {
			return 0, &LineError{Field: fieldInputTokens.String(), Msg: fmt.Sprintf(
				"is %d, but tokens has %d", l.num[fieldInputTokens], len(l.tokens))}
		}
	}
	return time.Duration(l.num[fieldArrivalUS]) * time.Microsecond, nil
}

// fill copies a checked line into req.
func (r *Reader) fill(format Format, arrival time.Duration, l *rawLine, req *Request) {
	req.Arrival = arrival
	if format == FormatMooncake {
		req.Salt = 0
		req.InputTokens = int(l.num[fieldInputLength])
		req.OutputTokens = int(l.num[fieldOutputLength])
		req.BlockTokens = r.opts.MooncakeBlockTokens
		req.Keys = append(req.Keys[:0], l.ids...)
		req.Tokens = req.Tokens[:0]
		return
	}
	req.Salt = l.salt
	req.OutputTokens = int(l.num[fieldOutputTokens])
	req.BlockTokens = int(l.num[fieldBlockTokens])
	if l.has.has(fieldTokens) {
		req.InputTokens = len(l.tokens)
		req.Tokens = append(req.Tokens[:0], l.tokens...)
		req.Keys = r.hasher.AppendKeys(req.Keys[:0], req.Salt, req.Tokens, req.BlockTokens)
		return
	}
	req.InputTokens = int(l.num[fieldInputTokens])
	req.Keys = append(req.Keys[:0], l.ids...)
	req.Tokens = req.Tokens[:0]
}
