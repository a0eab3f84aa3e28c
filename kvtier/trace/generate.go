package trace

import (
	"container/heap"
	"fmt"
	"io"
	"math"
	"math/rand/v2"
	"time"

	"kvtier.dev/internal/invariants"
)

// GenConfig describes a synthetic workload: conversations arrive as a
// Poisson process; each opens with one of a few shared system prompts
// (Zipf-popular), sometimes a long document, then a user message; each
// later turn resends the whole conversation so far plus a new message, after
// the model's reply and a think time. The mix (prompt sharing, multi-turn
// growth, a heavy tail of long documents) is what makes a prefix cache and
// its lower tiers pay off, as in production chat traffic.
type GenConfig struct {
	// Seed makes the output: equal configs give identical traces.
	Seed uint64
	// Requests is the number of requests to generate, e.g. 3000.
	Requests int
	// SessionsPerSecond is the arrival rate of new conversations, e.g. 0.2;
	// the request rate is about this times MeanTurns.
	SessionsPerSecond float64
	// SystemPrompts is the number of distinct shared system prompts, e.g. 24.
	SystemPrompts int
	// SystemPromptZipf is the Zipf exponent of their popularity (> 1), e.g.
	// 1.2: the most popular prompt opens about a third of conversations.
	SystemPromptZipf float64
	// SystemPromptTokens is the range of a system prompt's length, e.g.
	// [1000, 6000].
	SystemPromptTokens [2]int
	// DocumentFraction is the fraction of conversations whose first turn
	// carries a document (RAG context, a file, a transcript), e.g. 0.3.
	DocumentFraction float64
	// MedianDocumentTokens is the median document length, e.g. 8000
	// (log-normal, sigma 1, cut at MaxContextTokens).
	MedianDocumentTokens int
	// MeanTurns is the mean number of turns of a conversation (geometric),
	// e.g. 4; 1 makes every request single-turn.
	MeanTurns float64
	// MedianUserTokens is the median length of a user message, e.g. 250
	// (log-normal, sigma 1).
	MedianUserTokens int
	// MedianOutputTokens is the median reply length, e.g. 150 (log-normal,
	// sigma 0.9, at most 4096).
	MedianOutputTokens int
	// MeanThinkTime is the mean pause between a reply and the next turn,
	// e.g. 45s (exponential); the reply itself is assumed to take 20 ms per
	// output token.
	MeanThinkTime time.Duration
	// MaxContextTokens ends a conversation whose next turn would exceed it,
	// e.g. 65536.
	MaxContextTokens int
	// BlockTokens is the number of tokens a hash id stands for, e.g. 512.
	BlockTokens int
}

// DefaultGenConfig returns the configuration of the bundled trace.
func DefaultGenConfig() GenConfig {
	return GenConfig{
		Seed:                 1,
		Requests:             3000,
		SessionsPerSecond:    0.2,
		SystemPrompts:        24,
		SystemPromptZipf:     1.2,
		SystemPromptTokens:   [2]int{1000, 6000},
		DocumentFraction:     0.3,
		MedianDocumentTokens: 8000,
		MeanTurns:            4,
		MedianUserTokens:     250,
		MedianOutputTokens:   150,
		MeanThinkTime:        45 * time.Second,
		MaxContextTokens:     65536,
		BlockTokens:          MooncakeBlockTokens,
	}
}

