package main

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"slices"
	"strings"
	"time"

	"kvtier.dev/examples/server/internal/engine"
	"kvtier.dev/examples/server/internal/model"
	"kvtier.dev/internal/bytesize"
	"kvtier.dev/kvtier/cost"
	"kvtier.dev/kvtier/costplan"
	"kvtier.dev/kvtier/policy"
)

// config is the server's command line.
type config struct {
	addr        string
	device      string // auto, gpu or cpu
	modelName   string
	blockTokens int // 0: the model's (4 for tiny, 16 for the presets)
	context     int // 0: 1024 for tiny, 16384 for the presets
	seed        uint64

	gpuKVBytes   int64 // the cache's GPU tier
	scratchBytes int64 // 0: the longest sequence
	hostBytes    int64
	nvmeBytes    int64
	nvmeOff      bool   // -nvme 0 given: no NVMe tier
	nvmeDir      string // "": a temporary directory, removed at exit
	// The NVMe tier's writes: -nvme-admission, -nvme-writes and their
	// budgets, and the drive (-nvme-link: a probe's file; "": the
	// -cost-nvme preset, and a probe in the background).
	nvmeAdmission, nvmeWrites string
	nvmeWriteShare, nvmeDWPD  float64
	nvmePersist               bool
	nvmeLink                  string
	nvmeProbe                 bool
	strategy                  costplan.Strategy
	policy                    string
	maxHoles                  int // kvtier.Options.MaxHoleBlocks
	prefetchBlocks            int // engine.Config.PrefetchBlocks
	// tenants are -tenant-quota's limits, one a flag.
	tenants tenantLimits
	// gatherStaging is kvtier.Options.GatherStaging; gatherStagingSet says
	// whether the flag was given (the CPU backend then uses it too).
	gatherStaging    int64
	gatherStagingSet bool
	remote           string // Redis Cluster nodes, comma separated; "": no remote tier
	remotePrefix     string
	// The remote tier's protections: its ACL user, files holding its
	// password and checksum key, and TLS (-remote-tls, its CA and this
	// client's certificate and key).
	remoteUser, remotePasswordFile, remoteChecksumKeyFile string
	remoteTLS                                             bool
	remoteTLSCA, remoteTLSCert, remoteTLSKey              string
	remoteFetchTimeout, remoteOpTimeout                   time.Duration
	nvmeReformat                                          bool // stack.Options.NVMeReformat
	codecs                                                codecFlags

	costGPU, costLink, costNVMe string
	costCalibration             string // a calibration file; "": the presets
	costCalibrationOut          string // where to write the calibration at shutdown; "": nowhere
	costLearn                   bool   // feed the calibration the engine's measurements

	serveWhilePinning bool // listen before the host tier is registered
	exactRows         bool // gpu.Options.ExactRows
	layerWait         engine.LayerWait
	warmUp            bool // run gpu.Model.WarmUp before listening

	// The cache's events: the ring's size (-kv-events-buffer, 0: none),
	// and vLLM's wire format on ZMQ (-kv-events-zmq, -kv-events-replay).
	kvEventBuffer               int
	kvEventsZMQ, kvEventsReplay string
	kvEventsTopic               string
	kvEventsReplayBatches       int

	maxQueue, maxBatch, defaultMaxTokens int
	drainTimeout                         time.Duration
	http                                 httpFlags
	admin                                adminFlags

	log *slog.Logger
}

// defaultGatherStaging is -gather-staging's default: 3 buffers of 16 MiB
// each way, as the H200 measurements of the gather/scatter path used.
const defaultGatherStaging = 96 << 20

// byteFlag is a flag.Value of bytes in bytesize's units.
type byteFlag struct{ p *int64 }

func (b byteFlag) String() string {
	if b.p == nil || *b.p == 0 {
		return "0"
	}
	return bytesize.Format(*b.p)
}

func (b byteFlag) Set(s string) error {
	if s == "0" {
		*b.p = 0
		return nil
	}
	n, err := bytesize.Parse(s)
	if err != nil {
		return err
	}
	*b.p = n
	return nil
}

