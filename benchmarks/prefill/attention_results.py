"""Writes benchmarks/results/attention-MACHINE.{md,json} from one device
run's attn_check.cu output (every run's milliseconds of kvtier's two
attention kernels) and torch_attention.py's (PyTorch SDPA's on the same
shapes), in the layout of the Go results package (internal/results): one
row per kernel and case, in TFLOP/s, each kernel's ratio over SDPA's (above
1: faster than PyTorch).

    python3 benchmarks/prefill/attention_results.py ATTN_JSON TORCH_JSON \
        --commit C --command "..." --machine h200 --out benchmarks/results
"""
import argparse
import datetime
import json
import os
import statistics

PEAK = 989e12  # the H200's dense bf16 peak (datasheet)


def rates(flops, ms):
    return [flops / (m / 1e3) / 1e12 for m in ms]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("attn")
    ap.add_argument("torch")
    ap.add_argument("--commit", required=True)
    ap.add_argument("--command", required=True)
    ap.add_argument("--machine", default="h200")
    ap.add_argument("--out", required=True)
    ap.add_argument("--date", default=datetime.date.today().isoformat())
    a = ap.parse_args()
    ours = json.load(open(a.attn))
    torch = json.load(open(a.torch))
    tcases = {(c["rows"], c["cached"]): c for c in torch["cases"]}
    rows = []

    def add(name, samples, baseline=None):
        r = {"name": name, "unit": "TFLOP/s", "median": statistics.median(samples), "min": min(samples),
             "max": max(samples), "runs": len(samples), "baseline": baseline["name"] if baseline else "", "ratio": 1}
        if baseline:
            r["ratio"] = r["median"] / baseline["median"]
        rows.append(r)
        return r

    for c in ours:
        key = (c["rows"], c["cached"])
        case = f"attention {c['rows']} rows" + (f" after {c['cached']} cached" if c["cached"] else "")
        t = tcases[key]
        if abs(t["flops"] / c["flops"] - 1) > 1e-6:
            raise SystemExit(f"{case}: PyTorch counted {t['flops']} FLOP, attn_check {c['flops']}")
        base = add(case + " PyTorch SDPA", rates(t["flops"], t["ms"]))
        add(case + " kvtier wgmma (kvm_flash_h128)", rates(c["flops"], c["wgmma_ms"]), base)
        add(case + " kvtier mma.sync (kvm_flash_d128)", rates(c["flops"], c["mma_ms"]), base)
    notes = [
        "llama-3.1-8b's attention: 32 query heads, 8 KV heads of 128, bf16, causal (lower-right after a cached prefix); "
        "KV gathered from blocks of 16 tokens in the server's layout (K as kvm_gather writes it; V transposed by kvm_gather_t "
        "for the wgmma kernel, as kvm_gather for the mma kernel)",
        f"device: {torch['device']}; PyTorch {torch['torch']} F.scaled_dot_product_attention (enable_gqa) in the same device call, "
        "just after benchmarks/prefill/attn_check.cu (nvcc -O3, the committed PTX loaded through the driver API)",
        "TFLOP/s = 4·128 FLOP per (query head, row, key at or before the row's position) over CUDA-event time of one launch; "
        "each kernel after a warm-up, kvtier's two alternated, 5 runs each; ratio = median over PyTorch's (above 1: faster)",
        f"the dense bf16 peak is {PEAK / 1e12:.0f} TFLOP/s (datasheet): the wgmma kernel at 32768 rows reaches "
        + "{:.0%}".format(next(r["median"] for r in rows if r["name"] == "attention 32768 rows kvtier wgmma (kvm_flash_h128)") * 1e12 / PEAK),
    ]
    doc = {"benchmark": "attention", "machine": a.machine, "date": a.date, "commit": a.commit, "command": a.command,
           "notes": notes, "rows": rows}
    os.makedirs(a.out, exist_ok=True)
    base = os.path.join(a.out, f"attention-{a.machine}")
    with open(base + ".json", "w") as f:
        json.dump(doc, f, indent=2)
        f.write("\n")
    with open(base + ".md", "w") as f:
        f.write(f"# attention on {a.machine} ({a.date})\n\nCommand: `{a.command}`  \nCommit: `{a.commit}`\n\n")
        for n in notes:
            f.write(f"- {n}\n")
        f.write("\n| name | unit | median | min | max | runs | baseline | ratio |\n|---|---|---|---|---|---|---|---|\n")
        for r in rows:
            f.write(f"| {r['name']} | {r['unit']} | {r['median']:.3g} | {r['min']:.3g} | {r['max']:.3g} | {r['runs']} | "
                    f"{r['baseline']} | {r['ratio']:.2f} |\n")


if __name__ == "__main__":
    main()