// AgenticGenConfig returns a long-context agentic workload: coding agents
// whose sessions run for dozens of turns, each resending the whole session
// (a tool-laden system prompt of 8-16K tokens, then every tool result and
// reply so far) plus the next tool result, after a short reply and a few
// seconds of tool execution. Sessions grow past 100K tokens (cut at 200K),
// blocks are 64 tokens (vLLM-like paging, written in the native format),
// and a handful of agents share the system prompts. Every turn reuses all
// but its last few thousand tokens, so where the session's KV lives (GPU,
// host, NVMe) decides its TTFT.
func AgenticGenConfig() GenConfig {
	return GenConfig{
		Seed:                 1,
		Requests:             2000,
		SessionsPerSecond:    0.005,
		SystemPrompts:        4,
		SystemPromptZipf:     1.5,
		SystemPromptTokens:   [2]int{8000, 16000},
		DocumentFraction:     0,
		MedianDocumentTokens: 1,
		MeanTurns:            60,
		MedianUserTokens:     1500,
		MedianOutputTokens:   300,
		MeanThinkTime:        3 * time.Second,
		MaxContextTokens:     200_000,
		BlockTokens:          64,
	}
}

// Validate reports the first field that is out of range.
func (c *GenConfig) Validate() error {
	bad := func(field string, v any, want string) error {
		return fmt.Errorf("trace: GenConfig.%s = %v: want %s", field, v, want)
	}
	switch {
	case c.Requests < 0:
		return bad("Requests", c.Requests, ">= 0")
	case !(c.SessionsPerSecond > 0) || math.IsInf(c.SessionsPerSecond, 0):
		return bad("SessionsPerSecond", c.SessionsPerSecond, "> 0")
	case c.SystemPrompts < 1:
		return bad("SystemPrompts", c.SystemPrompts, ">= 1")
	case !(c.SystemPromptZipf > 1) || math.IsInf(c.SystemPromptZipf, 0):
		return bad("SystemPromptZipf", c.SystemPromptZipf, "> 1")
	case c.SystemPromptTokens[0] < 1 || c.SystemPromptTokens[1] < c.SystemPromptTokens[0]:
		return bad("SystemPromptTokens", c.SystemPromptTokens, "1 <= min <= max")
	case !(c.DocumentFraction >= 0 && c.DocumentFraction <= 1):
		return bad("DocumentFraction", c.DocumentFraction, "in [0, 1]")
	case c.MedianDocumentTokens < 1:
		return bad("MedianDocumentTokens", c.MedianDocumentTokens, ">= 1")
	case !(c.MeanTurns >= 1) || math.IsInf(c.MeanTurns, 0):
		return bad("MeanTurns", c.MeanTurns, ">= 1")
	case c.MedianUserTokens < 1:
		return bad("MedianUserTokens", c.MedianUserTokens, ">= 1")
	case c.MedianOutputTokens < 1:
		return bad("MedianOutputTokens", c.MedianOutputTokens, ">= 1")
	case c.MeanThinkTime < 0:
		return bad("MeanThinkTime", c.MeanThinkTime, ">= 0")
	case c.MaxContextTokens < c.SystemPromptTokens[1]+1:
		return bad("MaxContextTokens", c.MaxContextTokens, "above the longest system prompt")
	case c.BlockTokens < 1 || c.BlockTokens > MaxBlockTokens:
		return bad("BlockTokens", c.BlockTokens, "in [1, 65536]")
	}
	return nil
}

// Generator produces a synthetic trace one request at a time, in arrival
// order. It holds only the conversations in progress, so traces of any
// length stream in constant memory.
type Generator struct {
	cfg    GenConfig
	rng    *rand.Rand
	zipf   []float64 // cumulative popularity of the system prompts
	prompt []sysPrompt
	nextID uint64
	seq    uint64

	emitted     int
	lastArrival time.Duration
	nextSession time.Duration
	active      sessionHeap
	free        []*session
}

type sysPrompt struct {
	tokens int
	ids    []uint64 // its full blocks' ids
}

type session struct {
	at      time.Duration // the next turn's arrival
	seq     uint64        // ties broken by creation order
	turns   int           // turns left, this one included
	turn    int           // turns emitted
	context int           // tokens of the conversation so far
	ids     []uint64      // ids of its full blocks
}

type sessionHeap []*session

