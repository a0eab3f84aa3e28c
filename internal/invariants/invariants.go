// Package invariants is kvtier's one switch for its expensive self-checks and
// its one way to report a broken invariant.
//
// Enabled is a constant: true in builds with the invariants tag (CI runs the
// tests that way), false otherwise, so a check written as
//
//	if invariants.Enabled { m.checkInvariants() }
//
// costs nothing in a normal build. A broken invariant is a bug in kvtier,
// never bad input: bad input is an error returned to the caller. Failf and
// Check panic with a *Broken that names the function where the invariant
// broke, so the panic says where without a stack trace.
package invariants

import (
	"fmt"
	"runtime"
)

// Broken is the panic value of Failf and Check.
type Broken struct {
	Func string // the fully qualified function that found the broken invariant
	Msg  string
}

func (b *Broken) Error() string { return "invariant broken in " + b.Func + ": " + b.Msg }

// Failf panics with a *Broken holding the formatted message and the calling
// function's name. Call sites test their condition first
// (if !ok { invariants.Failf(...) }) so that the arguments are not boxed
// when the check passes.
func Failf(format string, args ...any) {
	panic(broken(2, format, args))
}

// Check panics like Failf when ok is false. It is for checks off the hot
// path: its arguments are evaluated, and may be boxed, even when ok is true.
func Check(ok bool, format string, args ...any) {
	if !ok {
		panic(broken(2, format, args))
	}
}

func broken(skip int, format string, args []any) *Broken {
	fn := "unknown function"
	if pc, _, _, ok := runtime.Caller(skip); ok {
		if f := runtime.FuncForPC(pc); f != nil {
			fn = f.Name()
		}
	}
	return &Broken{Func: fn, Msg: fmt.Sprintf(format, args...)}
}
