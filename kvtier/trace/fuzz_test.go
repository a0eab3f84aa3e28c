package trace

import (
	"bytes"
	"encoding/json"
	"io"
	"math"
	"strconv"
	"testing"
)

var fuzzSeeds = []string{
	`{"timestamp": 529, "input_length": 28, "output_length": 445, "hash_ids": [298]}`,
	`{"arrival_us":529000,"salt":7,"block_tokens":16,"input_tokens":40,"output_tokens":445,"keys":[11,12,13]}`,
	`{"arrival_us":1,"block_tokens":2,"output_tokens":1,"tokens":[1,2,3]}`,
	`{"timestamp": 1e3, "x": {"y": [true, false, null, "\ud83d\ude00"]}, "hash_ids": []}`,
	`{"\u0074imestamp": -0, "hash_ids": [0, 18446744073709551615]}`,
	`{"timestamp": 01}`,
	`[1, 2]`,
	` {} `,
	`{"a":"\ud800"}`,
}

// FuzzParseLine holds the line parser to encoding/json: it accepts a line
// only if encoding/json does, reads the same values from it, and rejects a
// valid object only for a field whose value is not what the format wants.
func FuzzParseLine(f *testing.F) {
	for _, s := range fuzzSeeds {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, line []byte) {
		var s scanner
		var l rawLine
		ferr := parseLine(&s, line, mooncakeFields|nativeFields, &l)
		valid := json.Valid(line)
		var obj map[string]any
		isObject := false
		if valid {
			d := json.NewDecoder(bytes.NewReader(line))
			d.UseNumber()
			isObject = d.Decode(&obj) == nil && obj != nil
		}
		switch {
		case ferr == nil && !isObject:
			t.Fatalf("accepted %q, which is not a JSON object (valid JSON: %v)", line, valid)
		case ferr != nil && ferr.field == "":
			if isObject {
				t.Fatalf("rejected the valid object %q: %s", line, ferr.msg)
			}
			return
		case !isObject:
			return // a field error found before the line's syntax error
		}
		// line is a valid JSON object: compare field by field.
		wellTyped := true
		for f := field(0); f < numFields; f++ {
			v, present := obj[f.String()]
			want, ok := oracleValue(f, v)
			if present && !ok {
				wellTyped = false
			}
			if ferr != nil {
				continue
			}
			if present != l.has.has(f) {
				t.Fatalf("%q: field %v present %v, parsed %v", line, f, present, l.has.has(f))
			}
			if !present {
				continue
			}
			var got []uint64
			switch f {
			case fieldHashIDs, fieldKeys:
				if _, both := obj["hash_ids"]; both {
					if _, both = obj["keys"]; both {
						continue // they share a buffer; the last one wins
					}
				}
				got = l.ids
			case fieldTokens:
				for _, tok := range l.tokens {
					got = append(got, uint64(tok))
				}
			case fieldSalt:
				got = []uint64{l.salt}
			default:
				got = []uint64{uint64(l.num[f])}
			}
			if !equalKeys(got, want) {
				t.Fatalf("%q: field %v parsed %v, encoding/json read %v", line, f, got, want)
			}
		}
		if ferr != nil && wellTyped && !hasDuplicateKeys(line) {
			t.Fatalf("rejected %q at field %s (%s), but every field is well typed", line, ferr.field, ferr.msg)
		}
	})
}

// oracleValue converts what encoding/json read for field f, reporting
// whether it is what the format wants.
func oracleValue(f field, v any) ([]uint64, bool) {
	number := func(v any) (uint64, bool) {
		n, ok := v.(json.Number)
		if !ok {
			return 0, false
		}
		switch f {
		case fieldHashIDs, fieldKeys, fieldSalt:
			u, err := strconv.ParseUint(string(n), 10, 64)
			return u, err == nil
		case fieldTokens:
			u, err := strconv.ParseUint(string(n), 10, 64)
			return u, err == nil && u <= math.MaxInt32
		}
		i, err := strconv.ParseInt(string(n), 10, 64)
		return uint64(i), err == nil
	}
	switch f {
	case fieldHashIDs, fieldKeys, fieldTokens:
		arr, ok := v.([]any)
		if !ok {
			return nil, false
		}
		out := []uint64{}
		for _, e := range arr {
			u, ok := number(e)
			if !ok {
				return nil, false
			}
			out = append(out, u)
		}
		return out, true
	}
	u, ok := number(v)
	return []uint64{u}, ok
}

// FuzzReader feeds arbitrary bytes to a skipping Reader: it must not panic,
// and every request it returns must keep the formats' rules.
func FuzzReader(f *testing.F) {
	for _, s := range fuzzSeeds {
		f.Add([]byte(s + "\n" + s + "\r\n\n" + s))
	}
	f.Fuzz(func(t *testing.T, in []byte) {
		r := NewReader(bytes.NewReader(in), Options{SkipBad: true, MaxLineBytes: 1 << 16})
		var req Request
		var last = req.Arrival
		for {
			err := r.Next(&req)
			if err == io.EOF {
				break
			}
			if err != nil {
				if _, isLine := err.(*LineError); isLine {
					t.Fatalf("SkipBad returned a line error: %v", err)
				}
				return // a line longer than MaxLineBytes
			}
			if req.Arrival < last || req.InputTokens < 0 || req.OutputTokens < 0 || req.BlockTokens < 1 ||
				len(req.Keys) != NumBlocks(req.InputTokens, req.BlockTokens) {
				t.Fatalf("line %d broke the rules: %+v", r.Line(), req)
			}
			last = req.Arrival
		}
	})
}

// hasDuplicateKeys reports whether a valid JSON object names a field twice:
// encoding/json then keeps the last value, while the parser rejects a bad
// first one.
func hasDuplicateKeys(line []byte) bool {
	d := json.NewDecoder(bytes.NewReader(line))
	if _, err := d.Token(); err != nil {
		return false
	}
	seen := map[string]bool{}
	for d.More() {
		tok, err := d.Token()
		if err != nil {
			return false
		}
		key, _ := tok.(string)
		if seen[key] {
			return true
		}
		seen[key] = true
		var skip json.RawMessage
		if d.Decode(&skip) != nil {
			return false
		}
	}
	return false
}