func (h sessionHeap) Len() int { return len(h) }
func (h sessionHeap) Less(i, j int) bool {
	if h[i].at != h[j].at {
		return h[i].at < h[j].at
	}
	return h[i].seq < h[j].seq
}
func (h sessionHeap) Swap(i, j int) { h[i], h[j] = h[j], h[i] }
func (h *sessionHeap) Push(x any)   { *h = append(*h, x.(*session)) }
func (h *sessionHeap) Pop() any {
	old := *h
	s := old[len(old)-1]
	*h = old[:len(old)-1]
	return s
}

// NewGenerator returns a Generator of cfg's workload.
func NewGenerator(cfg GenConfig) (*Generator, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	g := &Generator{cfg: cfg, rng: rand.New(rand.NewPCG(cfg.Seed, 0x6b76_7469_6572))}
	var total float64
	for i := range cfg.SystemPrompts {
		total += math.Pow(float64(i+1), -cfg.SystemPromptZipf)
		g.zipf = append(g.zipf, total)
	}
	for i := range g.zipf {
		g.zipf[i] /= total
	}
	lo, hi := cfg.SystemPromptTokens[0], cfg.SystemPromptTokens[1]
	for range cfg.SystemPrompts {
		p := sysPrompt{tokens: lo + g.rng.IntN(hi-lo+1)}
		for range p.tokens / cfg.BlockTokens {
			p.ids = append(p.ids, g.newID())
		}
		g.prompt = append(g.prompt, p)
	}
	g.nextSession = g.expDuration(time.Duration(float64(time.Second) / cfg.SessionsPerSecond))
	return g, nil
}

func (g *Generator) newID() uint64 {
	id := g.nextID
	g.nextID++
	return id
}

func (g *Generator) expDuration(mean time.Duration) time.Duration {
	return time.Duration(g.rng.ExpFloat64() * float64(mean))
}

// logNormal draws a log-normal integer with the given median and sigma, cut
// to [1, max].
func (g *Generator) logNormal(median int, sigma float64, upper int) int {
	v := int(math.Round(float64(median) * math.Exp(sigma*g.rng.NormFloat64())))
	return max(1, min(upper, v))
}

// Next fills req with the next request. It returns io.EOF after
// cfg.Requests requests. req's slices are reused.
func (g *Generator) Next(req *Request) error {
	if g.emitted >= g.cfg.Requests {
		return io.EOF
	}
	for len(g.active) == 0 || g.nextSession <= g.active[0].at {
		g.startSession()
	}
	s := g.active[0]
	cfg := &g.cfg
	if s.turn > 0 { // a later turn: the reply came back, then a new message
		s.context += g.logNormal(cfg.MedianUserTokens, 1, cfg.MaxContextTokens)
	}
	s.context = min(s.context, cfg.MaxContextTokens)
	bt := cfg.BlockTokens
	full := s.context / bt
	for len(s.ids) < full {
		s.ids = append(s.ids, g.newID())
	}
	if invariants.Enabled && s.at < g.lastArrival {
		invariants.Failf("generator went back in time, %v after %v", s.at, g.lastArrival)
	}
	g.lastArrival = s.at
	req.Arrival = s.at
	req.Salt = 0
	req.InputTokens = s.context
	req.OutputTokens = g.logNormal(cfg.MedianOutputTokens, 0.9, 4096)
	req.BlockTokens = bt
	req.Keys = append(req.Keys[:0], s.ids...)
	if s.context%bt != 0 {
		req.Keys = append(req.Keys, g.newID()) // the partial block is this request's own
	}
	req.Tokens = req.Tokens[:0]
	g.emitted++

	s.turns--
	s.turn++
	s.context += req.OutputTokens
	// The conversation ends after its last turn, or when the next message
	// could no longer fit.
	if s.turns == 0 || s.context+cfg.MedianUserTokens >= cfg.MaxContextTokens {
		heap.Pop(&g.active)
		s.ids = s.ids[:0]
		g.free = append(g.free, s)
		return nil
	}
	reply := time.Duration(req.OutputTokens) * 20 * time.Millisecond
	s.at += reply + g.expDuration(cfg.MeanThinkTime)
	heap.Fix(&g.active, 0)
	return nil
}

