// Package bytesize reads and writes byte counts the way the command-line
// tools and benchmarks name them: "1GiB", "256MiB", "16KiB", "4096".
package bytesize

import (
	"fmt"
	"strconv"
	"strings"
)

// units in the order Parse tries them: a longer suffix before a shorter one
// it ends with ("GiB" before "B").
var units = []struct {
	suffix string
	bytes  int64
}{
	{"TiB", 1 << 40}, {"GiB", 1 << 30}, {"MiB", 1 << 20}, {"KiB", 1 << 10},
	{"T", 1 << 40}, {"G", 1 << 30}, {"M", 1 << 20}, {"K", 1 << 10}, {"B", 1},
}

// Parse reads a positive whole number of bytes with an optional binary unit
// (KiB, MiB, GiB, TiB, or K, M, G, T for short); spaces around the number
// and the unit are ignored. Decimal units ("GB"), fractions and sizes of
// 2^62 bytes or more are errors.
func Parse(s string) (int64, error) {
	num, mult := strings.TrimSpace(s), int64(1)
	for _, u := range units {
		if rest, ok := strings.CutSuffix(num, u.suffix); ok {
			num, mult = strings.TrimSpace(rest), u.bytes
			break
		}
	}
	n, err := strconv.ParseInt(num, 10, 64)
	if err != nil || n <= 0 {
		return 0, fmt.Errorf("%q is not a positive byte count (want e.g. 4096, 256MiB or 1GiB)", s)
	}
	if n > (1<<62)/mult {
		return 0, fmt.Errorf("%q is too large", s)
	}
	return n * mult, nil
}

// Format writes n with the largest binary unit that divides it: "1GiB",
// "1536MiB", "1000B".
func Format(n int64) string {
	for _, u := range units[:4] {
		if n != 0 && n%u.bytes == 0 {
			return strconv.FormatInt(n/u.bytes, 10) + u.suffix
		}
	}
	return strconv.FormatInt(n, 10) + "B"
}
