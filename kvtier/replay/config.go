package replay

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"reflect"
	"sort"
	"strconv"
	"strings"
	"time"

	"kvtier.dev/internal/bytesize"
	"kvtier.dev/kvtier/costplan"
)

// Config is what a replay models: the model and GPU (kvtier/cost presets),
// the tiers, their links, the policy, and the request's timing. Every field
// has a JSON name, the name its errors use; LoadConfig reads it strictly.
type Config struct {
	// Model is a kvtier/cost model preset, e.g. "llama-3.1-8b".
	Model string `json:"model"`
	// GPU is a kvtier/cost GPU preset, e.g. "h200".
	GPU string `json:"gpu"`
	// TP is the tensor-parallel degree: prefill runs TP times faster, and
	// each GPU holds 1/TP of every block.
	TP int `json:"tp"`
	// BlockTokens is the tokens per block; 0 takes the trace's (512 for
	// Mooncake traces). It must match the trace's.
	BlockTokens int `json:"block_tokens"`

	// GPUMemoryBytes, when not 0, replaces the GPU preset's memory (141 GB
	// for an H200), e.g. 94 GB for an H100 NVL.
	GPUMemoryBytes Bytes `json:"gpu_memory"`
	// GPUBytes is the GPU memory given to the KV cache, e.g. 40 GiB:
	// with Llama-3.1-8B's 64 MiB blocks of 512 tokens, 640 blocks. It and
	// the model's weights (per GPU) must fit in the GPU's memory.
	GPUBytes Bytes `json:"gpu_bytes"`
	// HostBytes is the pinned host tier, e.g. 256 GiB; 0 means none.
	HostBytes Bytes `json:"host_bytes"`
	// NVMeBytes is the NVMe tier, e.g. 2 TiB; 0 means none.
	NVMeBytes Bytes `json:"nvme_bytes"`
	// HostLink is the kvtier/cost link between host memory and the GPU,
	// e.g. "pcie5-pinned" (50 GB/s, 3 us).
	HostLink string `json:"host_link"`
	// NVMeLink is the drive: a link preset, e.g. "nvme-gen5" or
	// "nvme-gen4-x4" (four drives striped), whose writes go at its read
	// rate; or a file `kvtier probe --nvme DIR --json FILE` wrote (a path:
	// it holds a "/" or ends in ".json"), with the drive's measured read
	// and write rates. Reads and writes share the drive, reads first.
	NVMeLink string `json:"nvme_link"`
	// NVMeWrites is "gated" (the default: a block is written to NVMe only
	// when a load of it would beat recomputing it, within the drive's
	// write budget: costplan.Gate, as a server runs it) or "all" (every
	// admitted block, the drive's queue bounded by bytes alone).
	NVMeWrites string `json:"nvme_writes,omitempty"`
	// NVMeWriteShare is the share of the drive's write rate the gated
	// writes may use (costplan.GateConfig.WriteShare); 0 means 0.5.
	NVMeWriteShare float64 `json:"nvme_write_share,omitempty"`
	// NVMeDWPD bounds the gated writes to this many drive writes a day of
	// NVMeBytes (0: no endurance limit).
	NVMeDWPD float64 `json:"nvme_dwpd,omitempty"`
	// NVMePersist makes the gate write blocks a load would not be worth,
	// within the budgets (a tier kept across restarts).
	NVMePersist bool `json:"nvme_persist,omitempty"`
	// HostCodec, NVMeCodec and RemoteCodec are how the host, NVMe and
	// remote tiers hold blocks, as the server's -host-codec: "" (as the
	// GPU does) or a kvtier/cost codec preset, "fp8-e4m3" (about half the
	// bytes: a 64 MiB block of Llama-3.1-8B's 512 tokens is 32.03 MiB, so
	// a 256 GiB host tier holds 7,992 blocks instead of 4,096). The tiers
	// that exist share one codec for now; the remote tier follows the
	// host tier's unless RemoteCodec is given (codec.go). HostCodec
	// "auto" is the server's default: the codec cost.ChooseCodec says
	// pays over the host link within CodecErrorBudget (the other two
	// empty: they follow it).
	HostCodec   string `json:"host_codec,omitempty"`
	NVMeCodec   string `json:"nvme_codec,omitempty"`
	RemoteCodec string `json:"remote_codec,omitempty"`
	// CodecErrorBudget is HostCodec auto's budget, as the server's
	// -codec-error-budget (nil: cost.DefaultErrorBudget).
	CodecErrorBudget *float64 `json:"codec_error_budget,omitempty"`
	// PrefetchBlocks is how many of its NVMe blocks a request that waits
	// for the GPU has copied into the host tier while it waits
	// (kvtier.Manager.PrefetchKeys), as the model server's
	// -prefetch-blocks; 0: none.
	PrefetchBlocks int `json:"prefetch_blocks,omitempty"`

	// Policy is every tier's eviction policy: "lru", "s3fifo", "2q" or
	// "cost-aware".
	Policy string `json:"policy"`
	// WriteThrough copies each block to the next tier as soon as it is
	// ready; otherwise blocks are demoted when evicted (write-back).
	WriteThrough bool `json:"write_through"`
	// NVMeAdmission is "all" or "seen-twice" (a block enters NVMe only once
	// it has been asked for twice, sparing the drive).
	NVMeAdmission string `json:"nvme_admission"`

	// DecodeTokenTime is the time per output token while decoding, e.g.
	// "30ms"; a request holds its blocks in the GPU until it is done.
	// With DecodeOnGPU it is the GPU time of one decode step of one
	// request.
	DecodeTokenTime Duration `json:"decode_token_time"`
	// HandlingTime and HandlingTokenTime are a request's time outside the
	// GPU and its copies, per request and per prompt token: the HTTP round
	// trip, encoding and parsing the prompt, tokenizing, the cache's
	// bookkeeping. Each TTFT includes HandlingTime + prompt tokens ×
	// HandlingTokenTime; the replay runs it beside the GPU (a model
	// server parses requests while it computes others), so it delays no
	// other request. A served run gives them: `benchmarks/serve/report
	// -handling LABEL` fits each request's TTFT less the server's queue
	// and forward passes (the server_timing examples/server reports). 0:
	// none (the replay's times are the GPU's and the links' alone).
	HandlingTime      Duration `json:"handling_time,omitempty"`
	HandlingTokenTime Duration `json:"handling_token_time,omitempty"`
	// MaxOutputTokens, when above 0, caps every request's output tokens,
	// as `kvtier bench-serve --max-tokens` caps the max_tokens it sends, so
	// that a replay and a measured run of one trace decode the same; 0
	// keeps the trace's.
	MaxOutputTokens int `json:"max_output_tokens,omitempty"`
	// PrefillSlots is how many requests prefill at once, each with the
	// GPU's full compute to itself (the loads of all share the GPU's
	// link): 1 models one GPU serving the trace (prefills queue); 0 gives
	// every request a GPU of its own (no queueing for compute).
	PrefillSlots int `json:"prefill_slots"`
	// DecodeOnGPU runs decode on the prefill slot's GPU, as the project's
	// model server (examples/server) schedules it: the GPU alternates one
	// prefill and one decode round, a step of DecodeTokenTime for every
	// request decoding, back to back in the order they started; the next
	// queued prefill starts after the round, and while nothing is queued
	// the rounds go on back to back. A request's first token comes at the
	// end of its prefill, each of its others from a round, starting with
	// the round right after its prefill. It needs PrefillSlots 1. false:
	// decode takes no GPU time, and only delays each request's end.
	DecodeOnGPU bool `json:"decode_on_gpu,omitempty"`
	// MaxBatch, with DecodeOnGPU, is the most requests decoding at once
	// (the server's -max-batch): while that many decode, no prefill
	// starts. 0 means 16, the server's default.
	MaxBatch int `json:"max_batch,omitempty"`

	// MaxHoleBlocks lets a lookup go on past up to this many missing
	// blocks (kvtier.Config.MaxHoleBlocks): the holes are recomputed and
	// the cached blocks after them loaded (or recomputed, as the plan
	// says). 0 stops a lookup at the first missing block.
	MaxHoleBlocks int `json:"max_hole_blocks"`

	// Mover is what makes the copies between the GPU and the host tier:
	// "device" runs the code that serves, kvtier.DeviceMover over a
	// transfer.Engine, on cudastream's simulated device with a virtual
	// clock (device.go); "model" queues them on the replay's own modelled
	// channels (link.go), a little faster to run. The NVMe drive is
	// modelled under both (under "device" a load from it then crosses the
	// GPU's ingress on the device).
	Mover string `json:"mover"`

	// Strategy is the strategy the report leads with: "cost" (kvtier/cost's
	// per-block plan), "reload", "recompute", "gpu-only" or "none".
	Strategy string `json:"strategy"`
	// Baselines also replays the trace under the other strategies.
	Baselines bool `json:"baselines"`

	// Calibration is a calibration file (kvtier/cost: `kvtier calc
	// --write-calibration`, a server's, or `kvtier probe --json`), e.g.
	// "h200.json": its fitted prefill terms and links replace the presets,
	// for the planner and for the replay's own timing alike, so that the
	// replay runs at the measured rates. "" uses the presets.
	Calibration string `json:"calibration"`

	// MemoryBudget bounds the memory of the requests in flight (arrived
	// and not done), e.g. "4GiB": their live heap as the replay estimates
	// it, about 0.3 KiB for a request of 16 blocks while it waits and 3 KiB
	// once it starts (its leases), twice over for the collector's
	// headroom. The trace is read lazily, so this is what grows when the
	// modelled server falls behind or the trace bursts (300,000 requests of
	// 16 blocks at one timestamp: about 0.1 GiB live); a strategy that
	// passes the budget stops with an error that says so, the others are
	// reported (Run), and the report gives the peak. 0 means no limit.
	MemoryBudget Bytes `json:"memory_budget"`

	// Tenants gives trace salts eviction of their own (TenantQuota,
	// kvtier.Config.Tenants): [{"salt": 2, "gpu_bytes": "8GiB"}]. The
	// report then has a row per salt (StrategyResult.Tenants).
	Tenants []TenantQuota `json:"tenants,omitempty"`
}

