// Command kvtier is kvtier's command-line tool:
//
//	kvtier replay   replay a request trace through the block manager (the main job)
//	kvtier calc     reload or recompute? for a model, context length and link
//	kvtier probe    the device's facts and measured link figures
//	kvtier pin      pin a host pool with the pipelined allocator, with a progress bar
//	kvtier bench-serve  replay a trace against a completions server: TTFT, throughput, --verify
//
// The benchmarks against the baselines are programs under benchmarks/.
//
// Each subcommand lives in its own file and registers itself in init.
package main

import (
	"fmt"
	"io"
	"os"
	"sort"

	"golang.org/x/term"

	"kvtier.dev/internal/invariants"
)

// command is one subcommand. run gets the arguments after the subcommand's
// name and returns the process exit code.
type command struct {
	name    string
	summary string
	run     func(args []string, stdout, stderr io.Writer) int
}

var commands = map[string]command{}

func register(c command) {
	if _, dup := commands[c.name]; dup {
		invariants.Failf("subcommand %q registered twice", c.name)
	}
	commands[c.name] = c
}

func main() {
	os.Exit(run(os.Args[1:], os.Stdout, os.Stderr))
}

func run(args []string, stdout, stderr io.Writer) int {
	if len(args) == 0 || args[0] == "-h" || args[0] == "--help" || args[0] == "help" {
		usage(stderr)
		if len(args) == 0 {
			return 2
		}
		return 0
	}
	c, ok := commands[args[0]]
	if !ok {
		fmt.Fprintf(stderr, "kvtier: unknown command %q\n", args[0])
		usage(stderr)
		return 2
	}
	return c.run(args[1:], stdout, stderr)
}

func usage(w io.Writer) {
	fmt.Fprintln(w, "usage: kvtier <command> [flags]")
	fmt.Fprintln(w, "commands:")
	names := make([]string, 0, len(commands))
	for n := range commands {
		names = append(names, n)
	}
	sort.Strings(names)
	for _, n := range names {
		fmt.Fprintf(w, "  %-8s %s\n", n, commands[n].summary)
	}
	fmt.Fprintln(w, "run 'kvtier <command> -h' for a command's flags")
}

// showProgress says whether a subcommand draws a progress bar: mode
// "always", "never", or "auto" for only when stderr is a terminal.
func showProgress(mode string, stderr io.Writer) bool {
	switch mode {
	case "always":
		return true
	case "never":
		return false
	}
	f, ok := stderr.(*os.File)
	return ok && term.IsTerminal(int(f.Fd()))
}
