package cudastream

import (
	"fmt"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"kvtier.dev/internal/scripttest"
)

// Data-driven timeline tests: testdata/sim_timeline.txt holds cases of
// commands and the output they must produce on the virtual clock, read by
// internal/scripttest. Run with -rewrite to rewrite the expected output
// after a deliberate change, and read the diff.
//
//	case NAME
//	sim [timing-only] [mem=SIZE] [h200] [htod=BW dtoh=BW dtod=BW phtod=BW pdtoh=BW
//	    latency=DUR desc=DUR event=DUR engines-htod=N engines-dtoh=N engines-dtod=N]
//	stream NAME PRIO
//	alloc NAME SIZE | free NAME | pinned NAME SIZE | pageable NAME SIZE
//	fill HOST BYTE | check HOST[+OFF] SIZE
//	htod S DEV[+OFF] HOST[+OFF] SIZE | dtoh S HOST[+OFF] DEV[+OFF] SIZE
//	dtod S DEV[+OFF] DEV[+OFF] SIZE | batch S KIND N SIZE DST[+OFF] SRC[+OFF]
//	record S EVENT | wait S EVENT | query S|EVENT | sync S|EVENT
//	advance DUR | now | times | stats
//	----
//	expected output
//
// SIZE takes KiB, MiB, GiB suffixes; BW is bytes per second with the same
// suffixes (49.4GiB).
var simHostAddrRE = regexp.MustCompile(`host range \[0x[0-9a-f]+`)

const simScriptFile = "testdata/sim_timeline.txt"

func TestSimTimelineScripts(t *testing.T) {
	scripttest.Run(t, simScriptFile, func(t *testing.T, c *scripttest.Case) string {
		name, ok := strings.CutPrefix(c.Commands[0].Text, "case ")
		if !ok {
			t.Fatalf("%s:%d: a case starts with \"case NAME\", not %q", c.File, c.Line(), c.Commands[0].Text)
		}
		var out []string
		t.Run(name, func(t *testing.T) {
			var commands []string
			for _, cmd := range c.Commands[1:] {
				commands = append(commands, cmd.Text)
			}
			out = runSimScript(t, commands)
		})
		return strings.Join(out, "\n")
	})
}

type simScriptState struct {
	t       *testing.T
	sim     *Sim
	streams map[string]Stream
	events  map[string]Event
	devs    map[string]DevicePtr
	hosts   map[string][]byte
	out     []string
}

func runSimScript(t *testing.T, commands []string) []string {
	st := &simScriptState{t: t, streams: map[string]Stream{}, events: map[string]Event{}, devs: map[string]DevicePtr{}, hosts: map[string][]byte{}}
	defer func() {
		if st.sim != nil {
			st.sim.Close()
		}
	}()
	for _, line := range commands {
		f := strings.Fields(line)
		if err := st.run(f[0], f[1:]); err != nil {
			// Host addresses differ from run to run; device addresses do not.
			msg := simHostAddrRE.ReplaceAllString(err.Error(), "host range [<host>")
			st.printf("%s: error: %s", f[0], msg)
		}
	}
	return st.out
}

func (st *simScriptState) printf(format string, args ...any) {
	st.out = append(st.out, fmt.Sprintf(format, args...))
}

func (st *simScriptState) args(a []string, n int) {
	if len(a) != n {
		st.t.Fatalf("want %d arguments, got %q", n, a)
	}
}

