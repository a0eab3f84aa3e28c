//go:build !linux

package replay

import "errors"

func unbacked(n int64) ([]byte, error) {
	return nil, errors.New("replay: mover \"device\" needs Linux (its host pool is reserved address space)")
}

func freeUnbacked(b []byte) error { return nil }