// DefaultConfig is Llama-3.1-8B on one H200 (16 GB of weights) with 40 GiB
// of KV cache, a 256 GiB host tier over PCIe 5.0 and a 2 TiB tier on one
// PCIe 4.0 NVMe drive, LRU, write-through, seen-twice NVMe admission, 30 ms
// per output token, one prefill at a time. One GPU keeps up with the
// bundled trace under it (a quarter of its prefill capacity without a
// prefix cache); a 70B model needs tp 8 for that.
func DefaultConfig() Config {
	return Config{
		Model:           "llama-3.1-8b",
		GPU:             "h200",
		TP:              1,
		GPUBytes:        40 << 30,
		HostBytes:       256 << 30,
		NVMeBytes:       2 << 40,
		HostLink:        "pcie5-pinned",
		NVMeLink:        "nvme-gen4",
		Policy:          "lru",
		WriteThrough:    true,
		NVMeAdmission:   "seen-twice",
		PrefetchBlocks:  256,
		DecodeTokenTime: Duration(30 * time.Millisecond),
		PrefillSlots:    1,
		Mover:           MoverDevice,
		Strategy:        "cost",
		Baselines:       true,
		MemoryBudget:    4 << 30,
	}
}

// The movers of Config.Mover.
const (
	MoverDevice = "device"
	MoverModel  = "model"
)

