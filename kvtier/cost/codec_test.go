package cost

import (
	"errors"
	"math"
	"strings"
	"testing"
	"time"
)

func fp8(t testing.TB) Codec {
	t.Helper()
	c, err := LookupCodec("FP8-E4M3")
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// TestCodecEncodedBlockBytes: the design notes' figure, a rank's share at
// tp > 1, MLA's one group per layer, and the zero Codec's raw bytes.
func TestCodecEncodedBlockBytes(t *testing.T) {
	c := fp8(t)
	m8, _ := LookupModel("llama-3.1-8b")
	ds, _ := LookupModel("deepseek-v3")
	var none Codec
	for _, tc := range []struct {
		name       string
		m          *Model
		tokens, tp int
		want       int64
	}{
		{"8b 16 tokens", &m8, 16, 1, 2048 + 1048576},
		{"8b 1 token", &m8, 1, 1, 2048 + 65536},
		// 8 heads over tp 3: 3 heads a rank, 32*2*3 scales = 768 bytes.
		{"8b tp 3", &m8, 16, 3, 768 + 32*2*3*16*128},
		{"8b tp 16", &m8, 16, 16, 256 + 32*2*1*16*128},
		// 61 scales of 4 bytes = 244, padded to 256.
		{"deepseek 16 tokens", &ds, 16, 8, 256 + 61*576*16},
	} {
		if got := c.EncodedBlockBytes(tc.m, tc.tokens, tc.tp); got != tc.want {
			t.Errorf("%s: %d bytes, want %d", tc.name, got, tc.want)
		}
		if got, raw := none.EncodedBlockBytes(tc.m, tc.tokens, tc.tp), tc.m.KVBytesPerTokenPerRank(tc.tp)*int64(tc.tokens); got != raw {
			t.Errorf("%s, no codec: %d bytes, want the raw %d", tc.name, got, raw)
		}
	}
	// Tokens in blocks of 16, the last short: each block has its scales.
	if got, want := c.encodedBytes(&m8, 40, 16, 1), 2*c.EncodedBlockBytes(&m8, 16, 1)+c.EncodedBlockBytes(&m8, 8, 1); got != want {
		t.Errorf("40 tokens: %d bytes, want %d", got, want)
	}
}

func TestCodecValidateNamesTheField(t *testing.T) {
	good := fp8(t)
	if err := good.Validate(); err != nil {
		t.Fatal(err)
	}
	var none Codec
	if err := none.Validate(); err != nil || none.Enabled() {
		t.Fatalf("zero codec: %v, enabled %v", err, none.Enabled())
	}
	for _, tc := range []struct {
		field string
		edit  func(*Codec)
	}{
		{"codec.name", func(c *Codec) { c.Name = "" }},
		{"codec.input", func(c *Codec) { c.Input = NumDtypes }},
		{"codec.value_bytes", func(c *Codec) { c.ValueBytes = 0 }},
		{"codec.value_bytes", func(c *Codec) { c.ValueBytes = 2 }}, // no smaller than bf16
		{"codec.scale_bytes", func(c *Codec) { c.ScaleBytes = -1 }},
		{"codec.scale_align", func(c *Codec) { c.ScaleAlign = 0 }},
		{"codec.encode_bytes_per_s", func(c *Codec) { c.EncodeBytesPerS = math.NaN() }},
		{"codec.decode_bytes_per_s", func(c *Codec) { c.DecodeBytesPerS = 0 }},
		{"codec.decode_bytes_per_s", func(c *Codec) { c.DecodeBytesPerS = 1e15 }},
		{"codec.chunk_blocks", func(c *Codec) { c.ChunkBlocks = 0 }},
	} {
		c := good
		tc.edit(&c)
		err := c.Validate()
		var fe *FieldError
		if !errors.As(err, &fe) || fe.Field != tc.field {
			t.Errorf("%s: got %v", tc.field, err)
		}
		// Through a path, a scenario and a planner, the same field.
		p := DirectPath(Link{Name: "l", BandwidthBytesPerS: 1e9})
		p.Codec = c
		if err := p.Validate(); !errors.As(err, &fe) || fe.Field != tc.field {
			t.Errorf("%s through a path: got %v", tc.field, err)
		}
		s := testCodecScenario(t, p)
		if err := s.Validate(); !errors.As(err, &fe) || fe.Field != tc.field {
			t.Errorf("%s through a scenario: got %v", tc.field, err)
		}
		cfg := testCodecPlannerConfig(t, p)
		if _, err := NewPlanner(cfg); !errors.As(err, &fe) || fe.Field != tc.field || !strings.Contains(err.Error(), "tier nvme") {
			t.Errorf("%s through a planner: got %v", tc.field, err)
		}
	}
}

func TestLookupCodecUnknown(t *testing.T) {
	_, err := LookupCodec("fp4")
	if !errors.Is(err, ErrUnknownName) || !strings.Contains(err.Error(), `"fp4"`) || !strings.Contains(err.Error(), "fp8-e4m3") {
		t.Fatalf("got %v", err)
	}
}

func testCodecScenario(t testing.TB, p Path) Scenario {
	t.Helper()
	m, _ := LookupModel("llama-3.1-8b")
	g, _ := LookupGPU("h200")
	return Scenario{Model: m, GPU: g, TP: 1, Path: p, BlockTokens: 16}
}

func testCodecPlannerConfig(t testing.TB, nvme Path) PlannerConfig {
	t.Helper()
	m, _ := LookupModel("llama-3.1-8b")
	g, _ := LookupGPU("h200")
	g.HBMBytesPerS = 0 // no pass floor: see testPlanner
	cfg := PlannerConfig{Model: m, GPU: g, TP: 1, BlockTokens: 16, MaxBlocks: 64}
	cfg.Paths[TierHost] = DirectPath(nvme.Ingress)
	cfg.Paths[TierNVMe] = nvme
	return cfg
}

// TestCodecRejectsModelAndBlocks: a codec that reads bf16 refuses a model
// that caches fp8, and a scenario with a codec needs its block size.
func TestCodecRejectsModelAndBlocks(t *testing.T) {
	p := DirectPath(Link{Name: "l", BandwidthBytesPerS: 1e9})
	p.Codec = fp8(t)
	s := testCodecScenario(t, p)
	s.Model.Dtype = FP8
	var fe *FieldError
	if err := s.Validate(); !errors.As(err, &fe) || fe.Field != "dtype" || !strings.Contains(err.Error(), "fp8-e4m3") {
		t.Errorf("fp8 model: %v", err)
	}
	cfg := testCodecPlannerConfig(t, p)
	cfg.Model.Dtype = FP8
	if _, err := NewPlanner(cfg); !errors.As(err, &fe) || fe.Field != "dtype" {
		t.Errorf("planner, fp8 model: %v", err)
	}
	s = testCodecScenario(t, p)
	s.BlockTokens = 0
	if err := s.Validate(); !errors.As(err, &fe) || fe.Field != "block_tokens" {
		t.Errorf("no block tokens: %v", err)
	}
	// Without a codec the block size is not needed.
	s.Path.Codec = Codec{}
	if err := s.Validate(); err != nil {
		t.Errorf("no codec, no block tokens: %v", err)
	}
}

// TestScenarioCodecReload: a compressed reload is the encoded bytes on
// the path, overlapped with the decode, plus one chunk's decode.
func TestScenarioCodecReload(t *testing.T) {
	c := fp8(t)
	drive := Link{Name: "drive", BandwidthBytesPerS: 3e9, Latency: 80 * time.Microsecond}
	raw := DirectPath(drive)
	enc := raw
	enc.Codec = c
	sr, se := testCodecScenario(t, raw), testCodecScenario(t, enc)
	if err := se.Validate(); err != nil {
		t.Fatal(err)
	}
	if got := se.Path.Name(); got != "drive (fp8-e4m3)" {
		t.Errorf("name %q", got)
	}
	const tokens = 4096 // 256 blocks, 32 chunks
	rawBytes := sr.Model.KVBytesPerToken() * tokens
	encBytes := int64(256 * (2048 + 1048576))
	if se.WireBytes(tokens) != encBytes || sr.WireBytes(tokens) != rawBytes {
		t.Fatalf("wire bytes %d and %d", se.WireBytes(tokens), sr.WireBytes(tokens))
	}
	want := 80e-6 + float64(encBytes)/3e9 + float64(8*2097152)/1.12e12
	if got := se.ReloadTime(tokens).Seconds(); math.Abs(got-want) > 1e-9 {
		t.Errorf("compressed reload %g s, want %g", got, want)
	}
	ratio := se.ReloadTime(tokens).Seconds() / sr.ReloadTime(tokens).Seconds()
	if ratio < 0.5 || ratio > 0.52 {
		t.Errorf("compressed/raw reload %.3f over a 3 GB/s drive, want about a half", ratio)
	}
	// A short reload decodes its one chunk: no more than its own tokens.
	want = 80e-6 + float64(2048+1048576)/3e9 + 2097152/1.12e12
	if got := se.ReloadTime(16).Seconds(); math.Abs(got-want) > 1e-9 {
		t.Errorf("one block: %g s, want %g", got, want)
	}
	// Decode-bound: a link faster than the decode sets the rate at the
	// decode's.
	fast := enc
	fast.Ingress.BandwidthBytesPerS = 5e12
	sf := testCodecScenario(t, fast)
	want = 80e-6 + float64(rawBytes)/1.12e12 + float64(8*2097152)/1.12e12
	if got := sf.ReloadTime(tokens).Seconds(); math.Abs(got-want) > 1e-9 {
		t.Errorf("decode-bound: %g s, want %g", got, want)
	}
}

// TestBreakEvenWithCodecAgainstScan: the break-even with a codec is still
// the least n where reload wins, and compression brings it down on a slow
// path.
func TestBreakEvenWithCodecAgainstScan(t *testing.T) {
	c := fp8(t)
	for _, tc := range []struct {
		gbps float64
		lat  time.Duration
		bt   int
	}{{3, 2 * time.Millisecond, 16}, {0.47, 100 * time.Microsecond, 16}, {55.3, 2 * time.Microsecond, 16}, {3, time.Millisecond, 7}, {5000, 2 * time.Millisecond, 16}} {
		raw := DirectPath(Link{Name: "l", BandwidthBytesPerS: tc.gbps * 1e9, Latency: tc.lat})
		enc := raw
		enc.Codec = c
		sr, se := testCodecScenario(t, raw), testCodecScenario(t, enc)
		sr.BlockTokens, se.BlockTokens = tc.bt, tc.bt
		for _, attn := range []bool{false, true} {
			n, ok := se.BreakEven(attn)
			want := -1
			for k := 1; k <= 1<<17; k++ {
				if se.reloadSeconds(k) <= se.recomputeSeconds(k, 0, attn) {
					want = k
					break
				}
			}
			if want == -1 {
				if ok && n <= 1<<17 {
					t.Errorf("%+v attn=%v: break-even %d, scan finds none below 2^17", tc, attn, n)
				}
				continue
			}
			if !ok || n != want {
				t.Errorf("%+v attn=%v: break-even %d (ok %v), scan %d", tc, attn, n, ok, want)
			}
			if nr, okr := sr.BreakEven(attn); okr && nr < n && tc.gbps < 100 {
				t.Errorf("%+v attn=%v: compressed break-even %d above the raw %d", tc, attn, n, nr)
			}
		}
	}
}