func (st *simScriptState) run(cmd string, a []string) error {
	if cmd != "sim" && st.sim == nil {
		st.t.Fatalf("%s before sim", cmd)
	}
	switch cmd {
	case "sim":
		cfg := SimConfig{MemoryBytes: 1 << 30, Clock: SimVirtualClock}
		for _, kv := range a {
			st.simOption(&cfg, kv)
		}
		s, err := NewSim(cfg)
		if err != nil {
			return err
		}
		st.sim = s
	case "stream":
		st.args(a, 2)
		s, err := st.sim.NewStream(st.int(a[1]))
		if err != nil {
			return err
		}
		st.streams[a[0]] = s
	case "alloc":
		st.args(a, 2)
		p, err := st.sim.Alloc(st.size(a[1]))
		if err != nil {
			return err
		}
		st.devs[a[0]] = p
	case "free":
		st.args(a, 1)
		return st.sim.Free(st.devs[a[0]])
	case "pinned":
		st.args(a, 2)
		b, err := st.sim.HostAlloc(st.size(a[1]))
		if err != nil {
			return err
		}
		st.hosts[a[0]] = b
	case "pageable":
		st.args(a, 2)
		st.hosts[a[0]] = make([]byte, st.size(a[1]))
	case "fill":
		st.args(a, 2)
		v := st.int(a[1])
		for i := range st.hosts[a[0]] {
			st.hosts[a[0]][i] = byte(v)
		}
	case "check":
		st.args(a, 2)
		b := st.host(a[0], st.size(a[1]))
		vals := map[byte]bool{}
		for _, v := range b {
			vals[v] = true
		}
		keys := make([]string, 0, len(vals))
		for v := range vals {
			keys = append(keys, fmt.Sprintf("%#02x", v))
		}
		slices.Sort(keys)
		st.printf("%s %s: %s", a[0], a[1], strings.Join(keys, " "))
	case "htod":
		st.args(a, 4)
		n := st.size(a[3])
		return st.stream(a[0]).CopyHtoD(st.dev(a[1]), st.host(a[2], n))
	case "dtoh":
		st.args(a, 4)
		n := st.size(a[3])
		return st.stream(a[0]).CopyDtoH(st.host(a[1], n), st.dev(a[2]))
	case "dtod":
		st.args(a, 4)
		return st.stream(a[0]).CopyDtoD(st.dev(a[1]), st.dev(a[2]), st.size(a[3]))
	case "batch":
		st.args(a, 6)
		kinds := map[string]CopyKind{"htod": HostToDevice, "dtoh": DeviceToHost, "dtod": DeviceToDevice}
		kind, ok := kinds[a[1]]
		if !ok {
			st.t.Fatalf("batch kind %q", a[1])
		}
		n, size := st.int(a[2]), st.size(a[3])
		dst, src := st.addr(kind != DeviceToHost, a[4], int64(n)*size), st.addr(kind == DeviceToHost || kind == DeviceToDevice, a[5], int64(n)*size)
		ops := make([]Copy, n)
		for i := range ops {
			ops[i] = Copy{Dst: dst + uint64(int64(i)*size), Src: src + uint64(int64(i)*size), Bytes: size}
		}
		return st.stream(a[0]).CopyBatch(kind, ops)
	case "record":
		st.args(a, 2)
		e, ok := st.events[a[1]]
		if !ok {
			var err error
			if e, err = st.sim.NewEvent(EventOptions{Timing: true}); err != nil {
				return err
			}
			st.events[a[1]] = e
		}
		return e.Record(st.stream(a[0]))
	case "wait":
		st.args(a, 2)
		return st.stream(a[0]).WaitEvent(st.events[a[1]])
	case "query":
		st.args(a, 1)
		var done bool
		var err error
		if s, ok := st.streams[a[0]]; ok {
			done, err = s.Query()
		} else {
			done, err = st.event(a[0]).Query()
		}
		switch {
		case err != nil:
			return err
		case done:
			st.printf("%s: done", a[0])
		default:
			st.printf("%s: pending", a[0])
		}
	case "sync":
		st.args(a, 1)
		if s, ok := st.streams[a[0]]; ok {
			return s.Synchronize()
		}
		return st.event(a[0]).Synchronize()
	case "advance":
		st.args(a, 1)
		d, err := time.ParseDuration(a[0])
		if err != nil {
			st.t.Fatal(err)
		}
		return st.sim.Advance(d)
	case "now":
		st.printf("now %v", st.sim.Clock().Now())
	case "times":
		names := make([]string, 0, len(st.events))
		for n := range st.events {
			names = append(names, n)
		}
		slices.Sort(names)
		for _, n := range names {
			if d, ok := st.sim.EventTime(st.events[n]); ok {
				st.printf("%s %v", n, d)
			} else {
				st.printf("%s unknown", n)
			}
		}
	case "stats":
		ls := st.sim.LinkStats()
		for k := range NumCopyKinds {
			if ls.Copies[k] > 0 {
				st.printf("%v: %d copies, %d bytes, busy %v", k, ls.Copies[k], ls.Bytes[k], ls.Busy[k])
			}
		}
	default:
		st.t.Fatalf("unknown command %q", cmd)
	}
	return nil
}