// defaultMaxBatch is Config.MaxBatch's 0: the model server's -max-batch
// default.
const defaultMaxBatch = 16

// maxBatch is the most requests decoding at once with DecodeOnGPU.
func (c *Config) maxBatch() int {
	if c.MaxBatch == 0 {
		return defaultMaxBatch
	}
	return c.MaxBatch
}

// ConfigError names the Config field (by its JSON name) that is wrong.
type ConfigError struct {
	Field string
	Msg   string
}

func (e *ConfigError) Error() string { return "replay: config: " + e.Field + ": " + e.Msg }

func cfgErr(field, format string, args ...any) error {
	return &ConfigError{Field: field, Msg: fmt.Sprintf(format, args...)}
}

// LoadConfig reads a JSON config over DefaultConfig: fields it names
// replace the defaults. Unknown fields, values of the wrong type and
// trailing data are errors that name the field.
func LoadConfig(r io.Reader) (Config, error) {
	data, err := io.ReadAll(io.LimitReader(r, 1<<20+1))
	if err != nil {
		return DefaultConfig(), fmt.Errorf("replay: config: %w", err)
	}
	if len(data) > 1<<20 {
		return DefaultConfig(), errors.New("replay: config: larger than 1 MiB")
	}
	d := json.NewDecoder(bytes.NewReader(data))
	var fields map[string]json.RawMessage
	if err := d.Decode(&fields); err != nil {
		return DefaultConfig(), fmt.Errorf("replay: config: want a JSON object: %w", err)
	}
	if _, err := d.Token(); err != io.EOF {
		return DefaultConfig(), errors.New("replay: config: data after the JSON object")
	}
	if fields == nil {
		return DefaultConfig(), errors.New("replay: config: want a JSON object, found null")
	}
	cfg := DefaultConfig()
	v := reflect.ValueOf(&cfg).Elem()
	byName := map[string]int{}
	for i := range v.NumField() {
		name, _, _ := strings.Cut(v.Type().Field(i).Tag.Get("json"), ",")
		byName[name] = i
	}
	names := make([]string, 0, len(fields))
	for name := range fields {
		names = append(names, name)
	}
	sort.Strings(names) // the first bad field, in a stable order
	for _, name := range names {
		i, ok := byName[name]
		if !ok {
			return DefaultConfig(), cfgErr(name, "unknown field")
		}
		if bytes.Equal(bytes.TrimSpace(fields[name]), []byte("null")) {
			return DefaultConfig(), cfgErr(name, "null: give a value, or leave the field out for its default")
		}
		fd := json.NewDecoder(bytes.NewReader(fields[name]))
		fd.DisallowUnknownFields() // in nested objects too (tenants)
		if err := fd.Decode(v.Field(i).Addr().Interface()); err != nil {
			var te *json.UnmarshalTypeError
			if errors.As(err, &te) {
				return DefaultConfig(), cfgErr(name, "want a %v, found a JSON %s", te.Type, te.Value)
			}
			return DefaultConfig(), cfgErr(name, "%v", err)
		}
	}
	if err := cfg.Validate(); err != nil {
		return DefaultConfig(), err
	}
	return cfg, nil
}

