package main

import (
	"strings"
	"testing"
)

// TestRunBadFlags: a bad size or a count that is not positive is an error
// naming the flag, before any cluster is started.
func TestRunBadFlags(t *testing.T) {
	good := options{block: "2MiB", part: "1MiB", blocks: 16, depth: 8, rounds: 61, addrs: "127.0.0.1:1"}
	for _, c := range []struct {
		edit func(*options)
		want string
	}{
		{func(o *options) { o.block = "2XB" }, "--block"},
		{func(o *options) { o.part = "x" }, "--part"},
		{func(o *options) { o.blocks = 0 }, "--blocks 0, --depth 8 and --rounds 61 must be positive"},
		{func(o *options) { o.depth = -1 }, "--depth -1"},
		{func(o *options) { o.rounds = 0 }, "--rounds 0"},
	} {
		o := good
		c.edit(&o)
		if err := run(o); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%+v: %v, want an error containing %q", o, err, c.want)
		}
	}
}
