package trace

import (
	"unicode/utf16"
	"unicode/utf8"
)

// scanner reads one JSON object from a line without allocating: the trace
// formats are flat objects of integers and arrays of integers, so a small
// hand-written scanner replaces encoding/json's reflection (which allocates
// per line and is several times slower on a million-line trace). It accepts
// exactly what RFC 8259 accepts (the fuzz test holds it to encoding/json),
// and skips fields it does not know, whatever their value.
type scanner struct {
	buf []byte
	pos int
	// key holds a field name that needed unescaping.
	key [32]byte
}

// maxNesting matches encoding/json's limit, so that both accept the same
// lines.
const maxNesting = 10000

// scanError is what went wrong and where, before a field is known.
type scanError struct {
	msg string
	pos int
}

func (s *scanner) fail(msg string) *scanError { return &scanError{msg: msg, pos: s.pos} }

func (s *scanner) skipSpace() {
	for s.pos < len(s.buf) {
		switch s.buf[s.pos] {
		case ' ', '\t', '\n', '\r':
			s.pos++
		default:
			return
		}
	}
}

// peek returns the next byte after white space, or 0 at the end.
func (s *scanner) peek() byte {
	s.skipSpace()
	if s.pos >= len(s.buf) {
		return 0
	}
	return s.buf[s.pos]
}

func (s *scanner) expect(c byte, what string) *scanError {
	if s.peek() != c {
		if s.pos >= len(s.buf) {
			return s.fail("unexpected end of line, want " + what)
		}
		return s.fail("want " + what + ", found " + quoteByte(s.buf[s.pos]))
	}
	s.pos++
	return nil
}

func quoteByte(c byte) string {
	if c >= 0x20 && c < 0x7f {
		return "'" + string(rune(c)) + "'"
	}
	const hex = "0123456789abcdef"
	return "byte 0x" + string([]byte{hex[c>>4], hex[c&15]})
}

// readString reads a JSON string at the current position (after white
// space). It returns its raw contents when they hold no escape; otherwise the
// unescaped contents in s.key, cut to len(s.key) (field names longer than
// that are unknown to us anyway, so a cut name never matches one).
func (s *scanner) readString() ([]byte, *scanError) {
	if err := s.expect('"', "'\"'"); err != nil {
		return nil, err
	}
	start := s.pos
	escaped := false
	for {
		if s.pos >= len(s.buf) {
			return nil, s.fail("unterminated string")
		}
		c := s.buf[s.pos]
		switch {
		case c == '"':
			raw := s.buf[start:s.pos]
			s.pos++
			if !escaped {
				return raw, nil
			}
			return s.unescape(raw), nil
		case c == '\\':
			escaped = true
			s.pos++
			if s.pos >= len(s.buf) {
				return nil, s.fail("unterminated string")
			}
			switch s.buf[s.pos] {
			case '"', '\\', '/', 'b', 'f', 'n', 'r', 't':
				s.pos++
			case 'u':
				if s.pos+4 >= len(s.buf) {
					return nil, s.fail("short \\u escape in string")
				}
				for _, h := range s.buf[s.pos+1 : s.pos+5] {
					if unhex(h) < 0 {
						return nil, s.fail("bad \\u escape in string")
					}
				}
				s.pos += 5
			default:
				return nil, s.fail("bad escape in string")
			}
		case c < 0x20:
			return nil, s.fail("control character in string")
		default:
			s.pos++
		}
	}
}

func unhex(c byte) rune {
	switch {
	case '0' <= c && c <= '9':
		return rune(c - '0')
	case 'a' <= c && c <= 'f':
		return rune(c - 'a' + 10)
	case 'A' <= c && c <= 'F':
		return rune(c - 'A' + 10)
	}
	return -1
}