// Validate checks the fields that need no preset lookup; New checks the
// presets.
func (c *Config) Validate() error {
	switch {
	case c.TP < 1 || c.TP > 1024:
		return cfgErr("tp", "%d is not in [1, 1024]", c.TP)
	case c.BlockTokens < 0 || c.BlockTokens > 1<<16:
		return cfgErr("block_tokens", "%d is not in [0, 65536]", c.BlockTokens)
	case c.GPUMemoryBytes < 0:
		return cfgErr("gpu_memory", "%v is negative", c.GPUMemoryBytes)
	case c.GPUBytes <= 0:
		return cfgErr("gpu_bytes", "%v: the GPU tier must have a capacity", c.GPUBytes)
	case c.MaxOutputTokens < 0:
		return cfgErr("max_output_tokens", "%d is negative", c.MaxOutputTokens)
	case c.HostBytes < 0:
		return cfgErr("host_bytes", "%v is negative", c.HostBytes)
	case c.NVMeBytes < 0:
		return cfgErr("nvme_bytes", "%v is negative", c.NVMeBytes)
	case c.DecodeTokenTime < 0:
		return cfgErr("decode_token_time", "%v is negative", c.DecodeTokenTime)
	case c.HandlingTime < 0:
		return cfgErr("handling_time", "%v is negative", c.HandlingTime)
	case c.HandlingTokenTime < 0:
		return cfgErr("handling_token_time", "%v is negative", c.HandlingTokenTime)
	case c.PrefillSlots < 0:
		return cfgErr("prefill_slots", "%d is negative", c.PrefillSlots)
	case c.DecodeOnGPU && c.PrefillSlots != 1:
		return cfgErr("decode_on_gpu", "needs prefill_slots 1 (decode shares one GPU with its prefills), found %d", c.PrefillSlots)
	case c.MaxBatch < 0:
		return cfgErr("max_batch", "%d is negative (0: 16, the server's default)", c.MaxBatch)
	case c.MaxBatch > 0 && !c.DecodeOnGPU:
		return cfgErr("max_batch", "%d without decode_on_gpu: it bounds the requests decoding on the GPU", c.MaxBatch)
	case c.MaxHoleBlocks < 0:
		return cfgErr("max_hole_blocks", "%d is negative", c.MaxHoleBlocks)
	case c.MemoryBudget < 0:
		return cfgErr("memory_budget", "%v is negative (0: no limit)", c.MemoryBudget)
	}
	if _, err := costplan.ParseStrategy(c.Strategy); err != nil {
		return cfgErr("strategy", "%v", err)
	}
	if err := c.validateTenants(); err != nil {
		return err
	}
	switch c.Policy {
	case "lru", "s3fifo", "2q", "cost-aware":
	default:
		return cfgErr("policy", "%q is not lru, s3fifo, 2q or cost-aware", c.Policy)
	}
	switch c.NVMeAdmission {
	case "all", "seen-twice":
	default:
		return cfgErr("nvme_admission", "%q is not all or seen-twice", c.NVMeAdmission)
	}
	switch {
	case c.NVMeWrites != "" && c.NVMeWrites != "gated" && c.NVMeWrites != "all":
		return cfgErr("nvme_writes", "%q is not gated or all", c.NVMeWrites)
	case c.NVMeWriteShare < 0 || c.NVMeWriteShare > 1:
		return cfgErr("nvme_write_share", "%g is not in [0, 1]", c.NVMeWriteShare)
	case c.NVMeDWPD < 0:
		return cfgErr("nvme_dwpd", "%g is negative", c.NVMeDWPD)
	case c.PrefetchBlocks < 0:
		return cfgErr("prefetch_blocks", "%d is negative", c.PrefetchBlocks)
	}
	switch c.Mover {
	case MoverDevice, MoverModel:
	default:
		return cfgErr("mover", "%q is not device or model", c.Mover)
	}
	return c.checkCodecs()
}