// startSession opens the conversation arriving at g.nextSession.
func (g *Generator) startSession() {
	cfg := &g.cfg
	var s *session
	if n := len(g.free); n > 0 {
		s, g.free = g.free[n-1], g.free[:n-1]
	} else {
		s = &session{}
	}
	s.at, s.seq, s.turn = g.nextSession, g.seq, 0
	g.seq++
	// Geometric number of turns with mean MeanTurns.
	s.turns = 1
	for g.rng.Float64() >= 1/cfg.MeanTurns {
		s.turns++
	}
	p := &g.prompt[g.pickPrompt()]
	s.ids = append(s.ids[:0], p.ids...)
	s.context = p.tokens
	if g.rng.Float64() < cfg.DocumentFraction {
		s.context += g.logNormal(cfg.MedianDocumentTokens, 1, cfg.MaxContextTokens)
	}
	s.context += g.logNormal(cfg.MedianUserTokens, 1, cfg.MaxContextTokens)
	heap.Push(&g.active, s)
	g.nextSession += g.expDuration(time.Duration(float64(time.Second) / cfg.SessionsPerSecond))
}

func (g *Generator) pickPrompt() int {
	u := g.rng.Float64()
	for i, c := range g.zipf {
		if u < c {
			return i
		}
	}
	return len(g.zipf) - 1
}

// Generate writes cfg's trace to w in format (FormatMooncake or
// FormatNative).
func Generate(w io.Writer, cfg GenConfig, format Format) error {
	g, err := NewGenerator(cfg)
	if err != nil {
		return err
	}
	tw, err := NewWriter(w, format)
	if err != nil {
		return err
	}
	var req Request
	for {
		if err := g.Next(&req); err == io.EOF {
			break
		} else if err != nil {
			return err
		}
		if err := tw.Write(&req); err != nil {
			return err
		}
	}
	return tw.Flush()
}

// GeneratedReader is cfg's trace as lines of format, generated as they are
// read: a trace of any length streams in the generator's constant memory,
// with no goroutine and no file.
type GeneratedReader struct {
	g      *Generator
	format Format
	req    Request
	line   []byte
	off    int
	done   bool
}

// NewGeneratedReader returns a reader of cfg's trace in format
// (FormatMooncake or FormatNative).
func NewGeneratedReader(cfg GenConfig, format Format) (*GeneratedReader, error) {
	if format != FormatMooncake && format != FormatNative {
		return nil, fmt.Errorf("trace: cannot write format %v: want mooncake or native", format)
	}
	if format == FormatMooncake && cfg.BlockTokens != MooncakeBlockTokens {
		return nil, fmt.Errorf("trace: GenConfig.BlockTokens = %d: the mooncake format has %d; write native", cfg.BlockTokens, MooncakeBlockTokens)
	}
	g, err := NewGenerator(cfg)
	if err != nil {
		return nil, err
	}
	return &GeneratedReader{g: g, format: format}, nil
}

// Read implements io.Reader.
func (r *GeneratedReader) Read(p []byte) (int, error) {
	n := 0
	for n < len(p) {
		if r.off == len(r.line) {
			if r.done {
				break
			}
			if err := r.g.Next(&r.req); err == io.EOF {
				r.done = true
				break
			} else if err != nil {
				return n, err
			}
			if r.format == FormatMooncake {
				r.line = AppendMooncake(r.line[:0], &r.req)
			} else {
				r.line = AppendNative(r.line[:0], &r.req)
			}
			r.off = 0
		}
		c := copy(p[n:], r.line[r.off:])
		r.off += c
		n += c
	}
	if n == 0 && r.done {
		return 0, io.EOF
	}
	return n, nil
}
