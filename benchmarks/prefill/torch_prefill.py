"""PyTorch baseline for benchmarks/prefill: the same Llama-architecture
forward pass (llama-3.1-8b shapes by default, bf16, random weights) with
F.scaled_dot_product_attention, timed on the same GPU in the same run as the
Go model. Writes {"device", "torch", "cases": {name: [seconds, ...]}}.

    python3 torch_prefill.py --out torch.json [--runs 3]

Cases: prefill of 2048, 8192 and 32768 tokens; 512 tokens after an 8192-token
cached prefix (a static KV cache, attention masked lower-right causal); one
decode step at batch 1 after 8192 tokens.
"""
import argparse
import json
import math
import statistics
import time

import torch
import torch.nn.functional as F
from torch.nn.attention.bias import causal_lower_right

SHAPES = {
    "llama-3.1-8b": dict(layers=32, hidden=4096, qh=32, kvh=8, d=128, inter=14336, vocab=128256, theta=500000.0, eps=1e-5),
    "tiny": dict(layers=2, hidden=256, qh=4, kvh=2, d=64, inter=512, vocab=512, theta=10000.0, eps=1e-5),
}


class Model:
    def __init__(self, s, max_ctx, dev):
        self.s = s
        g = torch.Generator(device=dev).manual_seed(0)

        def w(o, i, scale=1.0):
            return (torch.randn(o, i, device=dev, dtype=torch.bfloat16, generator=g) * (scale / math.sqrt(i))).contiguous()

        h, qh, kvh, d, inter = s["hidden"], s["qh"], s["kvh"], s["d"], s["inter"]
        self.embed = torch.randn(s["vocab"], h, device=dev, dtype=torch.bfloat16, generator=g)
        self.lm = w(s["vocab"], h, 8.0)
        self.final = torch.ones(h, device=dev, dtype=torch.bfloat16)
        self.layers = []
        for _ in range(s["layers"]):
            self.layers.append(dict(
                n1=torch.ones(h, device=dev, dtype=torch.bfloat16),
                qkv=w((qh + 2 * kvh) * d, h),
                o=w(h, qh * d),
                n2=torch.ones(h, device=dev, dtype=torch.bfloat16),
                gu=w(2 * inter, h),
                down=w(h, inter),
                k=torch.zeros(kvh, max_ctx, d, device=dev, dtype=torch.bfloat16),
                v=torch.zeros(kvh, max_ctx, d, device=dev, dtype=torch.bfloat16),
            ))
        inv = s["theta"] ** (-torch.arange(0, d, 2, device=dev, dtype=torch.float64) / d)
        ang = torch.arange(max_ctx, device=dev, dtype=torch.float64)[:, None] * inv[None, :]
        self.cos, self.sin = ang.cos().float(), ang.sin().float()

    def norm(self, x, w):
        xf = x.float()
        return (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.s["eps"])).to(torch.bfloat16) * w

    def rope(self, x, p0):
        n, half = x.shape[0], x.shape[-1] // 2
        c, s = self.cos[p0:p0 + n, None, :], self.sin[p0:p0 + n, None, :]
        a, b = x[..., :half].float(), x[..., half:].float()
        return torch.cat([a * c - b * s, b * c + a * s], dim=-1).to(torch.bfloat16)

    @torch.inference_mode()
    def forward(self, tokens, p0):
        s = self.s
        n, qh, kvh, d, inter = tokens.shape[0], s["qh"], s["kvh"], s["d"], s["inter"]
        x = self.embed[tokens]
        mask = causal_lower_right(n, p0 + n) if p0 > 0 and n > 1 else None
        for L in self.layers:
            qkv = self.norm(x, L["n1"]) @ L["qkv"].T
            q = self.rope(qkv[:, :qh * d].view(n, qh, d), p0)
            k = self.rope(qkv[:, qh * d:(qh + kvh) * d].view(n, kvh, d), p0)
            v = qkv[:, (qh + kvh) * d:].view(n, kvh, d)
            L["k"][:, p0:p0 + n] = k.transpose(0, 1)
            L["v"][:, p0:p0 + n] = v.transpose(0, 1)
            K, V = L["k"][None, :, :p0 + n], L["v"][None, :, :p0 + n]
            o = attend(q.transpose(0, 1)[None], K, V, mask, p0 == 0 and n > 1)
            x = x + o[0].transpose(0, 1).reshape(n, qh * d) @ L["o"].T
            gu = self.norm(x, L["n2"]) @ L["gu"].T
            x = x + (F.silu(gu[:, :inter]) * gu[:, inter:]) @ L["down"].T
        logits = (self.norm(x[-1:], self.final) @ self.lm.T).float()
        return int(torch.argmax(logits[0]))


_gqa = [True]


def attend(q, K, V, mask, causal):
    """SDPA with grouped-query attention; K and V are expanded only if this
    PyTorch's SDPA refuses enable_gqa for the call."""
    if _gqa[0]:
        try:
            return F.scaled_dot_product_attention(q, K, V, attn_mask=mask, is_causal=causal, enable_gqa=True)
        except (TypeError, RuntimeError) as e:
            print(f"SDPA enable_gqa refused ({e}); expanding K and V", flush=True)
            _gqa[0] = False
    rep = q.shape[1] // K.shape[1]
    return F.scaled_dot_product_attention(q, K.repeat_interleave(rep, 1), V.repeat_interleave(rep, 1),
                                          attn_mask=mask, is_causal=causal)


def timed(fn, runs, warm):
    for _ in range(warm):
        fn()
    out = []
    for _ in range(runs):
        torch.cuda.synchronize()
        t = time.perf_counter()
        fn()
        torch.cuda.synchronize()
        out.append(time.perf_counter() - t)
    return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="llama-3.1-8b")
    ap.add_argument("--out", required=True)
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--decode-runs", type=int, default=20)
    a = ap.parse_args()
    s = SHAPES[a.model]
    dev = torch.device("cuda")
    m = Model(s, 32768, dev)
    g = torch.Generator(device=dev).manual_seed(1)
    toks = torch.randint(0, s["vocab"], (32768,), device=dev, generator=g)
    cases = {}
    for n in (2048, 8192, 32768):
        cases[f"prefill {n}"] = timed(lambda: m.forward(toks[:n], 0), a.runs, 1)
        print(f"prefill {n}: {statistics.median(cases[f'prefill {n}']):.4f} s", flush=True)
    m.forward(toks[:8192], 0)
    cases["prefill 512 after 8192 cached"] = timed(lambda: m.forward(toks[8192:8704], 8192), a.runs, 1)
    cases["decode 1 token after 8192"] = timed(lambda: m.forward(toks[8192:8193], 8192), a.decode_runs, 3)
    for k in list(cases)[3:]:
        print(f"{k}: {statistics.median(cases[k]):.4f} s", flush=True)
    with open(a.out, "w") as f:
        json.dump(dict(device=torch.cuda.get_device_name(), torch=torch.__version__, model=a.model, cases=cases), f, indent=1)


if __name__ == "__main__":
    main()
