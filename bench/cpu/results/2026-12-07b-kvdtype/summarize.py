#!/usr/bin/env python3
"""Reads TAG.DTYPE.ROUND.txt (model_cpu_bench output) here; writes TAG.csv (one row per run and
batch) and prints per dtype the medians of decode tok/s at batch 1 and 8, their ratio, and
floor/x at batch 1.   usage: summarize.py TAG"""
import collections, csv, glob, os, statistics as st, sys
tag = sys.argv[1]
here = os.path.dirname(os.path.abspath(__file__))
rows = []
for f in sorted(glob.glob(os.path.join(here, f"{tag}.*.*.txt"))):
    parts = os.path.basename(f).split(".")
    if len(parts) != 4 or not parts[2].isdigit():
        continue
    dtype, rnd = parts[1], int(parts[2])
    load = None
    for line in open(f):
        p = line.split()
        if p and p[0] == "date:":
            load = float(p[3])
        if p and p[0] == "decode":
            rows.append(dict(dtype=dtype, round=rnd, batch=int(p[1]), context=int(p[2]),
                             ms_per_step=float(p[3]), tok_s=float(p[4]), floor_ms=float(p[5]),
                             floor_frac=float(p[6]), load1=load))
with open(os.path.join(here, f"{tag}.csv"), "w", newline="") as out:
    w = csv.DictWriter(out, fieldnames=list(rows[0].keys()))
    w.writeheader()
    w.writerows(sorted(rows, key=lambda r: (r["dtype"], r["round"], r["batch"])))
by = collections.defaultdict(lambda: collections.defaultdict(list))
for r in sorted(rows, key=lambda r: r["round"]):
    by[r["dtype"]][r["batch"]].append(r)
print("| KV | runs | batch 1 tok/s (median) | batch 8 tok/s (median) | b8/b1 (of medians) | b8/b1 (median of per-run) | floor/x b1 (median) | floor ms b1, b8 (median) |")
print("|---|---|---|---|---|---|---|---|")
for d in ["f32", "bf16", "f16", "int8", "fp8"]:
    if d not in by:
        continue
    b1 = [r["tok_s"] for r in by[d][1]]; b8 = [r["tok_s"] for r in by[d][8]]
    per_run = [a / b for a, b in zip(b8, b1)]
    frac = [r["floor_frac"] for r in by[d][1]]
    print(f"| {d} | {len(b1)} | {st.median(b1):.1f} | {st.median(b8):.1f} | "
          f"{st.median(b8) / st.median(b1):.2f} | {st.median(per_run):.2f} | {st.median(frac):.2f} | "
          f"{st.median(r['floor_ms'] for r in by[d][1]):.2f}, {st.median(r['floor_ms'] for r in by[d][8]):.2f} |")
for d in by:
    print(d, "b1", [r["tok_s"] for r in by[d][1]], "b8", [r["tok_s"] for r in by[d][8]])
