#!/usr/bin/env python3
"""FlashInfer's paged attention as a peer of bench/gpu/attention_cuda_bench (issue 18), timed the
way scripts/gpu/sdpa_peer.py times torch SDPA (CUDA graph of back-to-back calls over input sets
larger than L2, median per call; eager beside it), with the matmul and copy ceilings of the same
run. Same shapes: 32 q / 8 KV heads, d128, bf16, pages of 16 in a shuffled order (as the block
pool hands them out); prefill is causal, batch 1, q_len = ctx.

    python3 scripts/gpu/flashinfer_peer.py OUT.csv [--kinds decode,prefill]
        [--prefill-backends fa3,fa2] [--decode-modes tc,cuda] [--warmup]

--warmup runs each kernel once on a small shape, untimed: the JIT compiles can then run while
other work has the GPU.

FlashInfer (flashinfer-python 0.6.13 with apache-tvm-ffi, installed with pip --target on the GPU
machine, shared/PEERS.md) JIT-compiles each kernel with the machine's nvcc the first time; export
FLASHINFER_CUDA_ARCH_LIST=9.0a. Not part of the test suite.
"""
import math
import sys

import torch

import flashinfer
from sdpa_peer import (HEAD_DIM, KV_HEADS, Q_HEADS, copy_gbps, matmul_tflops, report,
                       time_calls)

PAGE = 16


def arg(name, default):
    if name in sys.argv[2:-1]:
        return sys.argv[sys.argv.index(name) + 1].split(",")
    return default


def paged_sets(batch, ctx, q_len, kv_bytes, q_bytes):
    """Input sets sharing one page table: (q, kv_cache) each, the cache [pages, 2, 16, 8, 128]."""
    pages_per_seq = (ctx + PAGE - 1) // PAGE
    num_pages = batch * pages_per_seq
    indices = torch.randperm(num_pages, device="cuda", dtype=torch.int32)
    indptr = torch.arange(0, num_pages + 1, pages_per_seq, device="cuda", dtype=torch.int32)
    last = torch.full((batch,), ctx - (pages_per_seq - 1) * PAGE, device="cuda",
                      dtype=torch.int32)
    num_sets = min(max(math.ceil(200e6 / (kv_bytes + 2 * q_bytes)), 2), 64)
    sets = []
    for _ in range(num_sets):
        q = torch.empty(batch * q_len, Q_HEADS, HEAD_DIM, device="cuda",
                        dtype=torch.bfloat16).uniform_(-2, 2)
        kv = torch.empty(num_pages, 2, PAGE, KV_HEADS, HEAD_DIM, device="cuda",
                         dtype=torch.bfloat16).uniform_(-1, 1)
        sets.append((q, kv))
    return indptr, indices, last, sets


def timed(wrapper, sets, repeats):
    def call(i):
        q, kv = sets[i]
        return wrapper.run(q, kv)

    try:
        return time_calls(call, len(sets), repeats)
    except RuntimeError as err:  # a kernel that cannot be captured: eager only
        print(f"  (no graph: {err})", flush=True)
        torch.cuda.synchronize()
        return float("nan"), float("nan")


def run(kind, mode, batch, ctx, q_len, repeats, workspace):
    kv_bytes = batch * ctx * KV_HEADS * HEAD_DIM * 2 * 2
    q_bytes = batch * q_len * Q_HEADS * HEAD_DIM * 2
    indptr, indices, last, sets = paged_sets(batch, ctx, q_len, kv_bytes, q_bytes)
    scale = 1.0 / math.sqrt(HEAD_DIM)
    if kind == "prefill":
        w = flashinfer.BatchPrefillWithPagedKVCacheWrapper(workspace, "NHD", backend=mode)
        qo_indptr = torch.arange(0, batch * q_len + 1, q_len, device="cuda", dtype=torch.int32)
        w.plan(qo_indptr, indptr, indices, last, Q_HEADS, KV_HEADS, HEAD_DIM, PAGE, causal=True,
               sm_scale=scale, q_data_type=torch.bfloat16, kv_data_type=torch.bfloat16)
    else:
        w = flashinfer.BatchDecodeWithPagedKVCacheWrapper(workspace, "NHD",
                                                          use_tensor_cores=mode == "tc")
        w.plan(indptr, indices, last, Q_HEADS, KV_HEADS, HEAD_DIM, PAGE, sm_scale=scale,
               q_data_type=torch.bfloat16, kv_data_type=torch.bfloat16)
    graph_us, eager_us = timed(w, sets, repeats)
    pairs = sum(ctx - q_len + t + 1 for t in range(q_len))
    flops = 4.0 * HEAD_DIM * Q_HEADS * batch * pairs
    num_sets = len(sets)
    del sets
    torch.cuda.empty_cache()
    return graph_us, eager_us, kv_bytes + 2 * q_bytes, flops, num_sets


def main():
    out_path = sys.argv[1]
    kinds = arg("--kinds", ["decode", "prefill"])
    prefill_modes = arg("--prefill-backends", ["fa3", "fa2"])
    decode_modes = arg("--decode-modes", ["tc", "cuda"])
    torch.manual_seed(0)
    workspace = torch.empty(256 << 20, dtype=torch.uint8, device="cuda")
    if "--warmup" in sys.argv[2:]:
        for kind, modes in (("decode", decode_modes), ("prefill", prefill_modes)):
            for mode in modes if kind in kinds else []:
                try:
                    run(kind, mode, 1, 512, 1 if kind == "decode" else 512, 1, workspace)
                    print(f"flashinfer {kind} {mode}: compiled", flush=True)
                except RuntimeError as err:
                    print(f"flashinfer {kind} {mode}: failed ({err})", flush=True)
        return
    repeats = 15
    props = torch.cuda.get_device_properties(0)
    bw = copy_gbps()
    mm = matmul_tflops()
    print(f"gpu {props.name}, torch {torch.__version__}, flashinfer {flashinfer.__version__}")
    print(f"ceiling copy_GBps={bw:.0f} matmul_TFLOPs={mm:.0f}")
    shapes = [("decode", m, b, c, 1) for m in decode_modes for b in (1, 16, 64, 256)
              for c in (512, 4096, 16384)]
    shapes += [("prefill", m, 1, n, n) for m in prefill_modes for n in (2048, 8192, 32768)]
    shapes = [s for s in shapes if s[0] in kinds]
    with open(out_path, "w") as f:
        f.write("kind,mode,batch,ctx,q_len,graph_us,eager_us,bytes,flops,gbps,frac_copy,tflops,"
                "frac_matmul,sets,copy_gbps,matmul_tflops\n")
        for kind, mode, b, c, q_len in shapes:
            try:
                g, e, nbytes, flops, sets = run(kind, mode, b, c, q_len, repeats, workspace)
            except (torch.OutOfMemoryError, RuntimeError) as err:
                print(f"flashinfer {kind} {mode} batch={b} ctx={c}: failed ({err})", flush=True)
                torch.cuda.empty_cache()
                continue
            report(f, f"flashinfer {kind:8s} {mode:4s} batch={b:<3d} ctx={c:<5d}",
                   [kind, mode, b, c, q_len], g, e, nbytes, flops, sets, bw, mm)


if __name__ == "__main__":
    main()
