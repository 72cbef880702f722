"""Safetensors test files for kvpool, written by hand with numpy only (the format: u64 header
size, JSON header, data), and the f32 values numpy computes for each tensor.

Usage: make_safetensors_reference.py OUT_DIR

Writes:
  OUT_DIR/single/model.safetensors   F32, F16, BF16 (random, plus special values), I64, a scalar
                                     and an empty tensor; __metadata__ {"format": "pt"}; padding
                                     in the header (spaces) as real writers do
  OUT_DIR/single/config.json
  OUT_DIR/sharded/model-0000{1,2}-of-00002.safetensors + model.safetensors.index.json +
                  config.json
  OUT_DIR/ref/<tensor>.f32            numpy's float32 conversion of each float tensor
  OUT_DIR/expected.json               per tensor: dtype, shape, data_offsets, shard
"""
import json
import os
import sys

import numpy as np


def bf16_bits(rng, shape):
    """Random bf16 bit patterns with exponents of ordinary numbers, and their f32 values."""
    f = rng.standard_normal(shape).astype(np.float32)
    bits = (f.view(np.uint32) >> 16).astype(np.uint16)
    return bits, (bits.astype(np.uint32) << 16).view(np.float32)


def write_safetensors(path, tensors, metadata=None):
    """tensors: list of (name, dtype string, shape, raw bytes)."""
    header = {}
    if metadata is not None:
        header["__metadata__"] = metadata
    offset = 0
    for name, dtype, shape, raw in tensors:
        header[name] = {"dtype": dtype, "shape": list(shape), "data_offsets": [offset, offset + len(raw)]}
        offset += len(raw)
    text = json.dumps(header).encode()
    text += b" " * (-len(text) % 8)
    with open(path, "wb") as f:
        f.write(np.uint64(len(text)).tobytes())
        f.write(text)
        for _, _, _, raw in tensors:
            f.write(raw)
    return header


def main():
    out = sys.argv[1]
    rng = np.random.default_rng(1122)
    for d in ("single", "sharded", "ref"):
        os.makedirs(os.path.join(out, d), exist_ok=True)
    expected = {}

    def add(shard_tensors, name, dtype, array, ref=None):
        shard_tensors.append((name, dtype, array.shape, array.tobytes()))
        if ref is not None:
            ref.astype(np.float32).tofile(os.path.join(out, "ref", name + ".f32"))

    single = []
    x = rng.standard_normal((7, 33)).astype(np.float32)
    add(single, "model.f32", "F32", x, x)
    h = rng.standard_normal((5, 16)).astype(np.float16)
    h.flat[:6] = [0.0, -0.0, np.inf, -np.inf, 6e-8, 65504.0]
    add(single, "model.f16", "F16", h, h.astype(np.float32))
    bits, vals = bf16_bits(rng, (3, 4, 8))
    add(single, "model.bf16", "BF16", bits, vals)
    add(single, "model.i64", "I64", np.arange(6, dtype=np.int64).reshape(2, 3))
    add(single, "model.scalar", "F32", np.array(2.5, dtype=np.float32), np.array(2.5, dtype=np.float32))
    add(single, "model.empty", "F16", np.zeros((0, 4), dtype=np.float16), np.zeros((0, 4), dtype=np.float32))
    header = write_safetensors(os.path.join(out, "single", "model.safetensors"), single, {"format": "pt"})
    for name, entry in header.items():
        if name != "__metadata__":
            expected[f"single/{name}"] = dict(entry, shard="model.safetensors")
    with open(os.path.join(out, "single", "config.json"), "w") as f:
        json.dump({"model_type": "llama", "hidden_size": 33, "num_hidden_layers": 2}, f)

    shards = [[], []]
    weight_map = {}
    for i in range(6):
        s = i % 2
        name = f"layers.{i}.weight"
        if i % 3 == 0:
            a = rng.standard_normal((4, 8)).astype(np.float32)
            add(shards[s], name, "F32", a, a)
        else:
            bits, vals = bf16_bits(rng, (8, 4))
            add(shards[s], name, "BF16", bits, vals)
        weight_map[name] = f"model-0000{s + 1}-of-00002.safetensors"
    for s in range(2):
        file = f"model-0000{s + 1}-of-00002.safetensors"
        header = write_safetensors(os.path.join(out, "sharded", file), shards[s])
        for name, entry in header.items():
            expected[f"sharded/{name}"] = dict(entry, shard=file)
    with open(os.path.join(out, "sharded", "model.safetensors.index.json"), "w") as f:
        json.dump({"metadata": {"total_size": 0}, "weight_map": weight_map}, f)
    with open(os.path.join(out, "sharded", "config.json"), "w") as f:
        json.dump({"model_type": "qwen2", "hidden_size": 8}, f)

    with open(os.path.join(out, "expected.json"), "w") as f:
        json.dump(expected, f, indent=1)


if __name__ == "__main__":
    main()
