"""An out-of-sample check of the calibration's weight term (kvtier/cost
PrefillFit, issue 15): prefills of two models of other widths than the
samples the fits were made from, Llama-3.2-1B (2,048 wide, 16 layers) and
a Qwen2.5-7B-shaped model (3,584 wide, 28 layers; no QKV bias, which
changes no product's shape), with Llama-3.1-8B (4,096 wide) again for
reference. Same model code, timing and attention path as
calibration_shapes.py (PyTorch SDPA with enable_gqa=True; the script stops
if SDPA refuses it), median of --runs after 2 warm-ups. Writes JSON lines
in kvtier calc --prefill-samples' format, with every run.

    python3 width_check.py --out samples.jsonl [--runs 5]
"""
import argparse
import json
import statistics

import torch

import torch_prefill
from calibration_shapes import measure, write_samples
from torch_prefill import SHAPES, Model

SHAPES = dict(SHAPES)
SHAPES["llama-3.2-1b"] = dict(layers=16, hidden=2048, qh=32, kvh=8, d=64, inter=8192, vocab=128256, theta=500000.0, eps=1e-5)
SHAPES["qwen2.5-7b"] = dict(layers=28, hidden=3584, qh=28, kvh=4, d=128, inter=18944, vocab=152064, theta=1000000.0, eps=1e-6)

CASES = ((0, 512), (0, 2048), (0, 8192), (8192, 512), (8192, 2048), (32768, 2048))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--runs", type=int, default=5)
    a = ap.parse_args()
    dev = torch.device("cuda")
    torch_prefill._gqa[0] = True
    rows = []
    for name in ("llama-3.2-1b", "qwen2.5-7b", "llama-3.1-8b"):
        s = SHAPES[name]
        g = torch.Generator(device=dev).manual_seed(1)
        toks = torch.randint(0, s["vocab"], (34816,), device=dev, generator=g)
        m = Model(s, 34816, dev)
        for p0, n in CASES:
            secs = measure(m, toks, p0, n, a.runs)
            r = dict(model=name, prefix=p0, tokens=n, seconds=statistics.median(secs), runs=secs)
            print(json.dumps(r), flush=True)
            rows.append(r)
        del m
        torch.cuda.empty_cache()
    write_samples(a.out, rows)


if __name__ == "__main__":
    main()
