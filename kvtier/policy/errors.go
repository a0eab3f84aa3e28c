package policy

import (
	"errors"
	"fmt"
)

// ErrInvalidArgument is wrapped by every constructor error: the message
// names the constructor, the argument and the value that was rejected.
var ErrInvalidArgument = errors.New("invalid argument")

func argError(constructor, arg string, value any, want string) error {
	return fmt.Errorf("policy: %s: %s = %v, want %s: %w", constructor, arg, value, want, ErrInvalidArgument)
}
