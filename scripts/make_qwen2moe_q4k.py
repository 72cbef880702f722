#!/usr/bin/env python3
"""Write a Qwen1.5-MoE-A2.7B-shaped GGUF (llama.cpp's qwen2moe layout) in Q4_K with random weights.

What it is for: issue 19's CPU goal, "a Qwen1.5-MoE-A2.7B-shaped GGUF with random weights in Q4_K
(written by a script) decodes with tokens per second within 1.3x of llama.cpp's on the same file".
Speed does not depend on the weight values, so the file has the real model's shape, tensor layout
and byte count, but random weights.

Shape (Qwen/Qwen1.5-MoE-A2.7B's config.json): 24 layers, hidden 2048, 16 query / 16 KV heads of
128 with q/k/v biases, 60 routed experts of FFN 1408, top 4 (probabilities not renormalised), a
shared expert of FFN 5632 with its sigmoid gate, vocab 151936, RoPE theta 1e6, RMS eps 1e-6,
context 8192, untied output.

Tensors as llama.cpp names and stores them: the experts stacked per projection
(blk.N.ffn_{gate,up,down}_exps.weight, numpy shape (60, rows, columns)), the router
blk.N.ffn_gate_inp.weight (60, 2048) and the shared expert's gate blk.N.ffn_gate_inp_shexp.weight
(2048,) in F32 (llama.cpp's quantizer leaves routers unquantised).

Formats, after llama.cpp's Q4_K_M rules (llama-quant.cpp), simplified:
  - every matrix Q4_K, except
  - output.weight Q6_K; attn_v and the shared expert's ffn_down_shexp Q6_K where use_more_bits
  - ffn_down_exps: its rows are 1408 long, not a multiple of Q4_K's 256, so llama.cpp falls back
    from Q4_K to Q5_0 (and from Q6_K to Q8_0 where use_more_bits); this file does the same.
  - norms, biases, routers F32.
  The real quantizer's per-tensor choices for MoE files may differ in details (its ffn_down
  counter also counts the experts' tensors). The file is 9.49 GB (8.84 GiB of tensor data); a
  decode step reads the attention, router, shared expert and 4 of 60 experts of each layer.

Run (from the repo root; 9.5 GB, about 35 s on the 2-core machine):
    .venv/bin/python scripts/make_qwen2moe_q4k.py --out /work/peers/qwen2moe-a2.7b-q4k.gguf
    bench/cpu/compare_llamacpp.sh --llama-dir /work/peers/llama-noamx --reps 3 --decode 32 \\
        /work/peers/qwen2moe-a2.7b-q4k.gguf
"""

from __future__ import annotations

import os
import sys
import time

import numpy as np
import gguf
from gguf.constants import GGMLQuantizationType as QT

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from make_llama8b_q4km import (  # noqa: E402
    check_disk, new_writer, parse_args, use_more_bits, write_tensors)

N_LAYERS = 24
HIDDEN = 2048
N_HEADS = 16
N_KV_HEADS = 16
HEAD_DIM = 128
FFN = 5632            # the dense intermediate size (config.intermediate_size)
N_EXPERTS = 60
TOP_K = 4
EXPERT_FFN = 1408
SHARED_FFN = 5632
VOCAB = 151936
ROPE_THETA = 1e6
CONTEXT = 8192
RMS_EPS = 1e-6


def tensor_plan() -> list:
    """(name, numpy shape, format) for every tensor, in file order."""
    plan: list = [("token_embd.weight", (VOCAB, HIDDEN), QT.Q4_K)]
    q, kv = N_HEADS * HEAD_DIM, N_KV_HEADS * HEAD_DIM
    for i in range(N_LAYERS):
        more = use_more_bits(i, N_LAYERS)
        p = f"blk.{i}."
        plan += [
            (p + "attn_norm.weight", (HIDDEN,), QT.F32),
            (p + "attn_q.weight", (q, HIDDEN), QT.Q4_K),
            (p + "attn_q.bias", (q,), QT.F32),
            (p + "attn_k.weight", (kv, HIDDEN), QT.Q4_K),
            (p + "attn_k.bias", (kv,), QT.F32),
            (p + "attn_v.weight", (kv, HIDDEN), QT.Q6_K if more else QT.Q4_K),
            (p + "attn_v.bias", (kv,), QT.F32),
            (p + "attn_output.weight", (HIDDEN, q), QT.Q4_K),
            (p + "ffn_norm.weight", (HIDDEN,), QT.F32),
            (p + "ffn_gate_inp.weight", (N_EXPERTS, HIDDEN), QT.F32),
            (p + "ffn_gate_exps.weight", (N_EXPERTS, EXPERT_FFN, HIDDEN), QT.Q4_K),
            (p + "ffn_up_exps.weight", (N_EXPERTS, EXPERT_FFN, HIDDEN), QT.Q4_K),
            (p + "ffn_down_exps.weight", (N_EXPERTS, HIDDEN, EXPERT_FFN),
             QT.Q8_0 if more else QT.Q5_0),
            (p + "ffn_gate_inp_shexp.weight", (HIDDEN,), QT.F32),
            (p + "ffn_gate_shexp.weight", (SHARED_FFN, HIDDEN), QT.Q4_K),
            (p + "ffn_up_shexp.weight", (SHARED_FFN, HIDDEN), QT.Q4_K),
            (p + "ffn_down_shexp.weight", (HIDDEN, SHARED_FFN), QT.Q6_K if more else QT.Q4_K),
        ]
    plan += [("output_norm.weight", (HIDDEN,), QT.F32),
             ("output.weight", (VOCAB, HIDDEN), QT.Q6_K)]
    return plan


def main() -> int:
    args = parse_args(__doc__, "/work/peers/qwen2moe-a2.7b-q4k.gguf")
    plan = tensor_plan()
    if not check_disk(args.out, plan):
        return 1

    w = new_writer(args.out, "qwen2moe", "Qwen1.5-MoE-A2.7B-shaped random Q4_K", vocab=VOCAB,
                   context=CONTEXT, hidden=HIDDEN, layers=N_LAYERS, ffn=FFN, heads=N_HEADS,
                   kv_heads=N_KV_HEADS)
    w.add_rope_freq_base(ROPE_THETA)
    w.add_layer_norm_rms_eps(RMS_EPS)
    w.add_expert_count(N_EXPERTS)
    w.add_expert_used_count(TOP_K)
    w.add_expert_feed_forward_length(EXPERT_FFN)
    w.add_expert_shared_feed_forward_length(SHARED_FFN)
    w.add_tokenizer_model("none")

    # routers and the shared expert's gate random (so that tokens spread over the experts), the
    # rest of the F32 tensors ones (norms) and zeros (biases)
    f32_rng = np.random.default_rng(args.seed + 1)

    def f32_data(name: str, shape) -> np.ndarray:
        if "ffn_gate_inp" in name:
            return f32_rng.normal(0.0, 0.05, size=shape).astype(np.float32)
        if name.endswith(".bias"):
            return np.zeros(shape, np.float32)
        return np.ones(shape, np.float32)

    t0 = time.time()
    write_tensors(w, plan, f32_data, args.seed, args.chunk_mib,
                  lambda name: name.endswith("ffn_down_shexp.weight") or name == "output.weight")
    print(f"wrote {args.out}: {os.path.getsize(args.out) / 1e9:.2f} GB in {time.time() - t0:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
