package main

import (
	"fmt"
	"strings"

	"kvtier.dev/internal/bytesize"
)

// parseSizes reads a comma-separated list of sizes.
func parseSizes(s string) ([]int64, error) {
	var out []int64
	for _, part := range strings.Split(s, ",") {
		n, err := bytesize.Parse(part)
		if err != nil {
			return nil, fmt.Errorf("--sizes: %w", err)
		}
		out = append(out, n)
	}
	return out, nil
}
