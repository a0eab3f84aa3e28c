package main

import "testing"

// TestParseSizes: single sizes are internal/bytesize's (tested there).
func TestParseSizes(t *testing.T) {
	if s, err := parseSizes("32GiB,64GiB"); err != nil || len(s) != 2 || s[1] != 64<<30 {
		t.Errorf("parseSizes = %v, %v", s, err)
	}
	if _, err := parseSizes("32GiB,32GB"); err == nil {
		t.Error("a bad size in the list was accepted")
	}
}

func TestSeriesRows(t *testing.T) {
	s := newSeries()
	s.add("cuMemHostAlloc 32GiB", "", "", 2)
	s.add("pinned THP 32GiB", "cuMemHostAlloc 32GiB", "", 30)
	s.add("cuMemHostAlloc 32GiB", "", "", 3)
	s.add("pinned THP 32GiB", "cuMemHostAlloc 32GiB", "", 20)
	s.add("pinned THP 32GiB", "cuMemHostAlloc 32GiB", "", 25)
	s.add("pinned THP 32GiB touch", "", "touch stage", 40)
	rows := s.rows()
	if len(rows) != 3 {
		t.Fatalf("rows %+v", rows)
	}
	if r := rows[0]; r.Median != 2.5 || r.Ratio != 1 || r.Runs != 2 || r.Min != 2 || r.Max != 3 {
		t.Errorf("baseline row %+v", r)
	}
	if r := rows[1]; r.Median != 25 || r.Ratio != 10 || r.Runs != 3 || r.Baseline != "cuMemHostAlloc 32GiB" {
		t.Errorf("pinned row %+v", r)
	}
	if r := rows[2]; r.Ratio != 0 || r.Note != "touch stage" {
		t.Errorf("stage row %+v", r)
	}
}

func TestParseFlags(t *testing.T) {
	if _, err := parseFlags([]string{"--modes", "pinnedthp,bogus"}); err == nil {
		t.Error("unknown mode accepted")
	}
	if _, err := parseFlags([]string{"--registrar", "nvidia"}); err == nil {
		t.Error("unknown registrar accepted")
	}
	if _, err := parseFlags([]string{"--sizes", "32GB"}); err == nil {
		t.Error("bad size accepted")
	}
	cfg, err := parseFlags([]string{"--sizes", "1GiB", "--registrar", "mlock", "--machine", "dev", "--fault", "populate"})
	if err != nil || cfg.sizes[0] != 1<<30 || cfg.rounds != 3 || cfg.machine != "dev" {
		t.Errorf("parseFlags = %+v, %v", cfg, err)
	}
}
