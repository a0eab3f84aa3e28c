package kvtier

import (
	"context"
	"fmt"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"

	"kvtier.dev/internal/scripttest"
)

// TestScripts runs the block state machine scripts in testdata/. Each case
// is a command, a "----" line, and the output expected, then a blank line.
// Requests are strings of block names: "abc" is three 1-token blocks whose
// tokens are the letters' codes; a block is printed as its prefix ("ab" is
// block b after a). Commands:
//
//	config gpu=N host=N nvme=N [writethrough]
//	lookup L REQ | insert L TIER REQ | commit L [fail] | plan L | onboard L
//	offload L TIER | wait L | release L
//	complete I [fail]   (the I-th pending copy, in submission order)
//	state               (every block's state per tier, and pending copies)
//
// The files are read by internal/scripttest: run with -rewrite to
// regenerate the expected output after a deliberate change, and read the
// diff.
func TestScripts(t *testing.T) {
	files, err := filepath.Glob("testdata/*.txt")
	if err != nil || len(files) == 0 {
		t.Fatalf("no scripts: %v", err)
	}
	for _, file := range files {
		t.Run(filepath.Base(file), func(t *testing.T) { runScript(t, file) })
	}
}

type scriptEnv struct {
	t      *testing.T
	m      *Manager
	f      *fakeMover
	leases map[string]*Lease
	names  map[Key]string
}

func runScript(t *testing.T, file string) {
	env := &scriptEnv{t: t, leases: map[string]*Lease{}, names: map[Key]string{}}
	scripttest.Run(t, file, func(t *testing.T, c *scripttest.Case) string {
		var words []string
		for _, cmd := range c.Commands {
			words = append(words, strings.Fields(cmd.Text)...)
		}
		got := env.run(words)
		if env.m != nil {
			env.m.check(t)
		}
		return got
	})
}

func parseTier(s string) Tier {
	for t := range NumTiers {
		if t.String() == s {
			return t
		}
	}
	return NumTiers
}

func (e *scriptEnv) tokens(req string) []int32 {
	tok := make([]int32, len(req))
	for i, c := range req {
		tok[i] = c
	}
	h, _ := NewHasher(1)
	for i, k := range h.AppendKeys(nil, 0, 0, tok) {
		e.names[k] = req[:i+1]
	}
	return tok
}

func (e *scriptEnv) lease(name string) *Lease {
	if e.leases[name] == nil {
		e.leases[name] = new(Lease)
	}
	return e.leases[name]
}

func (e *scriptEnv) blocks(l *Lease) string {
	var b strings.Builder
	for _, x := range l.Blocks {
		fmt.Fprintf(&b, "%s: %v/%d", e.names[x.Key], x.Tier, x.Slot)
		if x.Write {
			b.WriteString(" write")
		}
		if x.Action != Use {
			fmt.Fprintf(&b, " %v", x.Action)
		}
		if x.Loading {
			fmt.Fprintf(&b, " loading->gpu/%d", x.GPUSlot)
		}
		b.WriteString("\n")
	}
	if b.Len() == 0 {
		return "(no blocks)"
	}
	return strings.TrimSuffix(b.String(), "\n")
}

func errText(err error) string {
	if err == nil {
		return ""
	}
	return "error: " + err.Error() + "\n"
}

func (e *scriptEnv) run(args []string) string {
	m := e.m
	switch args[0] {
	case "config":
		e.f = newFakeMover()
		cfg := Config{BlockTokens: 1, Mover: e.f}
		for _, a := range args[1:] {
			if a == "writethrough" {
				cfg.WriteThrough = true
				continue
			}
			k, v, _ := strings.Cut(a, "=")
			n, err := strconv.Atoi(v)
			if err != nil || parseTier(k) == NumTiers {
				e.t.Fatalf("bad config argument %q", a)
			}
			cfg.Tiers[parseTier(k)] = tierCfg(e.t, n)
		}
		m, err := New(cfg)
		if err != nil {
			return errText(err)
		}
		e.m = m
		return "ok"
	case "lookup":
		l := e.lease(args[1])
		err := m.Lookup(0, e.tokens(args[2]), l)
		return errText(err) + e.blocks(l)
	case "insert":
		l := e.lease(args[1])
		err := m.Insert(0, e.tokens(args[3]), parseTier(args[2]), l)
		return errText(err) + e.blocks(l)
	case "commit":
		var werr error
		if len(args) > 2 {
			werr = fmt.Errorf("write failed")
		}
		return errText(m.Commit(e.lease(args[1]), werr)) + e.state()
	case "plan":
		l := e.lease(args[1])
		return errText(m.Plan(l)) + e.blocks(l)
	case "onboard":
		l := e.lease(args[1])
		return errText(m.Onboard(l)) + e.blocks(l) + "\n" + e.state()
	case "offload":
		return errText(m.Offload(e.lease(args[1]), parseTier(args[2]))) + e.state()
	case "wait":
		l := e.lease(args[1])
		m.lock()
		pending := l.xfers
		m.unlock()
		if pending > 0 {
			return fmt.Sprintf("%d transfers pending", pending)
		}
		if err := m.Wait(context.Background(), l); err != nil {
			return strings.TrimSpace(errText(err))
		}
		return "ok"
	case "release":
		m.Release(e.lease(args[1]))
		return e.state()
	case "complete":
		i, _ := strconv.Atoi(args[1])
		e.f.mu.Lock()
		if i >= len(e.f.pending) {
			e.f.mu.Unlock()
			return "no such copy"
		}
		p := e.f.pending[i]
		e.f.pending = slices.Delete(e.f.pending, i, i+1)
		e.f.mu.Unlock()
		var err error
		if len(args) > 2 {
			err = fmt.Errorf("device error")
		}
		p.t.Complete(p.i, err)
		return e.state()
	case "state":
		return e.state()
	}
	e.t.Fatalf("unknown command %q", args[0])
	return ""
}

// state prints every block, sorted by name, and the pending copies.
func (e *scriptEnv) state() string {
	m := e.m
	m.lock()
	var lines []string
	for i := uint32(0); i < m.recs.n; i++ {
		if slices.Contains(m.recs.free, BlockRef(i)) {
			continue
		}
		r := m.recs.at(BlockRef(i))
		line := e.names[r.key] + ":"
		for t, s := range r.state {
			if s != stateNone {
				line += fmt.Sprintf(" %v=%v/%d", Tier(t), s, r.slot[t])
			}
		}
		if r.refs > 0 {
			line += fmt.Sprintf(" refs=%d", r.refs)
		}
		lines = append(lines, line)
	}
	m.unlock()
	slices.Sort(lines)
	e.f.mu.Lock()
	for i, p := range e.f.pending {
		op := p.t.Ops[p.i]
		lines = append(lines, fmt.Sprintf("copy %d: %s %v/%d -> %v/%d", i, e.names[op.Key], op.From, op.FromSlot, op.To, op.ToSlot))
	}
	e.f.mu.Unlock()
	if len(lines) == 0 {
		return "(empty)"
	}
	return strings.Join(lines, "\n")
}
