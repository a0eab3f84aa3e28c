package main

import (
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// fidelityScript runs benchmarks/serve/fidelity.sh over stand-ins: a
// kvtier whose probe fails and a run.sh that records its arguments. It
// returns the script's output, the directory of its output's unpacked
// fidelity/, and its error.
func fidelityScript(t *testing.T, cells string) (string, string, error) {
	t.Helper()
	if _, err := exec.LookPath("bash"); err != nil {
		t.Skip("no bash")
	}
	dir := t.TempDir()
	bin, out := filepath.Join(dir, "bin"), filepath.Join(dir, "out")
	for _, d := range []string{filepath.Join(bin, "traces"), out} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	writeFile(t, bin, "kvtier", "#!/bin/sh\nexit 1\n")
	writeFile(t, bin, "run.sh", "#!/bin/sh\necho \"run.sh $*\" >\"$(dirname \"$3\")/args.txt\"\n")
	for _, f := range []string{"kvtier", "run.sh"} {
		if err := os.Chmod(filepath.Join(bin, f), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	writeFile(t, filepath.Join(bin, "traces"), "chat.jsonl", "{}\n")
	cmd := exec.Command("bash", filepath.Join("..", "fidelity.sh"), bin, out, "chat")
	cmd.Env = append(os.Environ(), "CELLS="+cells, "NVME_DIR="+filepath.Join(dir, "nvme"))
	b, err := cmd.CombinedOutput()
	if err == nil {
		if terr := exec.Command("tar", "-xzf", filepath.Join(out, "fidelity.tar.gz"), "-C", out).Run(); terr != nil {
			t.Fatalf("unpacking the script's output: %v", terr)
		}
	}
	return string(b), filepath.Join(out, "fidelity"), err
}

// TestFidelityScriptCells: CELLS picks the cells; each compressed cell's
// line in cells.tsv carries its codec, and run.sh runs every cell under
// its label with its strategy. A cell the script does not know is an
// error naming it, before anything runs.
func TestFidelityScriptCells(t *testing.T) {
	out, fid, err := fidelityScript(t, "cost-host4 cost-host4-fp8 gpu-only")
	if err != nil {
		t.Fatalf("fidelity.sh: %v\n%s", err, out)
	}
	tsv, err := os.ReadFile(filepath.Join(fid, "chat", "cells.tsv"))
	if err != nil {
		t.Fatal(err)
	}
	want := "cost-host4\tcost\t4GiB\t40GiB\ncost-host4-fp8\tcost\t4GiB\t40GiB\tfp8-e4m3\ngpu-only\tgpu-only\t32GiB\t0\n"
	if string(tsv) != want {
		t.Errorf("cells.tsv:\n%q\nwant\n%q", tsv, want)
	}
	cells, err := readCells(filepath.Join(fid, "chat"))
	if err != nil || len(cells) != 3 || cells[1].codec != "fp8-e4m3" {
		t.Errorf("cells.tsv read back: %+v, %v", cells, err)
	}
	args, err := os.ReadFile(filepath.Join(fid, "chat", "args.txt"))
	if err != nil || !strings.Contains(string(args), "cost-host4=cost cost-host4-fp8=cost gpu-only=gpu-only") {
		t.Errorf("run.sh's arguments: %q, %v", args, err)
	}

	out, _, err = fidelityScript(t, "cost-host4 bogus")
	var ee *exec.ExitError
	if !errors.As(err, &ee) || ee.ExitCode() != 2 || !strings.Contains(out, "CELLS: no cell bogus") || strings.Contains(out, "probe failed") {
		t.Errorf("an unknown cell: %v\n%s", err, out)
	}
}
