"""Issue 15's calibration shapes, measured again in one process on one
attention path: the five prefills of the issue's table and the four of
benchmarks/results/prefill-h200.json, Llama-shaped, random bf16 weights,
PyTorch SDPA with enable_gqa=True (K and V are never expanded; the script
stops if SDPA refuses it). Writes JSON lines in kvtier calc
--prefill-samples' format, one per shape, with every run.

    python3 calibration_shapes.py --out samples.jsonl [--runs 5]

llama-3.1-70b's 141 GB of weights do not fit one H200 beside its KV, so
its passes are timed on a model of 40 of its 80 layers, with the first 20
of them and with all 40, and the 80-layer time is extrapolated from the
two: t80 = t40 + 2 * (t40 - t20). The layers are identical in shape, so
the difference is exactly 20 layers' time; the embedding and LM head are
counted once.
"""
import argparse
import json
import statistics

import torch

import torch_prefill
from torch_prefill import SHAPES, Model, timed

SHAPES = dict(SHAPES)
SHAPES["llama-3.1-70b"] = dict(layers=80, hidden=8192, qh=64, kvh=8, d=128, inter=28672, vocab=128256, theta=500000.0, eps=1e-5)


def fill(m, toks, p0):
    """Writes the KV of positions [0, p0) as a server's earlier passes would."""
    for p in range(0, p0, 8192):
        m.forward(toks[p:min(p + 8192, p0)], p)


def measure(m, toks, p0, n, runs):
    fill(m, toks, p0)
    return timed(lambda: m.forward(toks[p0:p0 + n], p0), runs, 2)


def write_samples(path, rows):
    """Writes rows as JSON lines with the device and PyTorch version, unless
    SDPA refused enable_gqa at some point (then the rows mix attention
    paths, and nothing is written)."""
    if not torch_prefill._gqa[0]:
        raise SystemExit("SDPA refused enable_gqa: these figures mix attention paths")
    with open(path, "w") as f:
        for r in rows:
            f.write(json.dumps(dict(r, device=torch.cuda.get_device_name(), torch=torch.__version__)) + "\n")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--runs", type=int, default=5)
    a = ap.parse_args()
    dev = torch.device("cuda")
    torch_prefill._gqa[0] = True
    rows = []

    def emit(model, p0, n, secs, **extra):
        r = dict(model=model, prefix=p0, tokens=n, seconds=statistics.median(secs), runs=secs, **extra)
        print(json.dumps(r), flush=True)
        rows.append(r)

    s = SHAPES["llama-3.1-8b"]
    g = torch.Generator(device=dev).manual_seed(1)
    toks = torch.randint(0, s["vocab"], (34816,), device=dev, generator=g)
    m = Model(s, 34816, dev)
    for p0, n in ((0, 512), (0, 2048), (0, 8192), (0, 32768), (8192, 512), (32768, 2048)):
        emit("llama-3.1-8b", p0, n, measure(m, toks, p0, n, a.runs))
    del m
    torch.cuda.empty_cache()

    s70 = dict(SHAPES["llama-3.1-70b"], layers=40)
    m = Model(s70, 8704, dev)
    full = m.layers
    for p0, n in ((0, 2048), (8192, 512)):
        m.layers = full
        fill(m, toks, p0)
        t40 = timed(lambda: m.forward(toks[p0:p0 + n], p0), a.runs, 2)
        m.layers = full[:20]
        t20 = timed(lambda: m.forward(toks[p0:p0 + n], p0), a.runs, 2)
        t80 = [b + 2 * (b - h) for b, h in zip(t40, t20)]
        emit("llama-3.1-70b", p0, n, t80, t40=t40, t20=t20)
    write_samples(a.out, rows)


if __name__ == "__main__":
    main()
