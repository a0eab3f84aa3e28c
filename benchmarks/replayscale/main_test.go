package main

import (
	"path/filepath"
	"strings"
	"testing"
)

// Bad flags are errors that name the flag, and nothing runs.
func TestRunBadFlags(t *testing.T) {
	missing := filepath.Join(t.TempDir(), "no-such-kvtier")
	for _, tc := range []struct {
		o    options
		want string
	}{
		{options{rounds: 1, requests: 10}, "-kvtier"},
		{options{kvtier: missing, rounds: 0, requests: 10}, "-rounds 0"},
		{options{kvtier: missing, rounds: 1, requests: 0}, "-requests 0"},
		{options{kvtier: missing, rounds: 1, requests: 10}, "no-such-kvtier"},
		{options{kvtier: missing, baseline: missing + "-old", rounds: 1, requests: 10}, "no-such-kvtier"},
	} {
		err := run(tc.o)
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%+v: %v, want an error naming %q", tc.o, err, tc.want)
		}
	}
}
