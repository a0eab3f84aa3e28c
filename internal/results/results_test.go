package results

import (
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func TestAddComputesMedianSpreadAndRatio(t *testing.T) {
	f := New("demo", "test", "abc")
	base := f.Add("baseline", "GiB/s", []float64{2, 1, 3}, "")
	if base.Median != 2 || base.Min != 1 || base.Max != 3 || base.Runs != 3 || base.Ratio != 1 {
		t.Errorf("baseline row = %+v", base)
	}
	fast := f.Add("fast", "GiB/s", []float64{10, 6, 8, 12}, "baseline")
	if fast.Median != 9 || fast.Ratio != 4.5 {
		t.Errorf("rate row = %+v, want median 9 and ratio 4.5", fast)
	}
	f.Add("t0", "ms", []float64{10}, "")
	if r := f.Add("t1", "ms", []float64{5}, "t0"); r.Ratio != 2 {
		t.Errorf("a time half the baseline's has ratio %v, want 2", r.Ratio)
	}
}

func TestWriteProducesTheDesignFormat(t *testing.T) {
	dir := t.TempDir()
	f := New("demo", "test", "abc")
	f.Add("row", "GiB/s", []float64{1}, "")
	if err := f.Write(dir); err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile(filepath.Join(dir, "demo-test.json"))
	if err != nil {
		t.Fatal(err)
	}
	var got map[string]any
	if err := json.Unmarshal(b, &got); err != nil {
		t.Fatal(err)
	}
	for _, k := range []string{"benchmark", "machine", "date", "commit", "command", "rows"} {
		if _, ok := got[k]; !ok {
			t.Errorf("JSON lacks %q", k)
		}
	}
	md, err := os.ReadFile(filepath.Join(dir, "demo-test.md"))
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(md), "| row | GiB/s |") {
		t.Errorf("markdown lacks the row:\n%s", md)
	}
}
