package engine

import (
	"context"
	"slices"
	"strings"
	"sync"
	"testing"

	"kvtier.dev/cudastream"
	"kvtier.dev/examples/server/internal/model"
	"kvtier.dev/kvtier"
	"kvtier.dev/kvtier/stack"
)

func TestParseLayerWait(t *testing.T) {
	for w := range NumLayerWaits {
		got, err := ParseLayerWait(w.String())
		if err != nil || got != w {
			t.Errorf("ParseLayerWait(%q) = %v, %v; want %v", w.String(), got, err, w)
		}
	}
	if _, err := ParseLayerWait("gpu"); err == nil || !strings.Contains(err.Error(), `layer wait "gpu": want "device" or "host"`) {
		t.Errorf("ParseLayerWait(gpu): %v; want an error naming it and the two choices", err)
	}
	if s := NumLayerWaits.String(); s != "LayerWait(2)" {
		t.Errorf("NumLayerWaits.String() = %q", s)
	}
}

// New refuses a LayerWait outside the two, naming the field.
func TestNewRejectsLayerWait(t *testing.T) {
	e, _ := newTinyEngine(t, nil)
	cfg := e.cfg
	cfg.LayerWait = NumLayerWaits
	if _, err := New(cfg); err == nil || !strings.Contains(err.Error(), "Config.LayerWait LayerWait(2)") {
		t.Fatalf("New with LayerWait %d: %v; want an error naming Config.LayerWait", NumLayerWaits, err)
	}
}

// planRecorder is a Runner that records what each pass's plan carried and
// the logits it returned, and runs the pass on the runner it wraps.
type planRecorder struct {
	Runner
	mu     sync.Mutex
	passes []recordedPass
}

type recordedPass struct {
	ready, hasEvents bool
	events           []int // per layer: the events LayerEvents gave
	pending          int   // of those, not complete when given
	logits           []float32
}

func (r *planRecorder) Forward(tokens []int32, p model.Plan, fromCache []int32) ([]float32, int32, error) {
	rp := recordedPass{ready: p.Ready != nil, hasEvents: p.LayerEvents != nil}
	if events := p.LayerEvents; events != nil {
		p.LayerEvents = func(l int, dst []cudastream.Event) ([]cudastream.Event, error) {
			n := len(dst)
			dst, err := events(l, dst)
			rp.events = append(rp.events, len(dst)-n)
			for _, ev := range dst[n:] {
				if done, _ := ev.Query(); !done {
					rp.pending++
				}
			}
			return dst, err
		}
	}
	logits, next, err := r.Runner.Forward(tokens, p, fromCache)
	rp.logits = slices.Clone(logits)
	r.mu.Lock()
	r.passes = append(r.passes, rp)
	r.mu.Unlock()
	return logits, next, err
}

func (r *planRecorder) take() []recordedPass {
	r.mu.Lock()
	defer r.mu.Unlock()
	p := r.passes
	r.passes = nil
	return p
}

// loadFromHost runs a prompt once (computed), moves its full blocks down
// to the host tier, clears every copy of their KV but the host tier's, and
// runs it again (loaded), over a link that makes the loads slow. It
// returns both prefills' recorded passes and the tokens loaded.
func loadFromHost(t *testing.T, wait LayerWait, obs Observer) (first, loaded recordedPass, tokens int) {
	t.Helper()
	link := cudastream.H200Link()
	link.HtoDBytesPerSec = 128 << 10 // 10 blocks of 4 KiB take 320 ms
	rec := &planRecorder{}
	var cpu *CPURunner
	e, cache := newTinyEngineOn(t, link, obs, func(_ *stack.Options, c *Config) {
		cpu = c.Runner.(*CPURunner)
		rec.Runner, c.Runner, c.LayerWait = c.Runner, rec, wait
	})
	bt := e.cfg.Model.BlockTokens
	prompt := make([]int32, 10*bt+2)
	for i := range prompt {
		prompt[i] = int32(5 + i*13%400)
	}
	complete(t, e, "first", prompt)
	ctx := context.Background()
	if err := cache.Drain(ctx); err != nil {
		t.Fatal(err)
	}
	if _, err := cache.Evict(ctx, 0, prompt[:10*bt], kvtier.Host); err != nil {
		t.Fatal(err)
	}
	// Nothing of the first pass's KV stays where the second could read it
	// by mistake: in the model's memory or in the GPU tier's slots.
	clear(cpu.m.Region())
	if err := cpu.st.CopyHtoD(cpu.region, make([]byte, int64(cpu.cacheSlots)*e.block)); err != nil {
		t.Fatal(err)
	}
	if err := cpu.st.Synchronize(); err != nil {
		t.Fatal(err)
	}
	firstPasses := rec.take()
	u := complete(t, e, "loaded", prompt)
	loadedPasses := rec.take()
	if u.LoadedTokens[kvtier.Host] != 10*bt {
		t.Fatalf("%v: the prompt again loaded %v tokens per tier, want %d from the host", wait, u.LoadedTokens, 10*bt)
	}
	// complete asks for 2 tokens: the prefill, then one decode step.
	if len(firstPasses) != 2 || len(loadedPasses) != 2 {
		t.Fatalf("%v: %d and %d passes, want a prefill and a decode step each", wait, len(firstPasses), len(loadedPasses))
	}
	return firstPasses[0], loadedPasses[0], 10 * bt
}

