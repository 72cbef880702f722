#!/usr/bin/env python3
# Summarises quant_matmul_bench --variant 1 --variant 2 --rounds K outputs (in-process A/B):
#   summarise_kernel.py FILE...
# Per (shape, threads): each variant's median and quartiles of ms a call over every line of
# every file, and the median over rounds of v2 / v1 (the v2 line against the v1 line just
# before it).
import statistics
import sys
from collections import defaultdict


def quartiles(v):
    v = sorted(v)
    if len(v) < 4:
        return v[0], statistics.median(v), v[-1]
    q = statistics.quantiles(v, n=4)
    return q[0], q[1], q[2]


times = defaultdict(list)
ratios = defaultdict(list)
for name in sys.argv[1:]:
    last_v1 = {}
    for line in open(name):
        f = line.split()
        if len(f) < 13 or f[5] not in ("v1", "v2"):
            continue
        key = (f[0], f[1], f[2], f[4])
        ms = float(f[6])
        times[key + (f[5],)].append(ms)
        if f[5] == "v1":
            last_v1[key] = ms
        elif key in last_v1:
            ratios[key].append(ms / last_v1.pop(key))

print("| matrix | threads | v1 (file layout) median [q1, q3] | v2 (decode groups) | "
      "v2/v1 medians | v2/v1 per round: median [min, max] (rounds) |")
print("|---|--:|--:|--:|--:|--:|")
for key in sorted({k[:4] for k in times}, key=lambda k: (int(k[3]), -int(k[1]) * int(k[2]))):
    a, b = times[key + ("v1",)], times[key + ("v2",)]
    qa, qb, r = quartiles(a), quartiles(b), ratios[key]
    print(f"| {key[0]} {key[1]} x {key[2]} | {key[3]} | {qa[1]:.4f} [{qa[0]:.4f}, {qa[2]:.4f}] | "
          f"{qb[1]:.4f} [{qb[0]:.4f}, {qb[2]:.4f}] | {qb[1] / qa[1]:.3f} | "
          f"{statistics.median(r):.3f} [{min(r):.3f}, {max(r):.3f}] ({len(r)}) |")