// parseArgs reads the flags; an argument that is not a flag is an error.
func parseArgs(args []string, stderr io.Writer) (config, error) {
	c := config{gpuKVBytes: 0, log: slog.New(slog.NewTextHandler(stderr, nil))}
	fs := flag.NewFlagSet("server", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.StringVar(&c.addr, "addr", "127.0.0.1:8080", "listen address (loopback by default; 127.0.0.1:0 picks a free port and logs it)")
	fs.StringVar(&c.device, "device", "auto", "auto (GPU 0 if there is one, else the CPU), gpu or cpu (the CPU reference model over the simulated device)")
	fs.StringVar(&c.modelName, "model", "tiny", "model shape: tiny, llama-3.1-8b, llama-3.2-1b, qwen2.5-7b (seeded weights)")
	fs.IntVar(&c.blockTokens, "block-tokens", 0, "tokens per KV block (0: 4 for tiny, 16 for the presets)")
	fs.IntVar(&c.context, "context", 0, "longest sequence, prompt plus max_tokens (0: 1024 for tiny, 16384 for the presets)")
	fs.Uint64Var(&c.seed, "seed", 1, "seed of the model's weights")
	fs.Var(byteFlag{&c.gpuKVBytes}, "gpu-kv", "GPU memory for the prefix cache (kvtier's GPU tier), e.g. 4GiB (0: 256 blocks)")
	fs.Var(byteFlag{&c.scratchBytes}, "scratch", "GPU memory for what the cache does not hold (partial blocks, generated tokens, blocks with no GPU slot), at least the longest sequence's (0: twice that)")
	c.hostBytes, c.nvmeBytes = 0, 0
	fs.Var(byteFlag{&c.hostBytes}, "host", "pinned host tier, e.g. 32GiB (0: 4 times the GPU tier)")
	fs.Var(byteFlag{&c.nvmeBytes}, "nvme", "NVMe tier, e.g. 256GiB (0: no NVMe tier; unset: 16 times the GPU tier)")
	fs.StringVar(&c.nvmeAdmission, "nvme-admission", "seen-twice", "which blocks the NVMe tier takes: seen-twice (blocks two requests used) or all")
	fs.StringVar(&c.nvmeWrites, "nvme-writes", "gated", "NVMe writes: gated (only blocks a load from the drive would beat recomputing, within -nvme-write-share and -nvme-dwpd, never more than 100 ms of writes queued) or all (every admitted block)")
	fs.Float64Var(&c.nvmeWriteShare, "nvme-write-share", 0.5, "with -nvme-writes gated: the share of the drive's measured write rate the tier's writes may use")
	fs.Float64Var(&c.nvmeDWPD, "nvme-dwpd", 0, "with -nvme-writes gated: drive writes per day of -nvme the tier may make (e.g. 1; 0: no endurance limit)")
	fs.BoolVar(&c.nvmePersist, "nvme-persist", false, "with -nvme-writes gated: also write blocks a load would not be worth now, within the budgets, for a restart over -nvme-dir, and at shutdown write the whole cache down (without it, gated writes flush nothing at shutdown when the drive is worth no load)")
	fs.StringVar(&c.nvmeLink, "nvme-link", "", "the drive under -nvme-dir as kvtier probe --nvme DIR --json FILE measured it (its read and write rates for the cost model and the write budget); default: the -cost-nvme preset, then a short probe of the drive in the background")
	fs.BoolVar(&c.nvmeProbe, "nvme-probe", true, "without -nvme-link: probe the drive in the background at start (64 MiB written and read back) and use its rates until the tier's own I/O measures them")
	fs.StringVar(&c.nvmeDir, "nvme-dir", "", "keep the NVMe tier in this directory (this user's only, created 0700) so that a restart adopts its blocks (default: a temporary directory, removed at exit)")
	strategy := fs.String("strategy", "cost", "how the cache is used: cost (load or recompute, per the cost model), reload, recompute, gpu-only or none (the server as its own baseline)")
	fs.StringVar(&c.policy, "policy", "lru", "eviction policy of every tier: "+strings.Join(policy.Names, ", "))
	fs.Var(tenantFlag{&c.tenants}, "tenant-quota", "a tenant's limits, repeatable: USER[/SALT]=gpu:N,host:N,nvme:N,weight:W (N blocks, 0: no cap; W its share of a full tier against the other tenants together, default 1): its flood evicts its own blocks first")
	fs.StringVar(&c.costGPU, "cost-gpu", "h200", "GPU preset of the cost model (kvtier calc's names)")
	fs.StringVar(&c.costLink, "cost-link", "pcie5-pinned", "host-GPU link preset of the cost model")
	fs.StringVar(&c.costNVMe, "cost-nvme", "nvme-gen4", "NVMe link preset of the cost model")
	fs.StringVar(&c.costCalibration, "cost-calibration", "", "a calibration file of the -cost-gpu (kvtier calc --write-calibration, or kvtier probe --json): its measured prefill and links replace the presets' in the cost model")
	fs.BoolVar(&c.costLearn, "cost-learn", true, "the cost model learns from this server's prefills and host loads (its calibration starts from -cost-calibration, or the presets)")
	fs.StringVar(&c.costCalibrationOut, "cost-calibration-out", "", "at shutdown, write the calibration (what -cost-learn learned) to this file, for the next start's -cost-calibration or kvtier replay --calibration")
	c.gatherStaging = defaultGatherStaging
	fs.Var(byteFlag{&c.gatherStaging}, "gather-staging", "GPU memory for the copy engine's gather/scatter path, which moves a transfer of consecutive host slots in a few large or strided DMAs (0: none; the CPU backend uses none unless this is given)")
	fs.IntVar(&c.maxHoles, "max-hole-blocks", 0, "a lookup goes on past up to this many missing blocks, which are recomputed while the cached ones after them load (0: it stops at the first)")
	fs.IntVar(&c.prefetchBlocks, "prefetch-blocks", 256, "a request that waits for the GPU has up to this many of its NVMe blocks copied into the host tier meanwhile, so that its prefill loads them from there (0: none)")
	fs.StringVar(&c.remote, "remote", "", "the shared remote tier: Redis Cluster nodes, comma separated (host:port); blocks missing here are fetched from it, blocks seen twice published to it")
	fs.StringVar(&c.remotePrefix, "remote-prefix", "kvtier:", "with -remote: this deployment's key prefix in the cluster (bound to this model: a prefix another model wrote is refused)")
	fs.StringVar(&c.remoteUser, "remote-user", "", "with -remote: the cluster's ACL user, limited to -remote-prefix (default: the default user)")
	fs.StringVar(&c.remotePasswordFile, "remote-password-file", "", "with -remote: a file (mode 0600) holding the ACL user's password, or requirepass's (one trailing newline is dropped)")
	fs.StringVar(&c.remoteChecksumKeyFile, "remote-checksum-key-file", "", "with -remote: a file (mode 0600) holding the deployment's checksum key, at least 16 bytes (one trailing newline is dropped), the same on every server: values written without it are never served (without it anyone who can write the prefix can forge blocks)")
	fs.BoolVar(&c.remoteTLS, "remote-tls", false, "with -remote: connect with TLS, verifying the nodes against the system's roots (or -remote-tls-ca)")
	fs.StringVar(&c.remoteTLSCA, "remote-tls-ca", "", "with -remote: TLS, verifying the nodes against the CA certificates in this PEM file")
	fs.StringVar(&c.remoteTLSCert, "remote-tls-cert", "", "with -remote: TLS, with this PEM client certificate (and -remote-tls-key)")
	fs.StringVar(&c.remoteTLSKey, "remote-tls-key", "", "with -remote: the PEM key of -remote-tls-cert (mode 0600)")
	fs.DurationVar(&c.remoteOpTimeout, "remote-op-timeout", 500*time.Millisecond, "with -remote: each read's and write's deadline on the cluster (a node that does not answer in it counts towards the breaker)")
	fs.DurationVar(&c.remoteFetchTimeout, "remote-fetch-timeout", time.Second, "with -remote: the most a request waits for its blocks from the remote tier (fetched while it waits in line, off the model's goroutine: other requests prefill and decode meanwhile); then it recomputes what did not come")
	fs.BoolVar(&c.nvmeReformat, "nvme-reformat", false, "empty and reformat an -nvme-dir slab file the tier cannot use instead of refusing to start: a damaged superblock, a file written with another -nvme or -block-tokens (or model size), or one others may read or write (its blocks are lost)")
	fs.BoolVar(&c.serveWhilePinning, "serve-while-pinning", false, "listen as soon as the first chunk of the host tier is pinned, instead of once all of it is (on the H200 test machine, GPU work submitted while 32 GiB of cold memory were pinned stalled: the first requests took 8 s instead of 0.85)")
	fs.BoolVar(&c.exactRows, "exact-rows", false, "on the GPU, run the linear layers' products at exactly a pass's rows instead of padding them to a few dozen row buckets (whose shapes -warm-up runs once before listening: on the H200 a pass of a shape cuBLAS has not run yet took 54 ms against 15 for its repeats)")
	layerWait := fs.String("layer-wait", "device", "where a prefill's forward pass waits for each layer's loads: device (the GPU's stream waits on the copies' events; the host enqueues every layer at once) or host (the host blocks before it enqueues the layer); on the H200 the two take the same time (benchmarks/results/layerwait-h200.md)")
	fs.BoolVar(&c.warmUp, "warm-up", true, "on the GPU, before listening, run one pass of each row bucket up to -context and short passes after growing prefixes (106 passes, 9 s, for llama-3.1-8b at -context 16400 on the H200) (nothing with -exact-rows)")
	fs.IntVar(&c.kvEventBuffer, "kv-events-buffer", 1<<16, "events of the cache (blocks stored in or removed from a tier) kept for subscribers that fall behind: GET /v1/kv/events and -kv-events-zmq (0: no events)")
	fs.StringVar(&c.kvEventsZMQ, "kv-events-zmq", "", "also publish the cache's events in vLLM's wire format (msgpack EventBatch over a ZMQ PUB socket, ZMTP 3.1) on this address (host:port), for KV-aware routers built for vLLM")
	fs.StringVar(&c.kvEventsReplay, "kv-events-replay", "", "with -kv-events-zmq: serve replays of missed batches on a ZMQ ROUTER socket at this address (host:port), as vLLM's replay endpoint")
	fs.StringVar(&c.kvEventsTopic, "kv-events-topic", "kv-events", "with -kv-events-zmq: the topic of the published messages")
	fs.IntVar(&c.kvEventsReplayBatches, "kv-events-replay-batches", 10000, "with -kv-events-replay: the batches kept for replay")
	fs.IntVar(&c.maxQueue, "max-queue", 64, "requests waiting to prefill; one more gets 429")
	fs.IntVar(&c.maxBatch, "max-batch", 16, "sequences decoding at once")
	fs.IntVar(&c.defaultMaxTokens, "default-max-tokens", 16, "max_tokens of a request that omits it")
	fs.DurationVar(&c.drainTimeout, "drain-timeout", 60*time.Second, "on SIGTERM, how long in-flight requests may take to finish")
	c.http.register(fs)
	c.admin.register(fs)
	c.codecs.register(fs)
	if err := fs.Parse(args); err != nil {
		return c, err
	}
	if fs.NArg() > 0 {
		return c, fmt.Errorf("unexpected argument %q (flags only; see -h)", fs.Arg(0))
	}
	fs.Visit(func(f *flag.Flag) {
		c.gatherStagingSet = c.gatherStagingSet || f.Name == "gather-staging"
		c.nvmeOff = c.nvmeOff || (f.Name == "nvme" && c.nvmeBytes == 0)
	})
	var err error
	if c.strategy, err = costplan.ParseStrategy(*strategy); err != nil {
		return c, fmt.Errorf("-strategy: %w", err)
	}
	if c.layerWait, err = engine.ParseLayerWait(*layerWait); err != nil {
		return c, fmt.Errorf("-layer-wait: %w", err)
	}
	return c, c.validate()
}

// validate names the first flag that is wrong.
func (c *config) validate() error {
	switch c.device {
	case "auto", "gpu", "cpu":
	default:
		return fmt.Errorf("-device %q: want auto, gpu or cpu", c.device)
	}
	if err := c.codecs.check(); err != nil {
		return err
	}
	if !slices.Contains(policy.Names, c.policy) {
		return fmt.Errorf("-policy %q: want one of %s", c.policy, strings.Join(policy.Names, ", "))
	}
	switch {
	case c.blockTokens < 0:
		return fmt.Errorf("-block-tokens %d is negative", c.blockTokens)
	case c.context < 0:
		return fmt.Errorf("-context %d is negative", c.context)
	case c.remote != "" && !c.strategy.LowerTiers():
		return fmt.Errorf("-remote with -strategy %v: it loads nothing from the host tier, where fetched blocks land", c.strategy)
	case c.remotePrefix == "":
		return errors.New("-remote-prefix is empty: give each deployment a prefix of its own")
	case c.remoteFetchTimeout <= 0:
		return fmt.Errorf("-remote-fetch-timeout %v: must be positive", c.remoteFetchTimeout)
	case c.remoteOpTimeout <= 0:
		return fmt.Errorf("-remote-op-timeout %v: must be positive", c.remoteOpTimeout)
	case c.remote == "" && c.remoteFlag() != "":
		return fmt.Errorf("%s without -remote: there is no remote tier to use it", c.remoteFlag())
	case (c.remoteTLSCert == "") != (c.remoteTLSKey == ""):
		return errors.New("-remote-tls-cert and -remote-tls-key go together: give both or neither")
	case c.maxHoles < 0:
		return fmt.Errorf("-max-hole-blocks %d is negative", c.maxHoles)
	case c.prefetchBlocks < 0:
		return fmt.Errorf("-prefetch-blocks %d is negative", c.prefetchBlocks)
	case c.kvEventBuffer < 0 || c.kvEventBuffer > 1<<24:
		return fmt.Errorf("-kv-events-buffer %d: want 0 to %d", c.kvEventBuffer, 1<<24)
	case c.kvEventsZMQ != "" && c.kvEventBuffer == 0:
		return errors.New("-kv-events-zmq with -kv-events-buffer 0: there are no events to publish")
	case c.kvEventsReplay != "" && c.kvEventsZMQ == "":
		return errors.New("-kv-events-replay without -kv-events-zmq: there is nothing to replay")
	case c.kvEventsReplayBatches < 1:
		return fmt.Errorf("-kv-events-replay-batches %d: want at least 1", c.kvEventsReplayBatches)
	case c.maxQueue < 1:
		return fmt.Errorf("-max-queue %d: want at least 1", c.maxQueue)
	case c.maxBatch < 1:
		return fmt.Errorf("-max-batch %d: want at least 1", c.maxBatch)
	case c.defaultMaxTokens < 1:
		return fmt.Errorf("-default-max-tokens %d: want at least 1", c.defaultMaxTokens)
	case c.drainTimeout <= 0:
		return errors.New("-drain-timeout must be positive")
	case c.nvmeAdmission != "seen-twice" && c.nvmeAdmission != "all":
		return fmt.Errorf("-nvme-admission %q: want seen-twice or all", c.nvmeAdmission)
	case c.nvmeWrites != "gated" && c.nvmeWrites != "all":
		return fmt.Errorf("-nvme-writes %q: want gated or all", c.nvmeWrites)
	case c.nvmeWriteShare <= 0 || c.nvmeWriteShare > 1:
		return fmt.Errorf("-nvme-write-share %g: want a share in (0, 1]", c.nvmeWriteShare)
	case c.nvmeDWPD < 0:
		return fmt.Errorf("-nvme-dwpd %g is negative", c.nvmeDWPD)
	case c.nvmeOff && c.nvmeDir != "":
		return errors.New("-nvme 0 turns the NVMe tier off: -nvme-dir has nothing to keep")
	case c.nvmeOff && c.nvmeReformat:
		return errors.New("-nvme 0 turns the NVMe tier off: -nvme-reformat has nothing to reformat")
	}
	if err := c.http.validate(); err != nil {
		return err
	}
	if err := c.admin.validate(); err != nil {
		return err
	}
	m, err := c.modelConfig()
	if err != nil {
		return err
	}
	if c.costCalibrationOut != "" {
		if _, err := cost.LookupModel(m.Name); err != nil {
			return fmt.Errorf("-cost-calibration-out: the cost model has no preset of %s, so nothing is calibrated", m.Name)
		}
		if !c.costLearn && c.costCalibration == "" {
			return errors.New("-cost-calibration-out with -cost-learn=false and no -cost-calibration: there is nothing to write")
		}
	}
	return nil
}

// remoteFlag names a -remote-* protection flag that is set, or "".
func (c *config) remoteFlag() string {
	for _, f := range []struct{ name, v string }{{"-remote-user", c.remoteUser}, {"-remote-password-file", c.remotePasswordFile},
		{"-remote-checksum-key-file", c.remoteChecksumKeyFile}, {"-remote-tls-ca", c.remoteTLSCA}, {"-remote-tls-cert", c.remoteTLSCert},
		{"-remote-tls-key", c.remoteTLSKey}} {
		if f.v != "" {
			return f.name
		}
	}
	if c.remoteTLS {
		return "-remote-tls"
	}
	return ""
}

// modelConfig is the -model's shape with -block-tokens, 16 by default for
// the presets (tiny keeps its 4).
func (c *config) modelConfig() (model.Config, error) {
	bt := c.blockTokens
	if bt == 0 && !strings.EqualFold(c.modelName, "tiny") {
		bt = 16
	}
	m, err := model.Lookup(c.modelName, bt)
	if err != nil {
		return m, fmt.Errorf("-model: %w", err)
	}
	return m, nil
}

// shape is the model and the sizes the flags imply, with defaults filled.
type shape struct {
	model                model.Config
	context              int
	cacheSlots, scratch  int
	hostBytes, nvmeBytes int64
	blockBytes, sequence int64 // one block; the longest sequence's blocks
}

func (c *config) shape() (shape, error) {
	m, err := c.modelConfig()
	if err != nil {
		return shape{}, err
	}
	s := shape{model: m, context: c.context, blockBytes: m.BlockBytes()}
	if s.context == 0 {
		s.context = 16384
		if m.Name == "tiny" {
			s.context = 1024
		}
	}
	s.sequence = int64(m.Blocks(s.context))
	s.cacheSlots = 256
	if c.gpuKVBytes > 0 {
		s.cacheSlots = int(c.gpuKVBytes / s.blockBytes)
	}
	if s.cacheSlots < 1 {
		return s, fmt.Errorf("-gpu-kv %s holds no block of %s", bytesize.Format(c.gpuKVBytes), bytesize.Format(s.blockBytes))
	}
	s.scratch = int(2 * s.sequence)
	if c.scratchBytes > 0 {
		s.scratch = int(c.scratchBytes / s.blockBytes)
	}
	if int64(s.scratch) < s.sequence {
		return s, fmt.Errorf("-scratch %s: the longest sequence (-context %d) takes %d blocks of %s", bytesize.Format(c.scratchBytes), s.context, s.sequence, bytesize.Format(s.blockBytes))
	}
	gpuBytes := int64(s.cacheSlots) * s.blockBytes
	s.hostBytes, s.nvmeBytes = c.hostBytes, c.nvmeBytes
	if s.hostBytes == 0 {
		s.hostBytes = 4 * gpuBytes
	}
	if s.nvmeBytes == 0 && !c.nvmeOff {
		s.nvmeBytes = 16 * gpuBytes
	}
	return s, nil
}