// TestLayerWaitDevice: with LayerWaitDevice a prefill that loads from the
// host tier hands the runner every layer's load events (and Ready, for a
// runner that waits on the host); the CPU runner's stream waits on them on
// the simulated device, whose link makes the loads slow, before it reads
// the layer. The logits equal those of the same prefill computed from
// scratch and those of LayerWaitHost: no layer was read before it landed.
func TestLayerWaitDevice(t *testing.T) {
	first, dev, _ := loadFromHost(t, LayerWaitDevice, nil)
	_, host, _ := loadFromHost(t, LayerWaitHost, nil)
	layers := model.Tiny().Layers
	if !dev.hasEvents || !dev.ready || len(dev.events) != layers {
		t.Fatalf("device wait: the plan had LayerEvents %v, Ready %v, events asked for %d layers; want both, and %d", dev.hasEvents, dev.ready, len(dev.events), layers)
	}
	for l, n := range dev.events {
		if n == 0 {
			t.Errorf("device wait: layer %d had no load event", l)
		}
	}
	if host.hasEvents || !host.ready {
		t.Errorf("host wait: the plan had LayerEvents %v, Ready %v; want Ready only", host.hasEvents, host.ready)
	}
	if !slices.Equal(dev.logits, first.logits) || !slices.Equal(host.logits, first.logits) {
		t.Fatalf("the loaded prefill's logits differ from the computed one's: device wait equal %v, host wait equal %v",
			slices.Equal(dev.logits, first.logits), slices.Equal(host.logits, first.logits))
	}
}

// TestLayerWaitDeviceObservesLoad: under LayerWaitDevice, with no host
// wait to time, the engine still reports the load to the Observer (its
// last layer's events, watched while the pass runs) as one of the host
// tier's bytes, and the pass as one with those bytes in flight from before
// it began; under LayerWaitHost, the same.
func TestLayerWaitDeviceObservesLoad(t *testing.T) {
	for _, wait := range []LayerWait{LayerWaitDevice, LayerWaitHost} {
		rec := &recorder{}
		_, _, tokens := loadFromHost(t, wait, rec)
		rec.mu.Lock()
		from := rec.from
		rec.mu.Unlock()
		passes, loads, bytes := rec.take()
		want := int64(tokens/model.Tiny().BlockTokens) * model.Tiny().BlockBytes()
		if len(loads) != 1 || loads[0] != kvtier.Host || bytes[0] != want {
			t.Fatalf("%v: load samples %v of %v bytes; want one from the host of %d bytes", wait, loads, bytes, want)
		}
		// The first prefill computed everything; the second loaded.
		if len(passes) != 2 || passes[0].LoadBytes != 0 {
			t.Fatalf("%v: passes %+v; want the computed prefill, then the loaded one", wait, passes)
		}
		p := passes[1]
		if p.Prefix != tokens || p.Tokens != 2 || p.LoadBytes != want || p.LoadBlocks != tokens/model.Tiny().BlockTokens || from[1] != kvtier.Host ||
			p.LoadStartSeconds > 0 || p.LoadEndSeconds <= p.LoadStartSeconds || p.LoadEndSeconds <= 0 {
			t.Errorf("%v: the loaded pass %+v from %v; want 2 tokens after %d with %d bytes from the host in flight from before it began", wait, p, from[1], tokens, want)
		}
	}
}
