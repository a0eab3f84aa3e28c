package trace

import (
	"math"
	"strconv"
)

// field is one field name the trace formats know.
type field uint8

const (
	// Mooncake.
	fieldTimestamp field = iota
	fieldInputLength
	fieldOutputLength
	fieldHashIDs
	// Native.
	fieldArrivalUS
	fieldSalt
	fieldBlockTokens
	fieldInputTokens
	fieldOutputTokens
	fieldKeys
	fieldTokens
	numFields
)

var fieldNames = [numFields]string{
	fieldTimestamp:    "timestamp",
	fieldInputLength:  "input_length",
	fieldOutputLength: "output_length",
	fieldHashIDs:      "hash_ids",
	fieldArrivalUS:    "arrival_us",
	fieldSalt:         "salt",
	fieldBlockTokens:  "block_tokens",
	fieldInputTokens:  "input_tokens",
	fieldOutputTokens: "output_tokens",
	fieldKeys:         "keys",
	fieldTokens:       "tokens",
}

func (f field) String() string { return fieldNames[f] }

type fieldMask uint16

func (m fieldMask) has(f field) bool { return m&(1<<f) != 0 }

const (
	mooncakeFields fieldMask = 1<<fieldTimestamp | 1<<fieldInputLength | 1<<fieldOutputLength | 1<<fieldHashIDs
	nativeFields   fieldMask = 1<<fieldArrivalUS | 1<<fieldSalt | 1<<fieldBlockTokens | 1<<fieldInputTokens |
		1<<fieldOutputTokens | 1<<fieldKeys | 1<<fieldTokens
)

// fieldsOf returns the fields a format reads; the others are skipped like
// unknown fields. FormatAuto reads both, to tell which one a line is.
func fieldsOf(f Format) fieldMask {
	switch f {
	case FormatMooncake:
		return mooncakeFields
	case FormatNative:
		return nativeFields
	}
	return mooncakeFields | nativeFields
}

func lookupField(name []byte, want fieldMask) (field, bool) {
	var f field
	switch string(name) {
	case "timestamp":
		f = fieldTimestamp
	case "input_length":
		f = fieldInputLength
	case "output_length":
		f = fieldOutputLength
	case "hash_ids":
		f = fieldHashIDs
	case "arrival_us":
		f = fieldArrivalUS
	case "salt":
		f = fieldSalt
	case "block_tokens":
		f = fieldBlockTokens
	case "input_tokens":
		f = fieldInputTokens
	case "output_tokens":
		f = fieldOutputTokens
	case "keys":
		f = fieldKeys
	case "tokens":
		f = fieldTokens
	default:
		return 0, false
	}
	return f, want.has(f)
}

// rawLine is one line's fields as written, before the format's rules are
// checked. Its slices are reused from line to line.
type rawLine struct {
	has    fieldMask
	num    [numFields]int64 // the scalar fields but salt
	salt   uint64
	ids    []uint64 // hash_ids or keys
	tokens []int32
}

// fieldError is what is wrong with one field of a line.
type fieldError struct {
	field string
	msg   string
}

// parseLine reads one JSON object into l, reading the fields in want and
// skipping any other. It allocates nothing on success once l's slices have
// grown.
func parseLine(s *scanner, buf []byte, want fieldMask, l *rawLine) *fieldError {
	s.buf, s.pos = buf, 0
	l.has = 0
	l.salt = 0
	l.ids = l.ids[:0]
	l.tokens = l.tokens[:0]
	if err := s.expect('{', "a JSON object"); err != nil {
		return badJSON(err)
	}
	if s.peek() == '}' {
		s.pos++
		return s.end()
	}
	for {
		name, serr := s.readString()
		if serr != nil {
			return badJSON(serr)
		}
		if serr := s.expect(':', "':'"); serr != nil {
			return badJSON(serr)
		}
		f, ok := lookupField(name, want)
		if !ok {
			if serr := s.skipValue(1); serr != nil {
				return badJSON(serr)
			}
		} else if ferr := s.readField(f, l); ferr != nil {
			return ferr
		}
		switch s.peek() {
		case ',':
			s.pos++
		case '}':
			s.pos++
			return s.end()
		default:
			return badJSON(s.expect('}', "',' or '}'"))
		}
	}
}

