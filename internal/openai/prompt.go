package openai

import (
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"strconv"
	"strings"
)

// Prompt is a completion request's prompt: a string (Text) or an array of
// token ids (Tokens, IsTokens). Batches (arrays of strings or of arrays)
// are rejected.
type Prompt struct {
	Text     string
	Tokens   []int32
	IsTokens bool
}

// TextPrompt returns a string prompt.
func TextPrompt(s string) Prompt { return Prompt{Text: s} }

// TokenPrompt returns a prompt of token ids.
func TokenPrompt(ids []int32) Prompt { return Prompt{Tokens: ids, IsTokens: true} }

// MarshalJSON writes a token prompt as an array and a text prompt as a
// string.
func (p Prompt) MarshalJSON() ([]byte, error) {
	if !p.IsTokens {
		return json.Marshal(p.Text)
	}
	b := make([]byte, 0, 2+8*len(p.Tokens))
	b = append(b, '[')
	for i, t := range p.Tokens {
		if i > 0 {
			b = append(b, ',')
		}
		b = strconv.AppendInt(b, int64(t), 10)
	}
	return append(b, ']'), nil
}

// UnmarshalJSON reads a string or an array of token ids (integers from 0 to
// 2^31-1). Its errors are *FieldError naming "prompt".
func (p *Prompt) UnmarshalJSON(b []byte) error {
	q, err := DecodePrompt(b, -1)
	if err != nil {
		return &FieldError{Field: "prompt", Msg: err.Error()}
	}
	*p = q
	return nil
}

// ErrPromptTooLong is wrapped by DecodePrompt's error for a prompt of more
// tokens than its bound.
var ErrPromptTooLong = errors.New("prompt too long")

// DecodePrompt reads a prompt as UnmarshalJSON does, in one pass over b
// that stops at the (maxTokens+1)th token: a longer prompt is an error
// wrapping ErrPromptTooLong, and no id past that one is read. A text
// prompt counts one token per byte (the byte-level tokenizer's). A
// negative maxTokens bounds nothing. Its errors name no field.
func DecodePrompt(b []byte, maxTokens int) (Prompt, error) {
	b = b[skipSpace(b, 0):]
	for len(b) > 0 && isSpace(b[len(b)-1]) {
		b = b[:len(b)-1]
	}
	if len(b) == 0 {
		return Prompt{}, errors.New("empty")
	}
	switch b[0] {
	case '"':
		var s string
		if err := json.Unmarshal(b, &s); err != nil {
			return Prompt{}, fmt.Errorf("bad string: %w", err)
		}
		if maxTokens >= 0 && len(s) > maxTokens {
			return Prompt{}, fmt.Errorf("%w: %d tokens (bytes), more than %d", ErrPromptTooLong, len(s), maxTokens)
		}
		return Prompt{Text: s}, nil
	case '[':
		ids, err := decodeTokenIDs(b, maxTokens)
		if err != nil {
			return Prompt{}, err
		}
		return Prompt{Tokens: ids, IsTokens: true}, nil
	case 'n':
		return Prompt{}, errors.New("null: want a string or an array of token ids")
	}
	return Prompt{}, fmt.Errorf("%s: want a string or an array of token ids", excerpt(b))
}

// decodeTokenIDs reads b, a JSON array of token ids, one id at a time.
func decodeTokenIDs(b []byte, maxTokens int) ([]int32, error) {
	ids := []int32{}
	i := skipSpace(b, 1)
	if i < len(b) && b[i] == ']' {
		return ids, onlySpaceAfter(b, i+1)
	}
	for n := 0; ; n++ {
		if i >= len(b) {
			return nil, errors.New("bad array: it ends before its ]")
		}
		if maxTokens >= 0 && n == maxTokens {
			return nil, fmt.Errorf("%w: more than %d tokens", ErrPromptTooLong, maxTokens)
		}
		if b[i] == '"' || b[i] == '[' {
			return nil, errors.New("batches of prompts are not supported: send one prompt, a string or an array of token ids")
		}
		id, end, ok := tokenID(b, i)
		if !ok {
			return nil, fmt.Errorf("token %d: %s is not a token id (an integer from 0 to 2147483647)", n, excerpt(b[i:end]))
		}
		ids = append(ids, id)
		i = skipSpace(b, end)
		switch {
		case i < len(b) && b[i] == ',':
			i = skipSpace(b, i+1)
		case i < len(b) && b[i] == ']':
			return ids, onlySpaceAfter(b, i+1)
		default:
			return nil, fmt.Errorf("bad array: want , or ] after token %d", n)
		}
	}
}

// tokenID reads the array element at b[i:]: an integer from 0 to
// 2^31-1 in JSON's syntax ("-0" included, as strconv reads it). end is
// where the element's literal ends, for an error to quote it.
func tokenID(b []byte, i int) (id int32, end int, ok bool) {
	end = i
	for end < len(b) && strings.IndexByte("+-.0123456789Ee", b[end]) >= 0 {
		end++
	}
	if end == i { // not a number: true, an object, ...
		return 0, min(len(b), i+excerptBytes), false
	}
	lit := b[i:end]
	neg := lit[0] == '-'
	if neg {
		lit = lit[1:]
	}
	if len(lit) == 0 || (lit[0] == '0' && len(lit) > 1) {
		return 0, end, false
	}
	var v int64
	for _, c := range lit {
		if c < '0' || c > '9' {
			return 0, end, false
		}
		if v = v*10 + int64(c-'0'); v > math.MaxInt32 {
			return 0, end, false
		}
	}
	if neg && v != 0 {
		return 0, end, false
	}
	return int32(v), end, true
}

// isSpace reports whether c is JSON whitespace.
func isSpace(c byte) bool { return c == ' ' || c == '\t' || c == '\n' || c == '\r' }

func skipSpace(b []byte, i int) int {
	for i < len(b) && isSpace(b[i]) {
		i++
	}
	return i
}

func onlySpaceAfter(b []byte, i int) error {
	if skipSpace(b, i) != len(b) {
		return errors.New("bad array: more after its ]")
	}
	return nil
}

// excerptBytes is the most of a request's bytes an error quotes.
const excerptBytes = 20

// excerpt quotes b in an error, cut to excerptBytes.
func excerpt(b []byte) string {
	if len(b) > excerptBytes {
		return fmt.Sprintf("%s... (%d bytes)", b[:excerptBytes], len(b))
	}
	return string(b)
}
