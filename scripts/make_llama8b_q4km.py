#!/usr/bin/env python3
"""Write a Llama-3.1-8B-shaped GGUF in Q4_K_M layout with random weights.

What it is for: the 8B rows of the CPU comparison with llama.cpp (issue 14: "a Llama-3.1-8B-shaped
GGUF in Q4_K_M ... loads with resident memory <= 1.1x the file size ... decodes at >= 1.0x
llama.cpp"). Speed does not depend on the weight values, so the file has the real model's shape,
tensor formats and byte count, but random weights.

Shape: 32 layers, hidden 4096, 32 query heads / 8 KV heads of 128, FFN 14336, vocab 128256,
RoPE theta 500000 with Llama 3.1's rope_freqs.weight (factor 8, original context 8192), context
131072, RMS eps 1e-5, untied output.

Formats, as llama.cpp's quantizer picks them for LLAMA_FTYPE_MOSTLY_Q4_K_M (llama-quant.cpp):
  - output.weight                                  Q6_K
  - token_embd.weight                              Q4_K
  - blk.N.attn_v / blk.N.ffn_down                  Q6_K where use_more_bits(N, 32), else Q4_K
    (use_more_bits: N < n/8 or N >= 7n/8 or (N - n/8) % 3 == 2)
  - every other matrix (attn_q/k/output, ffn_gate/up)  Q4_K
  - norms and rope_freqs                           F32

K-quant blocks are random valid bytes: random quants and 6-bit (Q4_K) / int8 (Q6_K) scales, with
small finite f16 super-block scales chosen so that weights stay within about +-0.1 and Q4_K's
are roughly zero-mean (dmin = 7.5 d), so activations stay bounded through the 32 layers.

Tokenizer: none. `tokenizer.ggml.model = "none"` plus `llama.vocab_size`; llama.cpp then makes
dummy tokens and its bench tools feed random ids; kvpool's runner takes the vocabulary size from
`llama.vocab_size` and `kvpool bench` needs no tokenizer (`kvpool serve`/`generate` do, so they
cannot run this file).

Memory stays low: tensor data are generated and written in chunks of --chunk-mib.

Run (from the repo root; ~4.9 GB, about a minute on the 2-core machine):
    .venv/bin/python scripts/make_llama8b_q4km.py --out /work/peers/llama8b-q4km.gguf
    llama-bench -m /work/peers/llama8b-q4km.gguf -p 0 -n 16 -t 2 -r 1
    build/release/apps/kvpool inspect /work/peers/llama8b-q4km.gguf
"""

from __future__ import annotations

import argparse
import math
import os
import sys
import time

import numpy as np
import gguf
from gguf.constants import GGML_QUANT_SIZES, GGMLQuantizationType as QT

N_LAYERS = 32
HIDDEN = 4096
N_HEADS = 32
N_KV_HEADS = 8
HEAD_DIM = 128
FFN = 14336
VOCAB = 128256
ROPE_THETA = 500000.0
CONTEXT = 131072
RMS_EPS = 1e-5


def use_more_bits(i: int, n: int) -> bool:
    """llama.cpp's rule for which layers get Q6_K attn_v / ffn_down in Q4_K_M."""
    return i < n // 8 or i >= 7 * n // 8 or (i - n // 8) % 3 == 2


def llama31_rope_factors() -> np.ndarray:
    """rope_freqs.weight as convert_hf_to_gguf.py writes it for rope_type llama3."""
    factor, low, high, old_ctx = 8.0, 1.0, 4.0, 8192
    low_wavelen, high_wavelen = old_ctx / low, old_ctx / high
    out = []
    for i in range(0, HEAD_DIM, 2):
        freq = 1.0 / (ROPE_THETA ** (i / HEAD_DIM))
        wavelen = 2 * math.pi / freq
        if wavelen < high_wavelen:
            out.append(1.0)
        elif wavelen > low_wavelen:
            out.append(factor)
        else:
            smooth = (old_ctx / wavelen - low) / (high - low)
            out.append(1.0 / ((1 - smooth) / factor + smooth))
    return np.array(out, dtype=np.float32)