func (s *scanner) end() *fieldError {
	if s.skipSpace(); s.pos < len(s.buf) {
		return badJSON(s.fail("text after the JSON object"))
	}
	return nil
}

func badJSON(e *scanError) *fieldError {
	return &fieldError{msg: "bad JSON at byte " + strconv.Itoa(e.pos+1) + ": " + e.msg}
}

func (s *scanner) readField(f field, l *rawLine) *fieldError {
	if s.isNull() {
		return &fieldError{field: f.String(), msg: "is null"}
	}
	l.has |= 1 << f
	switch f {
	case fieldHashIDs, fieldKeys:
		l.ids = l.ids[:0]
		return s.readArray(f, func(text []byte) *fieldError {
			v, ok := parseUint(text)
			if !ok {
				return &fieldError{field: f.String(), msg: "id " + string(text) + " is not an integer in [0, 2^64)"}
			}
			l.ids = append(l.ids, v)
			return nil
		})
	case fieldTokens:
		l.tokens = l.tokens[:0]
		return s.readArray(f, func(text []byte) *fieldError {
			v, ok := parseUint(text)
			if !ok || v > math.MaxInt32 {
				return &fieldError{field: f.String(), msg: "token id " + string(text) + " is not an integer in [0, 2^31)"}
			}
			l.tokens = append(l.tokens, int32(v))
			return nil
		})
	case fieldSalt:
		text, kind, serr := s.readNumber()
		if serr != nil {
			return &fieldError{field: f.String(), msg: serr.msg}
		}
		v, ok := parseUint(text)
		if kind != numInteger || !ok {
			return &fieldError{field: f.String(), msg: string(text) + " is not an integer in [0, 2^64)"}
		}
		l.salt = v
		return nil
	default:
		text, kind, serr := s.readNumber()
		if serr != nil {
			return &fieldError{field: f.String(), msg: serr.msg}
		}
		if kind != numInteger {
			return &fieldError{field: f.String(), msg: string(text) + " is not an integer"}
		}
		v, ok := parseInt(text)
		if !ok {
			return &fieldError{field: f.String(), msg: string(text) + " is out of range"}
		}
		l.num[f] = v
		return nil
	}
}

// readArray reads an array of numbers, handing each one's text to add.
func (s *scanner) readArray(f field, add func([]byte) *fieldError) *fieldError {
	if s.peek() != '[' {
		return &fieldError{field: f.String(), msg: "want an array of integers"}
	}
	s.pos++
	if s.peek() == ']' {
		s.pos++
		return nil
	}
	for {
		text, kind, serr := s.readNumber()
		if serr != nil {
			return &fieldError{field: f.String(), msg: "want an array of integers: " + serr.msg}
		}
		if kind != numInteger {
			return &fieldError{field: f.String(), msg: string(text) + " is not an integer"}
		}
		if ferr := add(text); ferr != nil {
			return ferr
		}
		switch s.peek() {
		case ',':
			s.pos++
		case ']':
			s.pos++
			return nil
		default:
			return &fieldError{field: f.String(), msg: "want ',' or ']' in array"}
		}
	}
}

// parseUint parses the text of a JSON integer as a uint64 without
// allocating; a minus sign or an overflow fails.
func parseUint(text []byte) (uint64, bool) {
	if len(text) == 0 || len(text) > 20 {
		return 0, false
	}
	var v uint64
	for _, c := range text {
		if !isDigit(c) {
			return 0, false
		}
		d := uint64(c - '0')
		if v > (math.MaxUint64-d)/10 {
			return 0, false
		}
		v = v*10 + d
	}
	return v, true
}

// parseInt parses the text of a JSON integer as an int64 without allocating.
func parseInt(text []byte) (int64, bool) {
	neg := len(text) > 0 && text[0] == '-'
	if neg {
		text = text[1:]
	}
	u, ok := parseUint(text)
	switch {
	case !ok:
		return 0, false
	case neg && u <= 1<<63:
		return int64(-u), true // -(1<<63) wraps to itself, as wanted
	case !neg && u <= math.MaxInt64:
		return int64(u), true
	}
	return 0, false
}
