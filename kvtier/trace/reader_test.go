package trace

import (
	"bytes"
	"compress/gzip"
	"errors"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// mooncakePath is the public Mooncake synthetic trace, kept gzip-compressed
// under testdata (attribution and license in testdata/README.md).
const mooncakePath = "testdata/mooncake_synthetic_trace.jsonl.gz"

func openMooncake(t testing.TB) *File {
	t.Helper()
	f, err := Open(mooncakePath)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { f.Close() })
	return f
}

// TestMooncakeTraceStatistics reads the public trace and checks the
// statistics its README states.
func TestMooncakeTraceStatistics(t *testing.T) {
	r := NewReader(openMooncake(t), Options{Name: "mooncake"})
	var req Request
	var refs, inputTokens int
	var last time.Duration
	unique := map[uint64]struct{}{}
	for {
		err := r.Next(&req)
		if err == io.EOF {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		refs += len(req.Keys)
		inputTokens += req.InputTokens
		for _, k := range req.Keys {
			unique[k] = struct{}{}
		}
		last = req.Arrival
		if req.BlockTokens != 512 || req.Salt != 0 || len(req.Tokens) != 0 {
			t.Fatalf("line %d: %+v", r.Line(), req)
		}
	}
	if r.Format() != FormatMooncake {
		t.Errorf("format %v, want mooncake", r.Format())
	}
	if got := r.Requests(); got != 3993 {
		t.Errorf("requests %d, want 3993", got)
	}
	if refs != 121877 || len(unique) != 43924 {
		t.Errorf("block references %d, unique %d; want 121877, 43924", refs, len(unique))
	}
	if mean := inputTokens / r.Requests(); mean != 15325 {
		t.Errorf("mean input %d tokens, want 15325", mean)
	}
	if last.Round(time.Second) != 1022*time.Second {
		t.Errorf("last arrival %v, want about 1022s", last)
	}
}

func TestReadNative(t *testing.T) {
	in := `{"arrival_us":529000,"salt":7,"block_tokens":16,"input_tokens":40,"output_tokens":445,"keys":[11,12,13]}

{"arrival_us":530000,"salt":18446744073709551615,"block_tokens":2,"output_tokens":12,"tokens":[1,2,3]}
`
	r := NewReader(strings.NewReader(in), Options{})
	var req Request
	if err := r.Next(&req); err != nil {
		t.Fatal(err)
	}
	if req.Arrival != 529*time.Millisecond || req.Salt != 7 || req.BlockTokens != 16 || req.InputTokens != 40 ||
		req.OutputTokens != 445 || len(req.Keys) != 3 || req.Keys[2] != 13 {
		t.Fatalf("first request: %+v", req)
	}
	if err := r.Next(&req); err != nil {
		t.Fatal(err)
	}
	if r.Line() != 3 || r.Format() != FormatNative {
		t.Errorf("line %d format %v, want 3 native", r.Line(), r.Format())
	}
	if req.Salt != 1<<64-1 || req.InputTokens != 3 || len(req.Tokens) != 3 || len(req.Keys) != 2 {
		t.Fatalf("second request: %+v", req)
	}
	var h KeyHasher
	if want := h.AppendKeys(nil, req.Salt, []int32{1, 2, 3}, 2); want[0] != req.Keys[0] || want[1] != req.Keys[1] {
		t.Errorf("keys %v, want %v", req.Keys, want)
	}
	if err := r.Next(&req); err != io.EOF {
		t.Errorf("after the last line: %v, want io.EOF", err)
	}
}

func TestKeyHasherChainsPrefixes(t *testing.T) {
	var h KeyHasher
	a := h.AppendKeys(nil, 1, []int32{1, 2, 3, 4, 5}, 2)
	b := h.AppendKeys(nil, 1, []int32{1, 2, 3, 4, 6, 7}, 2)
	c := h.AppendKeys(nil, 2, []int32{1, 2, 3, 4, 5}, 2)
	d := h.AppendKeys(nil, 1, []int32{1, 9, 3, 4}, 2)
	switch {
	case len(a) != 3 || len(b) != 3:
		t.Fatalf("lengths %d %d, want 3 (partial block included)", len(a), len(b))
	case a[0] != b[0] || a[1] != b[1]:
		t.Error("equal prefixes gave different keys")
	case a[2] == b[2]:
		t.Error("different third blocks gave equal keys")
	case c[0] == a[0]:
		t.Error("another salt gave an equal key")
	case d[1] == a[1]:
		t.Error("a different first block did not change the second key")
	}
}

// TestBadLines: each malformed line is reported with its line number, the
// field and what is wrong, and leaves the request as it was.
func TestBadLines(t *testing.T) {
	good := `{"timestamp": 10, "input_length": 600, "output_length": 5, "hash_ids": [1, 2]}` + "\n"
	cases := []struct {
		name, line, field, msg string
		format                 Format
		alone                  bool // the first line, format not yet known
	}{
		{"not JSON", `hello`, "", "bad JSON at byte 1", FormatAuto, false},
		{"truncated", `{"timestamp": 10, "input_length": 600`, "", "unexpected end of line", FormatAuto, false},
		{"trailing text", `{"timestamp": 10, "input_length": 1, "output_length": 5, "hash_ids": [1]} x`, "", "text after", FormatAuto, false},
		{"trailing comma", `{"timestamp": 10,}`, "", "bad JSON", FormatAuto, false},
		{"control char in string", "{\"a\x01\": 1}", "", "control character", FormatAuto, false},
		{"missing hash_ids", `{"timestamp": 10, "input_length": 600, "output_length": 5}`, "hash_ids", "missing", FormatAuto, false},
		{"missing timestamp", `{"input_length": 600, "output_length": 5, "hash_ids": [1, 2]}`, "timestamp", "missing", FormatAuto, false},
		{"negative input", `{"timestamp": 10, "input_length": -1, "output_length": 5, "hash_ids": []}`, "input_length", "negative", FormatAuto, false},
		{"negative output", `{"timestamp": 10, "input_length": 1, "output_length": -5, "hash_ids": [1]}`, "output_length", "negative", FormatAuto, false},
		{"too few ids", `{"timestamp": 10, "input_length": 1025, "output_length": 5, "hash_ids": [1, 2]}`, "hash_ids", "ceil(1025/512) = 3", FormatAuto, false},
		{"too many ids", `{"timestamp": 10, "input_length": 512, "output_length": 5, "hash_ids": [1, 2]}`, "hash_ids", "has 2 ids", FormatAuto, false},
		{"fraction", `{"timestamp": 10.5, "input_length": 1, "output_length": 5, "hash_ids": [1]}`, "timestamp", "not an integer", FormatAuto, false},
		{"string number", `{"timestamp": "10", "input_length": 1, "output_length": 5, "hash_ids": [1]}`, "timestamp", "want a number", FormatAuto, false},
		{"null", `{"timestamp": null, "input_length": 1, "output_length": 5, "hash_ids": [1]}`, "timestamp", "is null", FormatAuto, false},
		{"negative id", `{"timestamp": 10, "input_length": 1, "output_length": 5, "hash_ids": [-1]}`, "hash_ids", "not an integer in [0, 2^64)", FormatAuto, false},
		{"id overflow", `{"timestamp": 10, "input_length": 1, "output_length": 5, "hash_ids": [18446744073709551616]}`, "hash_ids", "not an integer", FormatAuto, false},
		{"ids not array", `{"timestamp": 10, "input_length": 1, "output_length": 5, "hash_ids": 1}`, "hash_ids", "want an array", FormatAuto, false},
		{"int overflow", `{"timestamp": 9223372036854775808, "input_length": 1, "output_length": 5, "hash_ids": [1]}`, "timestamp", "out of range", FormatAuto, false},
		{"huge timestamp", `{"timestamp": 9223372036854775807, "input_length": 1, "output_length": 5, "hash_ids": [1]}`, "timestamp", "too large", FormatAuto, false},
		{"goes back", `{"timestamp": 9, "input_length": 1, "output_length": 5, "hash_ids": [1]}`, "timestamp", "before the previous", FormatAuto, false},
		{"unknown format", `{"foo": 1}`, "", "cannot tell the format", FormatAuto, true},
		{"mixed formats", `{"timestamp": 10, "arrival_us": 1}`, "", "mixes Mooncake fields", FormatAuto, true},
		{"native: missing block_tokens", `{"arrival_us":1,"output_tokens":1,"keys":[]}`, "block_tokens", "missing", FormatNative, false},
		{"native: zero block_tokens", `{"arrival_us":1,"block_tokens":0,"output_tokens":1,"keys":[]}`, "block_tokens", "not in [1, 65536]", FormatNative, false},
		{"native: block_tokens above the block manager's limit", `{"arrival_us":1,"block_tokens":65537,"output_tokens":1,"keys":[]}`, "block_tokens", "65537 is not in [1, 65536]", FormatNative, false},
		{"native: keys and tokens", `{"arrival_us":1,"block_tokens":2,"output_tokens":1,"input_tokens":1,"keys":[1],"tokens":[1]}`, "keys", "not both", FormatNative, false},
		{"native: neither", `{"arrival_us":1,"block_tokens":2,"output_tokens":1}`, "keys", "give keys or tokens", FormatNative, false},
		{"native: keys without input_tokens", `{"arrival_us":1,"block_tokens":2,"output_tokens":1,"keys":[1]}`, "input_tokens", "missing", FormatNative, false},
		{"native: wrong key count", `{"arrival_us":1,"block_tokens":2,"output_tokens":1,"input_tokens":5,"keys":[1]}`, "keys", "ceil(5/2) = 3", FormatNative, false},
		{"native: input_tokens disagrees", `{"arrival_us":1,"block_tokens":2,"output_tokens":1,"input_tokens":5,"tokens":[1]}`, "input_tokens", "tokens has 1", FormatNative, false},
		{"native: token too big", `{"arrival_us":1,"block_tokens":2,"output_tokens":1,"tokens":[2147483648]}`, "tokens", "[0, 2^31)", FormatNative, false},
		{"native: negative salt", `{"arrival_us":1,"salt":-1,"block_tokens":2,"output_tokens":1,"tokens":[1]}`, "salt", "not an integer in [0, 2^64)", FormatNative, false},
		{"native: negative arrival", `{"arrival_us":-1,"block_tokens":2,"output_tokens":1,"tokens":[1]}`, "arrival_us", "negative", FormatNative, false},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			in := c.line + "\n"
			wantLine := 1
			if !c.alone && c.format == FormatAuto {
				in = good + "\n" + in // line 2 is blank
				wantLine = 3
			}
			r := NewReader(strings.NewReader(in), Options{Name: "t.jsonl", Format: c.format})
			var req Request
			if wantLine == 3 {
				if err := r.Next(&req); err != nil {
					t.Fatal(err)
				}
			}
			before := req
			err := r.Next(&req)
			var le *LineError
			if !errors.As(err, &le) {
				t.Fatalf("error %v, want a *LineError", err)
			}
			if le.Line != wantLine || le.Field != c.field || !strings.Contains(le.Msg, c.msg) {
				t.Errorf("got line %d field %q msg %q; want line %d field %q msg containing %q",
					le.Line, le.Field, le.Msg, wantLine, c.field, c.msg)
			}
			if !strings.HasPrefix(err.Error(), "t.jsonl:") {
				t.Errorf("error %q does not name the trace", err)
			}
			if req.Arrival != before.Arrival || req.InputTokens != before.InputTokens || len(req.Keys) != len(before.Keys) {
				t.Errorf("a bad line changed the request: %+v", req)
			}
		})
	}
}

