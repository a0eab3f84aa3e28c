package policy

import (
	"fmt"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"kvtier.dev/internal/scripttest"
)

// TestScripts runs the scripts in testdata (read by internal/scripttest:
// commands, "----", what the answering commands (evict, len) print, one
// line each; -rewrite rewrites it). Commands:
//
//	new lru|twoq|s3fifo|costaware CAPACITY [DECAYCALLS]
//
// Each script runs twice: with the map-indexed policies and with the dense
// ones (NewDenseLRU, ...), which must give the same answers.
//
//	insert KEY... [bytes=N] [cost=SECONDS]
//	touch KEY...
//	remove KEY...
//	evict [busy=KEY,KEY...]   => victim, or none
//	len                       => tracked keys
func TestScripts(t *testing.T) {
	files, err := filepath.Glob("testdata/*.txt")
	if err != nil || len(files) == 0 {
		t.Fatalf("no scripts in testdata: %v", err)
	}
	for _, file := range files {
		for _, dense := range []bool{false, true} {
			name := filepath.Base(file)
			if dense {
				name = "dense-" + name
			}
			t.Run(name, func(t *testing.T) { runScript(t, file, dense) })
		}
	}
}

func runScript(t *testing.T, file string, dense bool) {
	var p tracker
	scripttest.Run(t, file, func(t *testing.T, c *scripttest.Case) string {
		var out []string
		for _, cmd := range c.Commands {
			got, err := runScriptLine(&p, cmd.Text, dense)
			if err != nil {
				t.Fatalf("%s:%d: %v", file, cmd.Line, err)
			}
			if got != "" {
				out = append(out, got)
			}
		}
		return strings.Join(out, "\n")
	})
}

func runScriptLine(p *tracker, line string, dense bool) (string, error) {
	f := strings.Fields(line)
	if f[0] != "new" && *p == nil {
		return "", fmt.Errorf("%q before new", f[0])
	}
	var keys []uint64
	var meta Meta
	busy := map[uint64]bool{}
	for _, a := range f[1:] {
		var err error
		switch {
		case f[0] == "new":
		case strings.HasPrefix(a, "bytes="):
			meta.Bytes, err = strconv.ParseInt(a[6:], 10, 64)
		case strings.HasPrefix(a, "cost="):
			meta.RecomputeSeconds, err = strconv.ParseFloat(a[5:], 64)
		case strings.HasPrefix(a, "busy="):
			for _, s := range strings.Split(a[5:], ",") {
				k, perr := strconv.ParseUint(s, 10, 64)
				if perr != nil {
					return "", perr
				}
				busy[k] = true
			}
		default:
			var k uint64
			k, err = strconv.ParseUint(a, 10, 64)
			keys = append(keys, k)
		}
		if err != nil {
			return "", fmt.Errorf("argument %q: %v", a, err)
		}
	}
	switch f[0] {
	case "new":
		if len(f) < 3 {
			return "", fmt.Errorf("new wants a policy and a capacity")
		}
		capacity, err := strconv.Atoi(f[2])
		if err != nil {
			return "", err
		}
		decay := 1 << 30
		if len(f) > 3 {
			if decay, err = strconv.Atoi(f[3]); err != nil {
				return "", err
			}
		}
		var np tracker
		switch {
		case f[1] == "lru" && dense:
			np, err = newDenseTracker(NewDenseLRU[ref](capacity))
		case f[1] == "lru":
			np, err = NewLRU[uint64](capacity)
		case f[1] == "twoq" && dense:
			np, err = newDenseTracker(NewDenseTwoQ[ref](capacity))
		case f[1] == "twoq":
			np, err = NewTwoQ[uint64](capacity)
		case f[1] == "s3fifo" && dense:
			np, err = newDenseTracker(NewDenseS3FIFO[ref](capacity))
		case f[1] == "s3fifo":
			np, err = NewS3FIFO[uint64](capacity)
		case f[1] == "costaware" && dense:
			np, err = newDenseTracker(NewDenseCostAware[ref](capacity, decay))
		case f[1] == "costaware":
			np, err = NewCostAware[uint64](capacity, decay)
		default:
			return "", fmt.Errorf("unknown policy %q", f[1])
		}
		*p = np
		return "", err
	case "insert":
		for _, k := range keys {
			(*p).Insert(k, meta)
		}
	case "touch":
		for _, k := range keys {
			(*p).Touch(k)
		}
	case "remove":
		for _, k := range keys {
			(*p).Remove(k)
		}
	case "evict":
		v, ok := (*p).Evict(func(k uint64) bool { return !busy[k] })
		if !ok {
			return "none", nil
		}
		return strconv.FormatUint(v, 10), nil
	case "len":
		return strconv.Itoa((*p).Len()), nil
	default:
		return "", fmt.Errorf("unknown command %q", f[0])
	}
	return "", nil
}
