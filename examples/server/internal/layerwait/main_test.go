package main

import (
	"context"
	"math"
	"strings"
	"testing"

	"kvtier.dev/examples/server/internal/model"
	"kvtier.dev/internal/gputest"
)

// TestCheckFlags: each bad flag is an error naming it, found before any
// GPU is opened; good flags give the splits and their bounds.
func TestCheckFlags(t *testing.T) {
	good, err := parseFlags(nil)
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		edit func(*flags)
		want string
	}{
		{func(f *flags) { f.runs = 0 }, "-runs 0: want at least 1"},
		{func(f *flags) { f.model = "gpt-9" }, "-model gpt-9 -block-tokens 16: "},
		{func(f *flags) { f.gatherStaging = "lots" }, `-gather-staging "lots": `},
		{func(f *flags) { f.splits = "13876" }, `-splits: item 1 "13876": want TOTAL:LOADED`},
		{func(f *flags) { f.splits = "100:32,x:16" }, `-splits: item 2 "x:16": want TOTAL:LOADED`},
		{func(f *flags) { f.splits = "100:0" }, `item 1 "100:0": LOADED must be above 0 and below TOTAL`},
		{func(f *flags) { f.splits = "100:112" }, `LOADED must be above 0 and below TOTAL`},
		{func(f *flags) { f.splits = "100:40" }, `item 1 "100:40": LOADED 40 is not a multiple of the block's 16 tokens`},
	} {
		f := good
		c.edit(&f)
		if _, err := checkFlags(f); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%+v: %v, want an error containing %q", f, err, c.want)
		}
	}
	k, err := checkFlags(good)
	if err != nil {
		t.Fatal(err)
	}
	want := []split{{13876, 12432}, {13876, 13856}, {13876, 4096}}
	if len(k.splits) != len(want) || k.maxTotal != 13876 || k.maxLoaded != 13856 || k.gatherStaging != 96<<20 || k.c.Name != "llama-3.1-8b" {
		t.Fatalf("default flags: %+v", k)
	}
	for i := range want {
		if k.splits[i] != want[i] {
			t.Errorf("split %d: %v, want %v", i, k.splits[i], want[i])
		}
	}
	if _, err := parseFlags([]string{"-runs", "3", "extra"}); err == nil || !strings.Contains(err.Error(), `unexpected argument "extra"`) {
		t.Errorf("an argument that is not a flag: %v", err)
	}
}

func TestFirstDiff(t *testing.T) {
	nan := float32(math.NaN())
	for _, c := range []struct {
		a, b []float32
		want int
	}{
		{[]float32{1, 2}, []float32{1, 2}, -1},
		{[]float32{1, 2}, []float32{1, 3}, 1},
		{[]float32{nan}, []float32{nan}, 0},
		{[]float32{1}, []float32{1, 2}, 0},
	} {
		if got := firstDiff(c.a, c.b); got != c.want {
			t.Errorf("firstDiff(%v, %v) = %d, want %d", c.a, c.b, got, c.want)
		}
	}
}

// TestWaitsAgreeOnGPU: on a GPU, a prefill whose prefix loads from the
// pinned pool through the copy engine while the pass runs gives, with the
// device waiting on the layers' events and with the host waiting, the
// logits of the same pass with the prefix present, bit for bit, although
// the prefix was scrubbed to NaN before each (verify); the device wait's
// pass was enqueued while loads were in flight.
//
//	go test -c -o .gpu/layerwait.test ./examples/server/internal/layerwait
//	KVTIER_REQUIRE_GPU=1 ./.gpu/layerwait.test -test.v
func TestWaitsAgreeOnGPU(t *testing.T) {
	dev := gputest.Device(t)
	c, err := model.Lookup("llama-3.2-1b", 16)
	if err != nil {
		t.Fatal(err)
	}
	splits := []split{{8256, 8192}, {8256, 2048}}
	r, err := newRig(dev, c, 8256, 8192, 96<<20)
	gputest.SkipOrFail(t, err) // cuBLAS may be missing where the driver is not
	defer r.close()
	ctx := context.Background()
	if err := r.fill(ctx, 8256, 8192); err != nil {
		t.Fatal(err)
	}
	for _, s := range splits {
		inFlight, err := r.verify(ctx, s)
		if err != nil {
			t.Fatal(err)
		}
		t.Logf("%v: layers not landed when the pass reached them: host wait %d, device wait %d of %d", s, inFlight[hostWait], inFlight[deviceWait], c.Layers)
		if inFlight[deviceWait] == 0 {
			t.Errorf("%v: every load had landed before the device wait's pass asked for its events: the loads were not in flight", s)
		}
	}
}
