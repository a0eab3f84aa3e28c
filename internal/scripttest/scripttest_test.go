package scripttest

import (
	"strings"
	"testing"
)

const sample = `# a comment
insert a
commit a
----
a: ready

# the next case carries the state on
evict

----
none

lookup a
----

# trailing comments stay
`

func TestParse(t *testing.T) {
	cases, err := Parse("sample.txt", sample)
	if err != nil {
		t.Fatal(err)
	}
	if len(cases) != 3 {
		t.Fatalf("%d cases, want 3", len(cases))
	}
	c := cases[0]
	if len(c.Commands) != 2 || c.Commands[0] != (Command{"insert a", 2}) || c.Commands[1] != (Command{"commit a", 3}) || c.Want != "a: ready" {
		t.Errorf("case 1: %+v", c)
	}
	if c := cases[1]; len(c.Commands) != 1 || c.Line() != 8 || c.Want != "none" {
		t.Errorf("case 2: %+v", c)
	}
	if c := cases[2]; c.Line() != 13 || c.Want != "" {
		t.Errorf("case 3: %+v", c)
	}
}

func TestFormatRoundTrip(t *testing.T) {
	cases, err := Parse("sample.txt", sample)
	if err != nil {
		t.Fatal(err)
	}
	got := make([]string, len(cases))
	for i, c := range cases {
		got[i] = c.Want
	}
	if out := Format(cases, got); out != sample {
		t.Errorf("Format(Parse(x)) != x:\n%s", out)
	}
	got[1] = "a\n\n"
	if out := Format(cases, got); !strings.Contains(out, "----\na\n\nlookup a") {
		t.Errorf("new output not written in place:\n%s", out)
	}
}

func TestParseErrors(t *testing.T) {
	for _, tc := range []struct{ text, want string }{
		{"----\nout\n", `f.txt:1: "----" with no command before it`},
		{"a\n----\nx\n\n# c\nb\nc\n", `f.txt:6: case has no "----" line`},
		{"# only a comment\n", "f.txt: no cases"},
		{"", "f.txt: no cases"},
	} {
		_, err := Parse("f.txt", tc.text)
		if err == nil || err.Error() != tc.want {
			t.Errorf("Parse(%q) = %v, want %q", tc.text, err, tc.want)
		}
	}
}

func TestNormalize(t *testing.T) {
	if got := normalize("\n a  \nb\t\n\n"); got != " a\nb" {
		t.Errorf("normalize = %q", got)
	}
}
