package cudastream

import (
	"errors"
	"strings"
	"testing"
)

func TestDrvCheckRegisterLen(t *testing.T) {
	if err := drvCheckRegisterLen(1 << 30); err != nil {
		t.Errorf("1 GiB refused: %v", err)
	}
	if err := drvCheckRegisterLen(512<<30 - 4096); err != nil {
		t.Errorf("512 GiB - 4 KiB refused: %v", err)
	}
	for _, n := range []int{0, 512 << 30, 600 << 30} {
		err := drvCheckRegisterLen(n)
		if !errors.Is(err, ErrInvalidValue) {
			t.Errorf("drvCheckRegisterLen(%d) = %v, want ErrInvalidValue", n, err)
		}
	}
	if err := drvCheckRegisterLen(512 << 30); !strings.Contains(err.Error(), "512 GiB") {
		t.Errorf("message %q does not name the limit", err)
	}
}