func TestSkipBad(t *testing.T) {
	in := strings.Join([]string{
		`{"timestamp": 10, "input_length": 1, "output_length": 5, "hash_ids": [1]}`,
		`garbage`,
		`{"timestamp": 11, "input_length": 1, "output_length": 5}`,
		`{"timestamp": 5, "input_length": 1, "output_length": 5, "hash_ids": [1]}`,
		`{"timestamp": 12, "input_length": 513, "output_length": 5, "hash_ids": [1, 2]}`,
	}, "\n") // no final newline
	r := NewReader(strings.NewReader(in), Options{SkipBad: true})
	var req Request
	var arrivals []time.Duration
	for {
		err := r.Next(&req)
		if err == io.EOF {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		arrivals = append(arrivals, req.Arrival)
	}
	if len(arrivals) != 2 || arrivals[1] != 12*time.Millisecond {
		t.Errorf("arrivals %v, want [10ms 12ms]", arrivals)
	}
	if r.Skipped() != 3 || len(r.SkippedErrors()) != 3 {
		t.Fatalf("skipped %d (%d kept), want 3", r.Skipped(), len(r.SkippedErrors()))
	}
	for i, want := range []int{2, 3, 4} {
		if got := r.SkippedErrors()[i].Line; got != want {
			t.Errorf("skipped error %d is line %d, want %d", i, got, want)
		}
	}
}

func TestLongLines(t *testing.T) {
	var req Request
	ids := make([]uint64, 40000) // a line of ~200 KiB, beyond the read buffer
	for i := range ids {
		ids[i] = uint64(i) * 1000003
	}
	req.InputTokens, req.OutputTokens, req.BlockTokens, req.Keys = 40000*512, 1, 512, ids
	line := AppendMooncake(nil, &req)
	in := string(line) + string(line)
	r := NewReader(strings.NewReader(in), Options{})
	var got Request
	for i := range 2 {
		if err := r.Next(&got); err != nil {
			t.Fatalf("line %d: %v", i+1, err)
		}
		if len(got.Keys) != len(ids) || got.Keys[39999] != ids[39999] {
			t.Fatalf("line %d: %d keys", i+1, len(got.Keys))
		}
	}
	r = NewReader(strings.NewReader(in), Options{MaxLineBytes: 100 << 10})
	var le *LineError
	if err := r.Next(&got); !errors.As(err, &le) || le.Line != 1 || !strings.Contains(le.Msg, "longer than") {
		t.Errorf("over MaxLineBytes: %v", err)
	}
}

func TestRoundTrip(t *testing.T) {
	cfg := DefaultGenConfig()
	cfg.Requests = 300
	for _, format := range []Format{FormatMooncake, FormatNative} {
		var buf bytes.Buffer
		if err := Generate(&buf, cfg, format); err != nil {
			t.Fatal(err)
		}
		g, _ := NewGenerator(cfg)
		r := NewReader(&buf, Options{Format: format})
		var want, got Request
		for i := 0; ; i++ {
			gerr, rerr := g.Next(&want), r.Next(&got)
			if gerr == io.EOF && rerr == io.EOF {
				break
			}
			if gerr != nil || rerr != nil {
				t.Fatalf("%v request %d: generator %v, reader %v", format, i, gerr, rerr)
			}
			unit := time.Millisecond
			if format == FormatNative {
				unit = time.Microsecond
			}
			if got.Arrival != want.Arrival.Truncate(unit) || got.InputTokens != want.InputTokens ||
				got.OutputTokens != want.OutputTokens || got.BlockTokens != want.BlockTokens ||
				!equalKeys(got.Keys, want.Keys) {
				t.Fatalf("%v request %d: read %+v, wrote %+v", format, i, got, want)
			}
		}
	}
}

func equalKeys(a, b []uint64) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}

