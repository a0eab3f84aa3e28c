package bytesize

import "testing"

func TestParse(t *testing.T) {
	for in, want := range map[string]int64{
		"1073741824": 1 << 30, "1GiB": 1 << 30, "256MiB": 256 << 20, "16KiB": 16 << 10,
		"2G": 2 << 30, " 4 MiB ": 4 << 20, " 2TiB ": 2 << 40, "4096": 4096, "512B": 512,
	} {
		if got, err := Parse(in); err != nil || got != want {
			t.Errorf("Parse(%q) = %d, %v; want %d", in, got, err, want)
		}
	}
	for _, bad := range []string{"", "-1", "0", "GiB", "-1GiB", "1.5GiB", "32GB", "1PiB", "9999999999TiB", "99999999999TiB"} {
		if got, err := Parse(bad); err == nil {
			t.Errorf("Parse(%q) = %d, want an error", bad, got)
		}
	}
}

func TestFormat(t *testing.T) {
	for n, want := range map[int64]string{1 << 30: "1GiB", 64 << 30: "64GiB", 3 << 20: "3MiB", 16 << 10: "16KiB", 1000: "1000B", 3 << 29: "1536MiB", 2 << 40: "2TiB"} {
		if got := Format(n); got != want {
			t.Errorf("Format(%d) = %q, want %q", n, got, want)
		}
	}
}
