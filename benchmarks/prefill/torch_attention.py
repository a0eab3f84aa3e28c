"""PyTorch baseline for attention alone (benchmarks/prefill/attn_check.cu
times kvtier's kernels on the same shapes in the same run): causal
F.scaled_dot_product_attention over llama-3.1-8b's heads (32 query, 8 KV,
head dim 128, bf16, enable_gqa), for 2048, 8192 and 32768 rows from
scratch and 512 rows after 8192 cached keys (lower-right causal mask).
Prints one JSON object: {"device", "torch", "backend", "cases": [{"rows",
"cached", "flops", "ms": [...]}]}, ms from CUDA events, one warm-up then
--runs runs; flops counts 4·128 per (query head, row, key at or before the
row's position), as attn_check does.

    python3 torch_attention.py [--runs 5] > torch_attention.json
"""
import argparse
import json

import torch
import torch.nn.functional as F
from torch.nn.attention.bias import causal_lower_right

QH, KVH, D = 32, 8, 128


def case(rows, cached, runs, dev):
    g = torch.Generator(device=dev).manual_seed(1)
    q = torch.randn(1, QH, rows, D, device=dev, dtype=torch.bfloat16, generator=g)
    k = torch.randn(1, KVH, cached + rows, D, device=dev, dtype=torch.bfloat16, generator=g)
    v = torch.randn(1, KVH, cached + rows, D, device=dev, dtype=torch.bfloat16, generator=g)

    def run():
        if cached:
            return F.scaled_dot_product_attention(q, k, v, attn_mask=causal_lower_right(rows, cached + rows), enable_gqa=True)
        return F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)

    run()
    torch.cuda.synchronize()
    ms = []
    for _ in range(runs):
        e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        e0.record()
        run()
        e1.record()
        e1.synchronize()
        ms.append(e0.elapsed_time(e1))
    keys = sum(cached + r + 1 for r in range(rows))
    return {"rows": rows, "cached": cached, "flops": 4.0 * D * QH * keys, "ms": ms}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--runs", type=int, default=5)
    a = ap.parse_args()
    dev = torch.device("cuda")
    out = {"device": torch.cuda.get_device_name(dev), "torch": torch.__version__, "cases": []}
    for rows, cached in [(2048, 0), (512, 8192), (8192, 0), (32768, 0)]:
        out["cases"].append(case(rows, cached, a.runs, dev))
    print(json.dumps(out))


if __name__ == "__main__":
    main()
