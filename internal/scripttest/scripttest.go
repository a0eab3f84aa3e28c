// Package scripttest runs kvtier's data-driven tests: text files of cases,
// each a few command lines, a "----" line and the output the commands must
// produce, ended by a blank line:
//
//	# comments start with '#'
//	insert w host abc
//	commit w
//	----
//	a: host=ready/0 refs=1
//
// The meaning of the commands belongs to the test that calls Run; this
// package only parses, compares and rewrites. After a deliberate change of
// behaviour, run the tests with -rewrite: every file is written back with
// its comments and commands as they were and the output the code produces
// now, and the diff is what to review.
package scripttest

import (
	"flag"
	"fmt"
	"os"
	"strings"
	"testing"
)

var rewrite = flag.Bool("rewrite", false, "rewrite the expected output of the data-driven test files (testdata/*.txt) with what the code produces now")

// A Command is one command line of a case and where it is.
type Command struct {
	Text string
	Line int // 1-based line number in the file
}

// A Case is one case of a file.
type Case struct {
	File     string
	Commands []Command // the case's command lines, comments and blank lines left out
	Want     string    // the expected output, lines joined by "\n"

	preamble []string // the case's lines before "----" as written (comments and blank lines too)
	after    []string // lines after the file's last case, kept by Format
}

// Line is where the case's first command is, for messages.
func (c *Case) Line() int {
	if len(c.Commands) == 0 {
		return 0
	}
	return c.Commands[0].Line
}

// Parse splits a file's text into cases. A case without a "----" line, or
// a "----" with no command before it, is an error naming the line.
func Parse(file, text string) ([]Case, error) {
	var cases []Case
	var cur Case
	var want []string
	inWant := false
	lines := strings.Split(strings.TrimRight(text, "\n"), "\n")
	for i, line := range lines {
		line = strings.TrimRight(line, " \t\r")
		switch {
		case inWant && line == "":
			cur.Want = strings.Join(want, "\n")
			cases = append(cases, cur)
			cur, want, inWant = Case{}, nil, false
		case inWant:
			want = append(want, line)
		case line == "----":
			cur.File = file
			if len(cur.Commands) == 0 {
				return nil, fmt.Errorf("%s:%d: \"----\" with no command before it", file, i+1)
			}
			inWant = true
		default:
			cur.preamble = append(cur.preamble, line)
			if line != "" && !strings.HasPrefix(line, "#") {
				cur.Commands = append(cur.Commands, Command{Text: line, Line: i + 1})
			}
		}
	}
	switch {
	case inWant:
		cur.Want = strings.Join(want, "\n")
		cases = append(cases, cur)
	case len(cur.Commands) > 0:
		return nil, fmt.Errorf("%s:%d: case has no \"----\" line", file, cur.Line())
	}
	if len(cases) == 0 {
		return nil, fmt.Errorf("%s: no cases", file)
	}
	// Lines after the last case (comments) are kept by Format.
	if !inWant {
		cases[len(cases)-1].after = cur.preamble
	}
	return cases, nil
}

// Format is the inverse of Parse, with each case's output replaced by got[i].
func Format(cases []Case, got []string) string {
	var b strings.Builder
	for i, c := range cases {
		for _, l := range c.preamble {
			b.WriteString(l + "\n")
		}
		b.WriteString("----\n")
		if out := normalize(got[i]); out != "" {
			b.WriteString(out + "\n")
		}
		if i < len(cases)-1 || len(c.after) > 0 {
			b.WriteString("\n")
		}
		for _, l := range c.after {
			b.WriteString(l + "\n")
		}
	}
	return b.String()
}

// Run runs file's cases in order, calling do with each and comparing what
// it returns with the case's expected output (trailing spaces and blank
// lines at either end do not count). State may carry from one case to the
// next: do is a closure over whatever the test needs. With -rewrite, the
// file is written back with the outputs do returned, and nothing is
// compared.
func Run(t *testing.T, file string, do func(t *testing.T, c *Case) string) {
	t.Helper()
	data, err := os.ReadFile(file)
	if err != nil {
		t.Fatal(err)
	}
	cases, err := Parse(file, string(data))
	if err != nil {
		t.Fatal(err)
	}
	got := make([]string, len(cases))
	for i := range cases {
		c := &cases[i]
		got[i] = do(t, c)
		if *rewrite {
			continue
		}
		if g, w := normalize(got[i]), normalize(c.Want); g != w {
			t.Errorf("%s:%d:\n%s\ngot:\n%s\nwant:\n%s", file, c.Line(), commandText(c), g, w)
		}
	}
	if *rewrite {
		if err := os.WriteFile(file, []byte(Format(cases, got)), 0o644); err != nil {
			t.Fatal(err)
		}
	}
}

func commandText(c *Case) string {
	var b strings.Builder
	for _, cmd := range c.Commands {
		b.WriteString(cmd.Text + "\n")
	}
	return strings.TrimSuffix(b.String(), "\n")
}

func normalize(s string) string {
	lines := strings.Split(strings.Trim(s, "\n"), "\n")
	for i, l := range lines {
		lines[i] = strings.TrimRight(l, " \t\r")
	}
	return strings.Trim(strings.Join(lines, "\n"), "\n")
}
