//go:build race

package kvtier

const raceEnabled = true
