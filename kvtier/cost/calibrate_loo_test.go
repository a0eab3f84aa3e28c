package cost

import (
	"os"
	"testing"
)

func loadSamples(t *testing.T, path string) []PrefillSample {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	s, err := ReadPrefillSamples(f)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// TestLeaveOneOutH200: each H200 prefill measured is predicted by the fit
// to the others of its set within 15%, where the presets are off by up to
// 62% (benchmarks/results/calibration-h200-loo.md). The sets: issue 15's
// table (five prefills of Llama-3.1-8B and -70B); that table with the
// PyTorch runs of benchmarks/results/prefill-h200.json; a grid of 19
// PyTorch prefills of Llama-3.1-8B (512 to 32K tokens after 0 to 64K, one
// run); kvtier's own Go runtime's runs. Two samples of the second set
// miss, by less than a point, and the test pins them so that a change
// that moves them is seen. The set holds two runs of other days on two
// attention paths, which measured the same shapes up to 10% apart: 8,192
// tokens from scratch took 250 ms in one and 276 ms in the other. The
// misses are the only prefill of its set on a long prefix (2,048 tokens
// after 32,768 cached) and 512 tokens after 8,192 of the second run,
// predicted from the first run's prefix samples.
func TestLeaveOneOutH200(t *testing.T) {
	g, _ := LookupGPU("h200")
	for _, set := range []struct {
		path string
		miss func(PrefillSample, int) bool
	}{
		{"testdata/prefill-h200-issue15.jsonl", nil},
		{"testdata/prefill-h200-pytorch.jsonl", func(s PrefillSample, i int) bool { return s.Prefix == 32768 || i == 8 }},
		{"testdata/prefill-h200-pytorch-grid.jsonl", nil},
		{"testdata/prefill-h200-go.jsonl", nil},
		// The runtime's own short passes (issue 40): 64 to 8,192 tokens
		// from scratch, 64 to 1,024 after 2K to 24K cached. The misses are
		// the two longest suffixes on the longest prefix and 512 after
		// 16,384, each predicted from the others alone.
		{"testdata/prefill-short-h200-runtime.jsonl", func(s PrefillSample, _ int) bool {
			return s.Prefix == 24576 && s.Tokens >= 512 || s.Prefix == 16384 && s.Tokens == 512
		}},
	} {
		samples := loadSamples(t, set.path)
		loo, err := LeaveOneOut(g, samples)
		if err != nil {
			t.Fatal(err)
		}
		for i, s := range samples {
			pre, _ := (*Fit)(nil).Predict(s, &g)
			e := loo[i].Seconds()/s.Seconds - 1
			t.Logf("%s %s prefix %d tokens %d: measured %.4f s, leave-one-out %.4f s (%+.1f%%), presets %.4f s (%+.1f%%)",
				set.path, s.Model, s.Prefix, s.Tokens, s.Seconds, loo[i].Seconds(), 100*e, pre.Seconds(), 100*(pre.Seconds()/s.Seconds-1))
			knownMiss := set.miss != nil && set.miss(s, i)
			if miss := e > 0.15 || e < -0.15; miss != knownMiss {
				t.Errorf("%s sample %d: leave-one-out error %+.1f%%; known miss %v", set.path, i+1, 100*e, knownMiss)
			}
		}
	}
}
