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

// TestLeaveOneOutH200: each H200 prefill measured (issue 15's table and
// benchmarks/results/prefill-h200.json; PyTorch SDPA and kvtier's own Go
// runtime are two calibrations, two servers) is predicted by the fit to
// the others within 15%, where the presets are off by up to 45%, except
// two, which the test pins so that a change that moves them is seen: in
// the PyTorch set, the only sample with a long prefix (2,048 tokens after
// 32,768) runs attention at about half the per-pair rate of the others,
// so neither it nor the longest prefill from scratch (which then sets the
// attention rate alone) is predictable from the rest.
func TestLeaveOneOutH200(t *testing.T) {
	g, _ := LookupGPU("h200")
	for _, set := range []string{"testdata/prefill-h200-pytorch.jsonl", "testdata/prefill-h200-go.jsonl"} {
		samples := loadSamples(t, set)
		loo, err := LeaveOneOut(g, samples)
		if err != nil {
			t.Fatal(err)
		}
		for i, s := range samples {
			pre, _ := (*Fit)(nil).Predict(s, &g)
			e := loo[i].Seconds()/s.Seconds - 1
			t.Logf("%s %s prefix %d tokens %d: measured %.4f s, leave-one-out %.4f s (%+.1f%%), presets %.4f s (%+.1f%%)",
				set, s.Model, s.Prefix, s.Tokens, s.Seconds, loo[i].Seconds(), 100*e, pre.Seconds(), 100*(pre.Seconds()/s.Seconds-1))
			knownMiss := set == "testdata/prefill-h200-pytorch.jsonl" && (s.Prefix == 32768 || s.Tokens == 32768)
			if miss := e > 0.15 || e < -0.15; miss != knownMiss {
				t.Errorf("%s sample %d: leave-one-out error %+.1f%%; known miss %v", set, i+1, 100*e, knownMiss)
			}
		}
	}
}
