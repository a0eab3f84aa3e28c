//go:build !linux && !darwin

package replay

import "errors"

func unbacked(n int64) ([]byte, error) {
	return nil, errors.New(`replay: mover "device" reserves its host pool with mmap (Linux, macOS); use mover "model" here`)
}

func freeUnbacked(b []byte) error { return nil }