func (st *simScriptState) simOption(cfg *SimConfig, kv string) {
	switch kv {
	case "timing-only":
		cfg.TimingOnly = true
		return
	case "h200":
		cfg.Link = H200Link()
		return
	}
	k, v, ok := strings.Cut(kv, "=")
	if !ok {
		st.t.Fatalf("sim option %q", kv)
	}
	l := &cfg.Link
	switch k {
	case "mem":
		cfg.MemoryBytes = st.size(v)
	case "htod":
		l.HtoDBytesPerSec = st.bw(v)
	case "dtoh":
		l.DtoHBytesPerSec = st.bw(v)
	case "dtod":
		l.DtoDBytesPerSec = st.bw(v)
	case "phtod":
		l.PageableHtoDBytesPerSec = st.bw(v)
	case "pdtoh":
		l.PageableDtoHBytesPerSec = st.bw(v)
	case "latency", "desc", "event":
		d, err := time.ParseDuration(v)
		if err != nil {
			st.t.Fatal(err)
		}
		*map[string]*time.Duration{"latency": &l.CopyLatency, "desc": &l.DescriptorCost, "event": &l.EventCost}[k] = d
	case "engines-htod":
		l.Engines[HostToDevice] = st.int(v)
	case "engines-dtoh":
		l.Engines[DeviceToHost] = st.int(v)
	case "engines-dtod":
		l.Engines[DeviceToDevice] = st.int(v)
	default:
		st.t.Fatalf("sim option %q", kv)
	}
}

func (st *simScriptState) int(s string) int {
	n, err := strconv.Atoi(s)
	if err != nil {
		st.t.Fatal(err)
	}
	return n
}

var simUnits = []struct {
	suffix string
	mul    float64
}{{"GiB", 1 << 30}, {"MiB", 1 << 20}, {"KiB", 1 << 10}, {"", 1}}

func (st *simScriptState) bw(s string) float64 {
	for _, u := range simUnits {
		if num, ok := strings.CutSuffix(s, u.suffix); ok {
			f, err := strconv.ParseFloat(num, 64)
			if err != nil {
				st.t.Fatal(err)
			}
			return f * u.mul
		}
	}
	panic("unreachable")
}

func (st *simScriptState) size(s string) int64 {
	f := st.bw(s)
	if f != float64(int64(f)) {
		st.t.Fatalf("size %q is not a whole number of bytes", s)
	}
	return int64(f)
}

// split parses NAME[+OFF].
func (st *simScriptState) split(s string) (string, int64) {
	name, off, ok := strings.Cut(s, "+")
	if !ok {
		return name, 0
	}
	return name, st.size(off)
}

func (st *simScriptState) dev(s string) DevicePtr {
	name, off := st.split(s)
	p, ok := st.devs[name]
	if !ok {
		st.t.Fatalf("no allocation %q", name)
	}
	return p + DevicePtr(off)
}

func (st *simScriptState) host(s string, n int64) []byte {
	name, off := st.split(s)
	b, ok := st.hosts[name]
	if !ok {
		st.t.Fatalf("no host buffer %q", name)
	}
	return b[off : off+n]
}

func (st *simScriptState) addr(device bool, s string, n int64) uint64 {
	if device {
		return uint64(st.dev(s))
	}
	return HostAddr(st.host(s, n))
}

func (st *simScriptState) stream(name string) Stream {
	s, ok := st.streams[name]
	if !ok {
		st.t.Fatalf("no stream %q", name)
	}
	return s
}

func (st *simScriptState) event(name string) Event {
	e, ok := st.events[name]
	if !ok {
		st.t.Fatalf("no stream or event %q", name)
	}
	return e
}
