#!/usr/bin/env python3
"""Write a Llama-3.1-8B-shaped GGUF with bf16 matrices and random weights (16 GB).

What it is for: the end-to-end GPU peer of issue 18, llama.cpp's CUDA build (llama-bench,
llama-batched-bench) on the same 8B-shaped bf16 file as kvpool (scripts/gpu/llamacpp-peer.sh).
It is written on the GPU machine (to /dev/shm), so it only needs numpy and the `gguf` package
(carried there as a wheel). Speed does not depend on the values: the tensor data are one 64 MiB
pool of random bf16 values in about +-0.035 (standard deviation ~0.02, so activations stay
bounded through the 32 layers) written over and over.

The shape, tensor names, RoPE factors and metadata are make_llama8b_q4km.py's (its tensor plan with
every matrix in BF16, norms and rope_freqs in F32), with file type MOSTLY_BF16.

Run:  python3 scripts/gpu/make_llama8b_bf16.py --out /dev/shm/llama8b-bf16.gguf
"""

from __future__ import annotations

import os
import sys
import time

import numpy as np
import gguf
from gguf.constants import GGMLQuantizationType as QT

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
from make_llama8b_q4km import (  # noqa: E402
    CONTEXT, FFN, HEAD_DIM, HIDDEN, N_HEADS, N_KV_HEADS, N_LAYERS, RMS_EPS, ROPE_THETA, VOCAB,
    check_disk, llama31_rope_factors, new_writer, parse_args, tensor_plan, write_tensors)


def main() -> int:
    args = parse_args(__doc__, "/dev/shm/llama8b-bf16.gguf")
    plan = [(name, shape, QT.F32 if qtype == QT.F32 else QT.BF16)
            for name, shape, qtype in tensor_plan()]
    if not check_disk(args.out, plan):
        return 1
    w = new_writer(args.out, "llama", "Llama-3.1-8B-shaped random bf16", vocab=VOCAB,
                   context=CONTEXT, hidden=HIDDEN, layers=N_LAYERS, ffn=FFN, heads=N_HEADS,
                   kv_heads=N_KV_HEADS, file_type=int(gguf.LlamaFileType.MOSTLY_BF16))
    w.add_rope_dimension_count(HEAD_DIM)
    w.add_rope_freq_base(ROPE_THETA)
    w.add_layer_norm_rms_eps(RMS_EPS)
    w.add_tokenizer_model("none")
    rng = np.random.default_rng(args.seed)
    values = rng.uniform(-0.035, 0.035, size=args.chunk_mib * (1 << 19)).astype(np.float32)
    pool = (values.view(np.uint32) >> 16).astype(np.uint16).view(np.uint8)  # bf16 by truncation

    def write_matrix(fout, qtype, nbytes):
        for start in range(0, nbytes, pool.size):
            pool[:min(pool.size, nbytes - start)].tofile(fout)

    t0 = time.time()
    write_tensors(
        w, plan,
        lambda name, shape: llama31_rope_factors() if name == "rope_freqs.weight"
        else np.ones(shape, np.float32),
        args.seed, args.chunk_mib, write_matrix=write_matrix)
    print(f"wrote {args.out}: {os.path.getsize(args.out) / 1e9:.2f} GB in {time.time() - t0:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