// TestNextAllocatesNothing: once its buffers have grown, reading a line
// allocates nothing, in either format.
func TestNextAllocatesNothing(t *testing.T) {
	lines := map[Format]string{
		FormatMooncake: `{"timestamp": 0, "input_length": 2000, "output_length": 5, "hash_ids": [1, 2, 3, 4], "extra": {"a": [1, "x\u00e9"]}}`,
		FormatNative:   `{"arrival_us":0,"salt":3,"block_tokens":2,"output_tokens":1,"tokens":[5,6,7,8,9]}`,
	}
	for _, format := range []Format{FormatMooncake, FormatNative} {
		in := strings.Repeat(lines[format]+"\n", 200)
		r := NewReader(strings.NewReader(in), Options{Format: format})
		var req Request
		if err := r.Next(&req); err != nil {
			t.Fatal(err)
		}
		allocs := testing.AllocsPerRun(100, func() {
			if err := r.Next(&req); err != nil {
				t.Fatal(err)
			}
		})
		if allocs != 0 {
			t.Errorf("%v: %v allocations per line, want 0", format, allocs)
		}
	}
}

func TestOpenPlainAndGzip(t *testing.T) {
	dir := t.TempDir()
	line := []byte(`{"timestamp": 0, "input_length": 1, "output_length": 5, "hash_ids": [1]}` + "\n")
	plain := filepath.Join(dir, "plain.jsonl")
	if err := os.WriteFile(plain, line, 0o644); err != nil {
		t.Fatal(err)
	}
	var zbuf bytes.Buffer
	zw := gzip.NewWriter(&zbuf)
	zw.Write(line)
	zw.Close()
	zipped := filepath.Join(dir, "named-without-gz-suffix")
	if err := os.WriteFile(zipped, zbuf.Bytes(), 0o644); err != nil {
		t.Fatal(err)
	}
	for _, path := range []string{plain, zipped} {
		f, err := Open(path)
		if err != nil {
			t.Fatal(err)
		}
		var req Request
		if err := NewReader(f, Options{}).Next(&req); err != nil || len(req.Keys) != 1 {
			t.Errorf("%s: %v %+v", path, err, req)
		}
		f.Close()
	}
	if _, err := Open(filepath.Join(dir, "absent")); err == nil || !strings.Contains(err.Error(), "absent") {
		t.Errorf("opening a missing file: %v", err)
	}
}

func TestParseFormat(t *testing.T) {
	for f := FormatAuto; f < NumFormats; f++ {
		if got, err := ParseFormat(f.String()); err != nil || got != f {
			t.Errorf("ParseFormat(%q) = %v, %v", f.String(), got, err)
		}
	}
	if _, err := ParseFormat("csv"); err == nil || !strings.Contains(err.Error(), "mooncake") {
		t.Errorf("ParseFormat(csv): %v", err)
	}
	if _, err := NewWriter(io.Discard, FormatAuto); err == nil {
		t.Error("NewWriter(FormatAuto) did not fail")
	}
}
