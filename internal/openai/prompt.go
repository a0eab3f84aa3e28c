package openai

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"strconv"
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
	if err := p.unmarshal(b); err != nil {
		return &FieldError{Field: "prompt", Msg: err.Error()}
	}
	return nil
}

func (p *Prompt) unmarshal(b []byte) error {
	b = bytes.TrimSpace(b)
	if len(b) == 0 {
		return errors.New("empty")
	}
	switch b[0] {
	case '"':
		var s string
		if err := json.Unmarshal(b, &s); err != nil {
			return fmt.Errorf("bad string: %w", err)
		}
		*p = Prompt{Text: s}
		return nil
	case '[':
		var raw []json.RawMessage
		if err := json.Unmarshal(b, &raw); err != nil {
			return fmt.Errorf("bad array: %w", err)
		}
		ids := make([]int32, len(raw))
		for i, r := range raw {
			r = bytes.TrimSpace(r)
			if len(r) > 0 && (r[0] == '"' || r[0] == '[') {
				return errors.New("batches of prompts are not supported: send one prompt, a string or an array of token ids")
			}
			v, err := strconv.ParseInt(string(r), 10, 64)
			if err != nil || v < 0 || v > math.MaxInt32 {
				return fmt.Errorf("token %d: %s is not a token id (an integer from 0 to 2147483647)", i, r)
			}
			ids[i] = int32(v)
		}
		*p = Prompt{Tokens: ids, IsTokens: true}
		return nil
	case 'n':
		return errors.New("null: want a string or an array of token ids")
	}
	return fmt.Errorf("%.20s: want a string or an array of token ids", b)
}