def tensor_plan() -> list[tuple[str, tuple[int, int] | tuple[int], QT]]:
    """(name, numpy shape (rows, columns), format) for every tensor, in file order."""
    plan: list = [("token_embd.weight", (VOCAB, HIDDEN), QT.Q4_K),
                  ("rope_freqs.weight", (HEAD_DIM // 2,), QT.F32)]
    q, kv = N_HEADS * HEAD_DIM, N_KV_HEADS * HEAD_DIM
    for i in range(N_LAYERS):
        more = QT.Q6_K if use_more_bits(i, N_LAYERS) else QT.Q4_K
        p = f"blk.{i}."
        plan += [
            (p + "attn_norm.weight", (HIDDEN,), QT.F32),
            (p + "attn_q.weight", (q, HIDDEN), QT.Q4_K),
            (p + "attn_k.weight", (kv, HIDDEN), QT.Q4_K),
            (p + "attn_v.weight", (kv, HIDDEN), more),
            (p + "attn_output.weight", (HIDDEN, q), QT.Q4_K),
            (p + "ffn_norm.weight", (HIDDEN,), QT.F32),
            (p + "ffn_gate.weight", (FFN, HIDDEN), QT.Q4_K),
            (p + "ffn_up.weight", (FFN, HIDDEN), QT.Q4_K),
            (p + "ffn_down.weight", (HIDDEN, FFN), more),
        ]
    plan += [("output_norm.weight", (HIDDEN,), QT.F32),
             ("output.weight", (VOCAB, HIDDEN), QT.Q6_K)]
    return plan


def nbytes_of(shape, qtype: QT) -> int:
    block, size = GGML_QUANT_SIZES[qtype]
    n = int(np.prod(shape))
    assert n % block == 0
    return n // block * size


def random_blocks(rng: np.random.Generator, qtype: QT, nblocks: int) -> np.ndarray:
    """nblocks random valid blocks of Q4_K (144 bytes), Q6_K (210), Q5_0 (22) or Q8_0 (34), as uint8."""
    _, size = GGML_QUANT_SIZES[qtype]
    b = rng.integers(0, 256, size=(nblocks, size), dtype=np.uint8)
    jitter = rng.uniform(0.5, 1.5, size=nblocks)
    if qtype == QT.Q4_K:
        # {f16 d, f16 dmin, u8 scales[12] (6-bit scales and mins), u8 qs[128]}:
        # w = d * sc * q - dmin * m, sc, m in [0, 63], q in [0, 15]; |w| <= ~0.095
        d = (1e-4 * jitter).astype(np.float16)
        dmin = (7.5e-4 * jitter).astype(np.float16)
        b[:, 0:2] = d.view(np.uint8).reshape(nblocks, 2)
        b[:, 2:4] = dmin.view(np.uint8).reshape(nblocks, 2)
    elif qtype == QT.Q6_K:
        # {u8 ql[128], u8 qh[64], i8 scales[16], f16 d}: w = d * sc * (q - 32), q in [0, 63];
        # scales kept in [-16, 15] so |w| <= ~0.1
        sc = b[:, 192:208].view(np.int8) >> 3
        b[:, 192:208] = sc.view(np.uint8)
        d = (2e-4 * jitter).astype(np.float16)
        b[:, 208:210] = d.view(np.uint8).reshape(nblocks, 2)
    elif qtype == QT.Q5_0:
        # {f16 d, u8 qh[4], u8 qs[16]}: w = d * (q - 16), q in [0, 31]; |w| <= ~0.1
        d = (6e-3 * jitter).astype(np.float16)
        b[:, 0:2] = d.view(np.uint8).reshape(nblocks, 2)
    elif qtype == QT.Q8_0:
        # {f16 d, i8 qs[32]}: w = d * q; |w| <= ~0.1
        d = (7.5e-4 * jitter).astype(np.float16)
        b[:, 0:2] = d.view(np.uint8).reshape(nblocks, 2)
    else:
        raise ValueError(qtype)
    return b


def check_disk(path: str, plan) -> bool:
    """Prints the plan's size and the free space; False when the file would not fit."""
    total = sum(nbytes_of(s, t) for _, s, t in plan)
    st = os.statvfs(os.path.dirname(os.path.abspath(path)))
    free = st.f_bavail * st.f_frsize
    print(f"{len(plan)} tensors, {total / 1e9:.2f} GB of tensor data; {free / 1e9:.1f} GB free")
    if free < total * 1.05:
        print("not enough disk space", file=sys.stderr)
        return False
    return True


def write_tensors(w: "gguf.GGUFWriter", plan, f32_data, seed: int, chunk_mib: int,
                  progress=lambda name: False, write_matrix=None) -> None:
    """Writes the header, metadata (already added to w) and every tensor of plan: F32 tensors from
    f32_data(name, shape), quantised ones as random blocks, generated chunk_mib at a time (or by
    write_matrix(fout, qtype, nbytes) when given)."""
    for name, shape, qtype in plan:
        w.add_tensor_info(name, shape, np.dtype(np.float32), nbytes_of(shape, qtype),
                          raw_dtype=qtype)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_ti_data_to_file()

    # tensor data, chunk by chunk (GGUFWriter.write_tensor_data wants whole tensors in memory)
    fout = w.fout[0]
    rng = np.random.default_rng(seed)
    t0, written = time.time(), 0
    for name, shape, qtype in plan:
        w.write_padding(fout, fout.tell())
        nbytes = nbytes_of(shape, qtype)
        if qtype == QT.F32:
            data = f32_data(name, shape)
            assert data.nbytes == nbytes
            data.tofile(fout)
        elif write_matrix is not None:
            write_matrix(fout, qtype, nbytes)
        else:
            block, size = GGML_QUANT_SIZES[qtype]
            nblocks = nbytes // size
            per_chunk = max(1, chunk_mib * (1 << 20) // size)
            for start in range(0, nblocks, per_chunk):
                random_blocks(rng, qtype, min(per_chunk, nblocks - start)).tofile(fout)
        w.write_padding(fout, nbytes)
        written += nbytes
        if progress(name):
            print(f"  {name}: {written / 1e9:.2f} GB written, {time.time() - t0:.0f} s", flush=True)
    w.close()


def parse_args(doc: str, default_out: str) -> argparse.Namespace:
    """--out, --seed and --chunk-mib, the options of the random GGUF writers."""
    ap = argparse.ArgumentParser(description=doc.split("\n\n")[0])
    ap.add_argument("--out", default=default_out)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--chunk-mib", type=int, default=64, help="bytes generated per write")
    return ap.parse_args()


def new_writer(path: str, arch: str, name: str, *, vocab: int, context: int, hidden: int,
               layers: int, ffn: int, heads: int, kv_heads: int,
               file_type: int = int(gguf.LlamaFileType.MOSTLY_Q4_K_M)) -> "gguf.GGUFWriter":
    """A GGUFWriter with the metadata every random file has (file type, Q4_K_M unless told, and
    the shape)."""
    w = gguf.GGUFWriter(path, arch)
    w.add_name(name)
    w.add_file_type(file_type)
    w.add_quantization_version(gguf.GGML_QUANT_VERSION)
    w.add_vocab_size(vocab)
    w.add_context_length(context)
    w.add_embedding_length(hidden)
    w.add_block_count(layers)
    w.add_feed_forward_length(ffn)
    w.add_head_count(heads)
    w.add_head_count_kv(kv_heads)
    return w


def main() -> int:
    args = parse_args(__doc__, "/work/peers/llama8b-q4km.gguf")
    plan = tensor_plan()
    if not check_disk(args.out, plan):
        return 1

    w = new_writer(args.out, "llama", "Llama-3.1-8B-shaped random Q4_K_M", vocab=VOCAB,
                   context=CONTEXT, hidden=HIDDEN, layers=N_LAYERS, ffn=FFN, heads=N_HEADS,
                   kv_heads=N_KV_HEADS)
    w.add_rope_dimension_count(HEAD_DIM)
    w.add_rope_freq_base(ROPE_THETA)
    w.add_layer_norm_rms_eps(RMS_EPS)
    w.add_tokenizer_model("none")
    t0 = time.time()
    write_tensors(
        w, plan,
        lambda name, shape: llama31_rope_factors() if name == "rope_freqs.weight"
        else np.ones(shape, np.float32),
        args.seed, args.chunk_mib,
        lambda name: name.endswith("ffn_down.weight") or name == "output.weight")
    print(f"wrote {args.out}: {os.path.getsize(args.out) / 1e9:.2f} GB in {time.time() - t0:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
