#!/usr/bin/env python3
"""Joins attention_cuda_bench's CSV with sdpa_peer.py's and prints the goal table of the issue:
decode time vs SDPA (goal <= 1.1x), fraction of copy bandwidth (goal >= 0.90 at batch x context
>= 64K tokens), batch-1 time (goal < 15 us up to 4K context); prefill TFLOP/s vs the matmul rate
(goal >= 0.65 at length >= 8192) and vs SDPA (goal >= 0.85x).

    python3 scripts/gpu/compare.py ours.csv sdpa.csv
"""
import csv
import sys


def load(path):
    with open(path) as f:
        return list(csv.DictReader(f))


def main():
    ours = load(sys.argv[1])
    if not ours:
        sys.exit("compare: no benchmark rows in " + sys.argv[1])
    peer = {(r["kind"], r["batch"], r["ctx"]): r for r in load(sys.argv[2])}
    mm = float(next(iter(peer.values()))["matmul_tflops"])
    print(f"matmul ceiling (torch, same check) {mm:.0f} TFLOP/s; "
          f"copy ceiling (ours) {ours[0]['copy_gbps']} GB/s")
    print("| case | batch | ctx | ours graph us | ours eager us | sdpa graph us | ours/sdpa "
          "| ours frac copy | sdpa frac copy | goals |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for r in ours:
        if r["kind"] not in ("decode", "prefill"):
            continue
        p = peer.get((r["kind"], r["batch"], r["ctx"]))
        g = float(r["graph_us"])
        pg = float(p["graph_us"]) if p else float("nan")
        ratio = g / pg
        b, c = int(r["batch"]), int(r["ctx"])
        goals = []
        if r["kind"] == "decode":
            goals.append("vs sdpa " + ("ok" if ratio <= 1.1 else "MISSED"))
            if b * c >= 65536:
                goals.append("bw " + ("ok" if float(r["frac_copy"]) >= 0.90 else "MISSED"))
            if b == 1 and c <= 4096:
                goals.append("<15us " + ("ok" if g < 15 else "MISSED"))
            print(f"| decode | {b} | {c} | {g:.2f} | {float(r['eager_us']):.2f} | {pg:.2f} | "
                  f"{ratio:.2f} | {float(r['frac_copy']):.3f} | "
                  f"{float(p['frac_copy']) if p else float('nan'):.3f} | {', '.join(goals)} |")
        else:
            tf = float(r["tflops"])
            ptf = float(p["tflops"]) if p else float("nan")
            goals.append("vs sdpa " + ("ok" if tf >= 0.85 * ptf else "MISSED"))
            if c >= 8192:
                goals.append("matmul " + ("ok" if tf >= 0.65 * mm else "MISSED"))
            print(f"| prefill | {b} | {c} | {g:.1f} | {float(r['eager_us']):.1f} | {pg:.1f} | "
                  f"{ratio:.2f} | {tf:.0f} TFLOP/s = {tf / mm:.2f} of matmul | "
                  f"{ptf:.0f} TFLOP/s = {ptf / mm:.2f} | {', '.join(goals)} |")
    print()
    print("| block size | batch | ctx | graph us | eager us | frac copy |")
    print("|---|---|---|---|---|---|")
    for r in ours:
        if r["kind"] == "decode_block":
            print(f"| {r['block']} | {r['batch']} | {r['ctx']} | {float(r['graph_us']):.2f} | "
                  f"{float(r['eager_us']):.2f} | {float(r['frac_copy']):.3f} |")




def print_splits(ours):
    rows = [r for r in ours if r["kind"] in ("decode_split",)]
    if not rows:
        return
    print()
    print("| min keys per split | batch | ctx | graph us | eager us | frac copy |")
    print("|---|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['min_keys']} | {r['batch']} | {r['ctx']} | {float(r['graph_us']):.2f} | "
              f"{float(r['eager_us']):.2f} | {float(r['frac_copy']):.3f} |")


if __name__ == "__main__":
    main()
    print_splits(load(sys.argv[1]))