// Bytes is a size in bytes. In JSON and flags it is an integer or a string
// with a unit: "40GiB", "2TiB", "512MB", "1.5GiB".
type Bytes int64

var byteUnits = []struct {
	suffix string
	mult   float64
}{
	{"KiB", 1 << 10}, {"MiB", 1 << 20}, {"GiB", 1 << 30}, {"TiB", 1 << 40},
	{"KB", 1e3}, {"MB", 1e6}, {"GB", 1e9}, {"TB", 1e12}, {"B", 1},
}

// ParseBytes parses "40GiB", "2TiB", "1e9" or "1000".
func ParseBytes(s string) (Bytes, error) {
	num, mult := strings.TrimSpace(s), 1.0
	for _, u := range byteUnits {
		if rest, ok := strings.CutSuffix(num, u.suffix); ok {
			num, mult = strings.TrimSpace(rest), u.mult
			break
		}
	}
	v, err := strconv.ParseFloat(num, 64)
	if err != nil || math.IsNaN(v) || math.IsInf(v, 0) {
		return 0, fmt.Errorf("%q is not a size (want e.g. 40GiB, 2TiB or a number of bytes)", s)
	}
	b := v * mult
	if b < 0 || b >= math.MaxInt64 {
		return 0, fmt.Errorf("%q is out of range", s)
	}
	return Bytes(b), nil
}

// String writes the size with the largest binary unit that divides it.
func (b Bytes) String() string { return bytesize.Format(int64(b)) }

// Set implements flag.Value.
func (b *Bytes) Set(s string) error {
	v, err := ParseBytes(s)
	if err != nil {
		return err
	}
	*b = v
	return nil
}

// MarshalJSON writes the size as a string with its unit.
func (b Bytes) MarshalJSON() ([]byte, error) { return json.Marshal(b.String()) }

// UnmarshalJSON reads an integer or a string with a unit.
func (b *Bytes) UnmarshalJSON(data []byte) error {
	if len(data) > 0 && data[0] == '"' {
		var s string
		if err := json.Unmarshal(data, &s); err != nil {
			return err
		}
		return b.Set(s)
	}
	var n int64
	if err := json.Unmarshal(data, &n); err != nil {
		return fmt.Errorf("%s is not a size (want e.g. \"40GiB\" or a number of bytes)", data)
	}
	*b = Bytes(n)
	return nil
}

// Duration is a time.Duration written as "30ms" in JSON and flags.
type Duration time.Duration

// String implements flag.Value.
func (d Duration) String() string { return time.Duration(d).String() }

// Set implements flag.Value.
func (d *Duration) Set(s string) error {
	v, err := time.ParseDuration(s)
	if err != nil {
		return err
	}
	*d = Duration(v)
	return nil
}

// MarshalJSON writes the duration as a string.
func (d Duration) MarshalJSON() ([]byte, error) { return json.Marshal(d.String()) }

// UnmarshalJSON reads a string such as "30ms".
func (d *Duration) UnmarshalJSON(data []byte) error {
	var s string
	if err := json.Unmarshal(data, &s); err != nil {
		return fmt.Errorf("%s is not a duration (want e.g. \"30ms\")", data)
	}
	return d.Set(s)
}
