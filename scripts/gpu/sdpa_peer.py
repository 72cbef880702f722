#!/usr/bin/env python3
"""Peer benchmark for bench/gpu/attention_cuda_bench: torch SDPA on contiguous KV, measured the
same way (CUDA graph of many back-to-back calls rotating over input sets larger than L2, median
of the replays, per call; plus eager per call), and the two ceilings of the same run: device
copy bandwidth (bytes read + written) and a dense bf16 matmul rate (8192^3).

    python3 scripts/gpu/sdpa_peer.py OUT.csv [--quick] [--kinds decode,prefill]
"""
import math
import statistics
import sys

import torch
import torch.nn.functional as F

Q_HEADS, KV_HEADS, HEAD_DIM = 32, 8, 128


def time_calls(call, num_sets, repeats):
    for i in range(num_sets):
        call(i)
    torch.cuda.synchronize()
    start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    call(0)
    stop.record()
    stop.synchronize()
    one_ms = max(start.elapsed_time(stop), 1e-4)
    calls = min(max(math.ceil(3.0 / one_ms), num_sets), 512)
    calls = (calls + num_sets - 1) // num_sets * num_sets
    eager = []
    for _ in range(repeats):
        start.record()
        for i in range(calls):
            call(i % num_sets)
        stop.record()
        stop.synchronize()
        eager.append(1000.0 * start.elapsed_time(stop) / calls)
    graph = torch.cuda.CUDAGraph()
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for i in range(num_sets):
            call(i)
    torch.cuda.current_stream().wait_stream(side)
    with torch.cuda.graph(graph):
        for i in range(calls):
            call(i % num_sets)
    graph.replay()
    replays = []
    for _ in range(repeats):
        start.record()
        graph.replay()
        stop.record()
        stop.synchronize()
        replays.append(1000.0 * start.elapsed_time(stop) / calls)
    return statistics.median(replays), statistics.median(eager)


def copy_gbps():
    n = 2 << 30
    a = torch.empty(n, dtype=torch.uint8, device="cuda").random_(0, 255)
    b = torch.empty_like(a)
    start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    out = []
    for r in range(12):
        start.record()
        b.copy_(a)
        stop.record()
        stop.synchronize()
        if r >= 2:
            out.append(2 * n / (start.elapsed_time(stop) * 1e-3) / 1e9)
    return statistics.median(out)


def matmul_tflops():
    n = 8192
    a = torch.randn(n, n, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(n, n, device="cuda", dtype=torch.bfloat16)
    for _ in range(3):
        a @ b
    start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    out = []
    for _ in range(10):
        start.record()
        a @ b
        stop.record()
        stop.synchronize()
        out.append(2 * n ** 3 / (start.elapsed_time(stop) * 1e-3) / 1e12)
    return statistics.median(out)


def run(kind, batch, ctx, q_len, repeats):
    kv_bytes = batch * ctx * KV_HEADS * HEAD_DIM * 2 * 2
    q_bytes = batch * q_len * Q_HEADS * HEAD_DIM * 2
    num_sets = min(max(math.ceil(200e6 / (kv_bytes + 2 * q_bytes)), 2), 64)
    sets = []
    for _ in range(num_sets):
        q = torch.empty(batch, Q_HEADS, q_len, HEAD_DIM, device="cuda",
                        dtype=torch.bfloat16).uniform_(-2, 2)
        k = torch.empty(batch, KV_HEADS, ctx, HEAD_DIM, device="cuda",
                        dtype=torch.bfloat16).uniform_(-1, 1)
        v = torch.empty_like(k).uniform_(-1, 1)
        sets.append((q, k, v))
    causal = kind == "prefill"
    scale = 1.0 / math.sqrt(HEAD_DIM)

    def call(i):
        q, k, v = sets[i]
        return F.scaled_dot_product_attention(q, k, v, is_causal=causal, scale=scale,
                                              enable_gqa=True)

    graph_us, eager_us = time_calls(call, num_sets, repeats)
    pairs = sum(ctx - q_len + t + 1 for t in range(q_len))
    flops = 4.0 * HEAD_DIM * Q_HEADS * batch * pairs
    del sets
    torch.cuda.empty_cache()
    return graph_us, eager_us, kv_bytes + 2 * q_bytes, flops, num_sets


def report(out, label, fields, graph_us, eager_us, nbytes, flops, sets, bw, mm):
    """Prints one measured line after `label` and writes its CSV row (`fields`, then the times, the
    rates and their fractions of the ceilings bw and mm). The rates use the graph time, or the
    eager one where no graph was captured (graph_us NaN)."""
    t = graph_us if graph_us == graph_us else eager_us
    gbps = nbytes / (t * 1e-6) / 1e9
    tf = flops / (t * 1e-6) / 1e12
    print(f"{label} graph_us={graph_us:9.2f} eager_us={eager_us:9.2f} GBps={gbps:6.0f} "
          f"frac_copy={gbps / bw:.3f} TFLOPs={tf:6.1f} frac_matmul={tf / mm:.3f}", flush=True)
    out.write(",".join(str(x) for x in fields) +
              f",{graph_us:.3f},{eager_us:.3f},{nbytes},{flops:.0f},{gbps:.1f},{gbps / bw:.4f},"
              f"{tf:.2f},{tf / mm:.4f},{sets},{bw:.0f},{mm:.1f}\n")


def main():
    out_path = sys.argv[1]
    quick = "--quick" in sys.argv[2:]
    kinds = ["decode", "prefill"]
    if "--kinds" in sys.argv[2:-1]:
        kinds = sys.argv[sys.argv.index("--kinds") + 1].split(",")
    repeats = 5 if quick else 15
    torch.manual_seed(0)
    props = torch.cuda.get_device_properties(0)
    bw = copy_gbps()
    mm = matmul_tflops()
    print(f"gpu {props.name}, torch {torch.__version__}")
    print(f"ceiling copy_GBps={bw:.0f} matmul_TFLOPs={mm:.0f}")
    shapes = [("decode", b, c, 1) for b in (1, 16, 64, 256) for c in (512, 4096, 16384)]
    shapes += [("prefill", 1, n, n) for n in (2048, 8192, 32768)]
    shapes = [s for s in shapes if s[0] in kinds]
    with open(out_path, "w") as f:
        f.write("kind,batch,ctx,q_len,graph_us,eager_us,bytes,flops,gbps,frac_copy,tflops,"
                "frac_matmul,sets,copy_gbps,matmul_tflops\n")
        for kind, b, c, q_len in shapes:
            try:
                g, e, nbytes, flops, sets = run(kind, b, c, q_len, repeats)
            except torch.OutOfMemoryError as err:
                print(f"sdpa {kind} batch={b} ctx={c}: out of memory ({err})", flush=True)
                torch.cuda.empty_cache()
                continue
            report(f, f"sdpa {kind:8s} batch={b:<3d} ctx={c:<5d}", [kind, b, c, q_len], g, e,
                   nbytes, flops, sets, bw, mm)


if __name__ == "__main__":
    main()
