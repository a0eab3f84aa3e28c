package replay

import (
	"slices"
	"strings"
	"testing"

	"kvtier.dev/kvtier"
	"kvtier.dev/kvtier/cost"
)

// TestCodecReplay: with the host and NVMe tiers in fp8-e4m3 the same bytes
// hold the blocks of cost.Codec.EncodedBlockBytes (about twice as many),
// the GPU tier is unchanged, and under Mover "device" the engine codes
// every copy through its codec path, with no failure.
func TestCodecReplay(t *testing.T) {
	src, _ := bundled()
	cfg := testConfig()
	cfg.Baselines = false
	plain := replayEngine(t, src, cfg)
	cfg.HostCodec, cfg.NVMeCodec = "fp8-e4m3", "fp8-e4m3"
	fp8 := replayEngine(t, src, cfg)

	cc, err := cost.LookupCodec("fp8-e4m3")
	if err != nil {
		t.Fatal(err)
	}
	stored := cc.EncodedBlockBytes(&fp8.model, fp8.bt, cfg.TP)
	if fp8.stored != stored || stored >= plain.blockBytes {
		t.Fatalf("blocks of %d bytes stored as %d, want %d", plain.blockBytes, fp8.stored, stored)
	}
	pc, fc := plain.res.CapacityBlocks, fp8.res.CapacityBlocks
	if fc[kvtier.GPU] != pc[kvtier.GPU] {
		t.Errorf("GPU tier: %d blocks with the codec, %d without", fc[kvtier.GPU], pc[kvtier.GPU])
	}
	for _, tier := range []kvtier.Tier{kvtier.Host, kvtier.NVMe} {
		capacity := map[kvtier.Tier]Bytes{kvtier.Host: cfg.HostBytes, kvtier.NVMe: cfg.NVMeBytes}[tier]
		if want := int64(capacity) / stored; fc[tier] != want || 100*fc[tier] < 198*pc[tier] {
			t.Errorf("%v tier: %d blocks with the codec, %d without; want %d", tier, fc[tier], pc[tier], want)
		}
	}
	st := fp8.devStats
	if st.engine.CodecChunks == 0 || st.mover.Onboards == 0 || st.mover.Offloads == 0 || st.mover.Failures != 0 {
		t.Errorf("device path with the codec: engine %+v, mover %+v; want coded chunks, onboards and offloads, no failure", st.engine, st.mover)
	}
	if plain.devStats.engine.CodecChunks != 0 {
		t.Errorf("without a codec the engine coded %d chunks", plain.devStats.engine.CodecChunks)
	}
	// Fewer bytes cross the link: the device moved the encoded blocks.
	if got, want := st.engine.OffloadBytes, int64(st.mover.Offloads)*stored; got != want {
		t.Errorf("the device offloaded %d bytes for %d blocks, want %d (encoded)", got, st.mover.Offloads, want)
	}
}

// TestCodecConfigErrors: bad codecs are refused naming the field.
func TestCodecConfigErrors(t *testing.T) {
	for _, tc := range []struct {
		edit func(*Config)
		want string
	}{
		{func(c *Config) { c.HostCodec = "fp4" }, "host_codec"},
		{func(c *Config) { c.NVMeCodec = "fp4" }, "nvme_codec"},
		{func(c *Config) { c.RemoteCodec = "fp4" }, "remote_codec"},
		{func(c *Config) { c.HostCodec = "fp8-e4m3" }, `nvme_codec: "", but host_codec is "fp8-e4m3"`},
		{func(c *Config) { c.NVMeCodec = "fp8-e4m3" }, `nvme_codec: "fp8-e4m3", but host_codec is ""`},
		{func(c *Config) { c.NVMeBytes, c.NVMeCodec = 0, "fp8-e4m3" }, "nvme_codec: \"fp8-e4m3\" without that tier"},
		{func(c *Config) { c.HostCodec, c.NVMeCodec, c.RemoteCodec = "fp8-e4m3", "fp8-e4m3", "" }, ""},
		{func(c *Config) { c.RemoteCodec = "fp8-e4m3" }, "remote_codec"},
		{func(c *Config) { c.HostCodec = "auto" }, ""},
		{func(c *Config) { c.HostCodec, c.NVMeCodec = "auto", "fp8-e4m3" }, "nvme_codec: \"fp8-e4m3\" with host_codec auto"},
		{func(c *Config) { c.HostCodec, c.RemoteCodec = "auto", "fp8-e4m3" }, "remote_codec: \"fp8-e4m3\" with host_codec auto"},
		{func(c *Config) { b := 0.01; c.CodecErrorBudget = &b }, "codec_error_budget: without host_codec auto"},
		{func(c *Config) { b := 1.0; c.HostCodec, c.CodecErrorBudget = "auto", &b }, "codec_error_budget: 1: must be"},
	} {
		cfg := DefaultConfig()
		tc.edit(&cfg)
		err := cfg.Validate()
		if tc.want == "" {
			if err != nil {
				t.Errorf("%+v: %v", cfg, err)
			}
			continue
		}
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("Validate = %v, want an error naming %s", err, tc.want)
		}
	}
}

// TestCodecShapeRefused: a model whose heads the codec cannot code (a head
// of 72 values: the kernels want multiples of 16) is refused naming the
// field that asked for the codec.
func TestCodecShapeRefused(t *testing.T) {
	cc, err := cost.LookupCodec("fp8-e4m3")
	if err != nil {
		t.Fatal(err)
	}
	e := &engine{cfg: Config{TP: 1, HostCodec: "fp8-e4m3"}, codec: cc, bt: 16,
		model: cost.Model{Name: "odd", Layers: 4, QHeads: 8, KVHeads: 8, HeadDim: 72}}
	if err := e.checkCodecShape(); err == nil || !strings.Contains(err.Error(), "host_codec") || !strings.Contains(err.Error(), "HeadDim") {
		t.Fatalf("checkCodecShape = %v, want host_codec and HeadDim named", err)
	}
	e.model.HeadDim = 128
	if err := e.checkCodecShape(); err != nil {
		t.Fatal(err)
	}
}

// TestCodecAuto: host_codec auto replays as the codec cost.ChooseCodec
// picks for the host link, and says why: FP8 over PCIe 5 within the
// default budget (the same replay as naming it), none within a budget
// below its error (the same as none).
func TestCodecAuto(t *testing.T) {
	src, _ := bundled()
	base := testConfig()
	base.Baselines = false
	named := base
	named.HostCodec, named.NVMeCodec = "fp8-e4m3", "fp8-e4m3"
	auto := base
	auto.HostCodec = "auto"
	tight := auto
	b := 0.01
	tight.CodecErrorBudget = &b
	for _, tc := range []struct {
		name      string
		cfg, same Config
		reason    string
	}{
		{"default budget", auto, named, "within the budget"},
		{"budget 0.01", tight, base, "over the budget 0.01"},
	} {
		got, want := replayEngine(t, src, tc.cfg), replayEngine(t, src, tc.same)
		if !strings.Contains(got.res.CodecChoice, tc.reason) {
			t.Errorf("%s: codec choice %q, want it to say %q", tc.name, got.res.CodecChoice, tc.reason)
		}
		if got.codec.Name != want.codec.Name || got.res.CapacityBlocks != want.res.CapacityBlocks || !slices.Equal(got.ttfts, want.ttfts) {
			t.Errorf("%s: replayed as %q with %v blocks, want as %q with %v, TTFTs alike", tc.name, got.codec.Name, got.res.CapacityBlocks, want.codec.Name, want.res.CapacityBlocks)
		}
	}
}
