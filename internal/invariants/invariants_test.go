package invariants

import (
	"errors"
	"strings"
	"testing"
)

func panicValue(f func()) (v any) {
	defer func() { v = recover() }()
	f()
	return nil
}

func TestFailfNamesTheCaller(t *testing.T) {
	v := panicValue(func() { Failf("slot %d held twice", 7) })
	var b *Broken
	if err, ok := v.(error); !ok || !errors.As(err, &b) {
		t.Fatalf("panic value %#v, want a *Broken", v)
	}
	if b.Msg != "slot 7 held twice" {
		t.Errorf("message %q", b.Msg)
	}
	if !strings.Contains(b.Func, "TestFailfNamesTheCaller") {
		t.Errorf("function %q does not name the caller", b.Func)
	}
	if want := "invariant broken in " + b.Func + ": slot 7 held twice"; b.Error() != want {
		t.Errorf("Error() = %q, want %q", b.Error(), want)
	}
}

func TestCheck(t *testing.T) {
	if v := panicValue(func() { Check(true, "never") }); v != nil {
		t.Fatalf("Check(true) panicked with %v", v)
	}
	v := panicValue(func() { Check(false, "tier %s over capacity", "host") })
	b, ok := v.(*Broken)
	if !ok || b.Msg != "tier host over capacity" || !strings.Contains(b.Func, "TestCheck") {
		t.Fatalf("Check(false) panicked with %#v", v)
	}
}
