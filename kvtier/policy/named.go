package policy

import (
	"fmt"
	"strings"
)

// Names are the policies NewDenseNamed knows, as configs and flags spell
// them.
var Names = []string{"lru", "s3fifo", "2q", "cost-aware"}

// NewDenseNamed returns the Dense policy called name, with room for
// capacity keys: "lru" (NewDenseLRU), "s3fifo", "2q", or "cost-aware"
// (NewDenseCostAware, whose use counts halve every 4 × capacity calls). An
// unknown name is an error that lists the known ones.
func NewDenseNamed[K Dense](name string, capacity int) (Policy[K], error) {
	switch name {
	case "lru":
		return NewDenseLRU[K](capacity)
	case "s3fifo":
		return NewDenseS3FIFO[K](capacity)
	case "2q":
		return NewDenseTwoQ[K](capacity)
	case "cost-aware":
		return NewDenseCostAware[K](capacity, 4*capacity)
	}
	return nil, argError("NewDenseNamed", "name", fmt.Sprintf("%q", name), "one of "+strings.Join(Names, ", "))
}