// unescape decodes a string body already checked by readString into s.key,
// as encoding/json does (lone surrogates become U+FFFD).
func (s *scanner) unescape(raw []byte) []byte {
	out := s.key[:0]
	put := func(r rune) {
		var b [utf8.UTFMax]byte
		n := utf8.EncodeRune(b[:], r)
		if len(out)+n <= cap(out) {
			out = append(out, b[:n]...)
		}
	}
	hex4 := func(b []byte) rune {
		return unhex(b[0])<<12 | unhex(b[1])<<8 | unhex(b[2])<<4 | unhex(b[3])
	}
	for i := 0; i < len(raw); {
		c := raw[i]
		if c != '\\' {
			r, n := utf8.DecodeRune(raw[i:])
			put(r)
			i += n
			continue
		}
		e := raw[i+1]
		i += 2
		switch e {
		case 'b':
			put('\b')
		case 'f':
			put('\f')
		case 'n':
			put('\n')
		case 'r':
			put('\r')
		case 't':
			put('\t')
		case 'u':
			r := hex4(raw[i:])
			i += 4
			if utf16.IsSurrogate(r) {
				if i+6 <= len(raw) && raw[i] == '\\' && raw[i+1] == 'u' {
					if r2 := utf16.DecodeRune(r, hex4(raw[i+2:])); r2 != utf8.RuneError {
						put(r2)
						i += 6
						continue
					}
				}
				r = utf8.RuneError
			}
			put(r)
		default: // '"', '\\', '/'
			put(rune(e))
		}
	}
	return out
}

// numberKind says how a JSON number was written.
type numberKind uint8

const (
	numInteger  numberKind = iota // -?digits
	numFraction                   // has a fraction or an exponent
)

// readNumber checks a JSON number at the current position and returns its
// text.
func (s *scanner) readNumber() ([]byte, numberKind, *scanError) {
	s.skipSpace()
	start := s.pos
	kind := numInteger
	if s.pos < len(s.buf) && s.buf[s.pos] == '-' {
		s.pos++
	}
	switch {
	case s.pos >= len(s.buf) || !isDigit(s.buf[s.pos]):
		return nil, 0, s.fail("want a number")
	case s.buf[s.pos] == '0':
		s.pos++
	default:
		for s.pos < len(s.buf) && isDigit(s.buf[s.pos]) {
			s.pos++
		}
	}
	if s.pos < len(s.buf) && s.buf[s.pos] == '.' {
		kind = numFraction
		s.pos++
		if s.pos >= len(s.buf) || !isDigit(s.buf[s.pos]) {
			return nil, 0, s.fail("want a digit after '.'")
		}
		for s.pos < len(s.buf) && isDigit(s.buf[s.pos]) {
			s.pos++
		}
	}
	if s.pos < len(s.buf) && (s.buf[s.pos] == 'e' || s.buf[s.pos] == 'E') {
		kind = numFraction
		s.pos++
		if s.pos < len(s.buf) && (s.buf[s.pos] == '+' || s.buf[s.pos] == '-') {
			s.pos++
		}
		if s.pos >= len(s.buf) || !isDigit(s.buf[s.pos]) {
			return nil, 0, s.fail("want a digit in exponent")
		}
		for s.pos < len(s.buf) && isDigit(s.buf[s.pos]) {
			s.pos++
		}
	}
	return s.buf[start:s.pos], kind, nil
}

func isDigit(c byte) bool { return '0' <= c && c <= '9' }

// skipValue checks and skips any JSON value.
func (s *scanner) skipValue(depth int) *scanError {
	if depth > maxNesting {
		return s.fail("nested too deep")
	}
	switch c := s.peek(); c {
	case '"':
		_, err := s.readString()
		return err
	case '{':
		s.pos++
		if s.peek() == '}' {
			s.pos++
			return nil
		}
		for {
			if _, err := s.readString(); err != nil {
				return err
			}
			if err := s.expect(':', "':'"); err != nil {
				return err
			}
			if err := s.skipValue(depth + 1); err != nil {
				return err
			}
			switch s.peek() {
			case ',':
				s.pos++
			case '}':
				s.pos++
				return nil
			default:
				return s.expect('}', "',' or '}'")
			}
		}
	case '[':
		s.pos++
		if s.peek() == ']' {
			s.pos++
			return nil
		}
		for {
			if err := s.skipValue(depth + 1); err != nil {
				return err
			}
			switch s.peek() {
			case ',':
				s.pos++
			case ']':
				s.pos++
				return nil
			default:
				return s.expect(']', "',' or ']'")
			}
		}
	case 't':
		return s.literal("true")
	case 'f':
		return s.literal("false")
	case 'n':
		return s.literal("null")
	default:
		_, _, err := s.readNumber()
		return err
	}
}

func (s *scanner) literal(word string) *scanError {
	if len(s.buf)-s.pos < len(word) || string(s.buf[s.pos:s.pos+len(word)]) != word {
		return s.fail("want a value")
	}
	s.pos += len(word)
	return nil
}

// isNull consumes a null literal if one comes next.
func (s *scanner) isNull() bool {
	if s.peek() == 'n' && s.literal("null") == nil {
		return true
	}
	return false
}
