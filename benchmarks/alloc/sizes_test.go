package main

import "testing"

func TestParseSize(t *testing.T) {
	for in, want := range map[string]int64{"32GiB": 32 << 30, "1GiB": 1 << 30, "512MiB": 512 << 20, "4096": 4096, " 2TiB ": 2 << 40, "8KiB": 8192} {
		if got, err := parseSize(in); err != nil || got != want {
			t.Errorf("parseSize(%q) = %d, %v; want %d", in, got, err, want)
		}
	}
	for _, bad := range []string{"", "GiB", "-1GiB", "0", "1.5GiB", "32GB", "99999999999TiB"} {
		if got, err := parseSize(bad); err == nil {
			t.Errorf("parseSize(%q) = %d, want an error", bad, got)
		}
	}
	if got := sizeName(64 << 30); got != "64GiB" {
		t.Errorf("sizeName = %q", got)
	}
	if got := sizeName(3 << 20); got != "3MiB" {
		t.Errorf("sizeName = %q", got)
	}
	if s, err := parseSizes("32GiB,64GiB"); err != nil || len(s) != 2 || s[1] != 64<<30 {
		t.Errorf("parseSizes = %v, %v", s, err)
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
