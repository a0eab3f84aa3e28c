#!/usr/bin/env python3
"""Summarize BenchmarkGPUCodec runs (kvtier/transfer, codec_gpu_test.go).

Input: the raw output, each run headed by a line "### VERSION run N", VERSION
naming the build (e.g. old, new). Output: a markdown table on stdout and the
figures as JSON (--json FILE). Per case and build: the median over runs of
each run's per-op median ("p50-us"), its min and max, and the median issue
time; per FP8 case: the sustained wire rate (the encoded bytes of the 48
blocks between the 16- and 64-block ops over the time between them) over the
bf16 path's sustained rate, and the per-op ratio at 64 blocks (the encoded
bytes' rate over the bf16 path's, each op whole, as the issue's 0.9 bar
reads "end to end").
"""
import argparse
import collections
import json
import statistics

RAW, ENC = 2097152, 1052672  # llama-3.1-8b 16-token block, bf16 and FP8


def parse(path):
    runs = collections.defaultdict(list)
    version = None
    for line in open(path):
        if line.startswith('###'):
            version = line.split()[1]
            continue
        if not line.startswith('BenchmarkGPUCodec/'):
            continue
        f = line.split()
        name = f[0].rsplit('-', 1)[0].removeprefix('BenchmarkGPUCodec/')
        m = dict(zip(f[3::2], map(float, f[2::2])))
        runs[(version, name)].append(m)
    return runs


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument('raw')
    ap.add_argument('--json')
    a = ap.parse_args()
    runs = parse(a.raw)
    versions = sorted({v for v, _ in runs}, key=lambda v: (v != 'old', v))

    def p50(v, name):
        return statistics.median(m['p50-us'] for m in runs[(v, name)])

    rows, out = [], []
    print('| build | codec | slots | way | p50 of 64 blocks (us, min-max) | issue (us) | sustained wire rate (GB/s) | of bf16 | per-op ratio |')
    print('|---|---|---|---|---|---|---|---|---|')
    for v in versions:
        for c in ['none', 'fp8', 'fp8-1group', 'fp8-4groups', 'fp8-2MiB']:
            for o in ['seq', 'shuf']:
                for w in ['out', 'in', 'both']:
                    k64, k16 = f'{c}/{o}/{w}/64', f'{c}/{o}/{w}/16'
                    if (v, k64) not in runs:
                        continue
                    ways = 2 if w == 'both' else 1
                    wire = (RAW if c == 'none' else ENC) * ways
                    t64, t16 = p50(v, k64), p50(v, k16)
                    rate = wire * 48 / ((t64 - t16) * 1e-6) / 1e9
                    b64, b16 = p50(v, f'none/{o}/{w}/64'), p50(v, f'none/{o}/{w}/16')
                    bf = RAW * ways * 48 / ((b64 - b16) * 1e-6) / 1e9
                    perop = (wire * 64 / t64) / (RAW * ways * 64 / b64)
                    all64 = [m['p50-us'] for m in runs[(v, k64)]]
                    issue = statistics.median(m['issue-us'] for m in runs[(v, k64)])
                    r = dict(build=v, codec=c, slots=o, way=w, runs=len(all64), p50_us_64=t64, p50_us_16=t16,
                             min_us_64=min(all64), max_us_64=max(all64), issue_us_64=issue,
                             sustained_wire_GBps=round(rate, 2), bf16_sustained_GBps=round(bf, 2),
                             sustained_of_bf16=round(rate / bf, 3), per_op_ratio=round(perop, 3))
                    out.append(r)
                    of = '' if c == 'none' else f'{rate / bf:.2f}'
                    po = '' if c == 'none' else f'{perop:.2f}'
                    print(f'| {v} | {c} | {o} | {w} | {t64:.0f} ({min(all64):.0f}-{max(all64):.0f}) | {issue:.0f} | {rate:.1f} | {of} | {po} |')
    if a.json:
        with open(a.json, 'w') as f:
            json.dump(out, f, indent=1)


if __name__ == '__main__':
    main()
