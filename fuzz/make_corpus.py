#!/usr/bin/env python3
"""Writes the fuzzers' seed corpora (fuzz/corpus/<target>/) from the real models in models/ and
the fixtures in tests/, each seed small (the whole folder stays well under 2 MB):

  gguf/            the real models' metadata with their arrays cut to the first few hundred
                   tokens and merges, one short tensor of every ggml type each model uses (raw
                   bytes of its first rows); once as is, once with a tiny model's dimensions
  safetensors/     the tiny fixtures' headers with their tensors cut to a few elements
  config/          the tiny fixtures' and the cache planner's config.json files
  tokenizer_json/  tokenizer.json files of the two real tokenizers, vocabularies cut (built with
                   the `tokenizers` package, as tests/tokenizer/hf_reference.py builds them)
  cache_file/      cache files of cache_file_fuzz.cc's running model (0, 5 and 13 tokens); their
                   first byte 0x01 asks the target to fix the checksum
  tokenizer/       lines of tests/tokenizer/corpus.txt (encode) and id runs (decode), each
                   behind tokenizer_fuzz.cc's mode byte

Usage (from the repository root, with the project's .venv):
  .venv/bin/python fuzz/make_corpus.py [--out fuzz/corpus]
"""
import argparse
import json
import os
import shutil
import struct
import sys

import numpy as np
import gguf

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "tests", "tokenizer"))
import hf_reference  # noqa: E402  (tests/tokenizer/hf_reference.py)

MODELS = ["SmolLM2-135M-Instruct.Q4_1.gguf", "gemma-3-270m-q4_k_m.gguf"]
NUM_TOKENS = 600  # tokens kept of a vocabulary (Gemma's bytes end at id 493)


def write(path, data):
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "wb") as f:
        f.write(data)


def trimmed_vocab(reader):
    fields = reader.fields
    tokens = fields["tokenizer.ggml.tokens"].contents()[:NUM_TOKENS]
    kept = set(tokens)
    out = {"tokens": tokens}
    for key in ("tokenizer.ggml.token_type", "tokenizer.ggml.scores"):
        if key in fields:
            out[key] = fields[key].contents()[:NUM_TOKENS]
    if "tokenizer.ggml.merges" in fields:
        merges = []
        for m in fields["tokenizer.ggml.merges"].contents():
            a, _, b = m.partition(" ")
            if a in kept and b in kept and a + b in kept:
                merges.append(m)
        out["tokenizer.ggml.merges"] = merges
    return out


def gguf_seed(model_path, out_path, tiny_dims):
    os.makedirs(os.path.dirname(out_path), exist_ok=True)
    reader = gguf.GGUFReader(model_path)
    arch = reader.fields["general.architecture"].contents()
    writer = gguf.GGUFWriter(out_path, arch)
    vocab = trimmed_vocab(reader)
    small = {"block_count": 2, "embedding_length": 64, "feed_forward_length": 128,
             "attention.head_count": 4, "attention.head_count_kv": 2, "attention.key_length": 16,
             "attention.value_length": 16, "context_length": 256, "vocab_size": NUM_TOKENS}
    for key, field in reader.fields.items():
        if key.startswith("GGUF.") or key == "general.architecture":
            continue
        vtype = field.types[0]
        if key == "tokenizer.ggml.tokens":
            writer.add_array(key, vocab["tokens"])
            continue
        if key in vocab:
            value = vocab[key]
            if key == "tokenizer.ggml.token_type":
                writer.add_key_value(key, [int(x) for x in value], gguf.GGUFValueType.ARRAY,
                                     sub_type=gguf.GGUFValueType.INT32)
            elif key == "tokenizer.ggml.scores":
                writer.add_key_value(key, [float(x) for x in value], gguf.GGUFValueType.ARRAY,
                                     sub_type=gguf.GGUFValueType.FLOAT32)
            else:
                writer.add_array(key, value)
            continue
        value = field.contents()
        short = key[len(arch) + 1:] if key.startswith(arch + ".") else None
        if tiny_dims and short in small:
            value = small[short]
        if vtype == gguf.GGUFValueType.ARRAY:
            if isinstance(value, list):
                value = value[:64]
            writer.add_key_value(key, value, vtype, sub_type=field.types[-1])
        elif vtype == gguf.GGUFValueType.STRING:
            writer.add_key_value(key, value[:2048], vtype)
        else:
            writer.add_key_value(key, value, vtype)
    if tiny_dims and f"{arch}.vocab_size" not in reader.fields:
        writer.add_uint32(f"{arch}.vocab_size", NUM_TOKENS)
    # one short tensor of every type the model uses: the first two rows of 256 elements
    seen = set()
    for t in reader.tensors:
        if t.tensor_type in seen:
            continue
        seen.add(t.tensor_type)
        block, type_size = gguf.GGML_QUANT_SIZES[t.tensor_type]
        row_elements = 256 if t.n_elements >= 512 and 256 % block == 0 else int(t.shape[0])
        num_rows = 2 if t.n_elements >= 2 * row_elements else 1
        nbytes = num_rows * row_elements // block * type_size
        raw = np.frombuffer(bytes(t.data.view(np.uint8).reshape(-1)[:nbytes]), dtype=np.uint8)
        writer.add_tensor(t.name, raw, raw_shape=(num_rows, row_elements // block * type_size),
                          raw_dtype=t.tensor_type)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()


def tokenizer_json_seeds(model_path, out_dir, name):
    reader = gguf.GGUFReader(model_path)
    v = hf_reference.read_gguf_vocab(model_path)
    vocab = trimmed_vocab(reader)
    v["tokens"] = vocab["tokens"]
    v["types"] = vocab.get("tokenizer.ggml.token_type")
    v["scores"] = vocab.get("tokenizer.ggml.scores")
    v["merges"] = vocab.get("tokenizer.ggml.merges")
    for key in ("bos", "eos", "unk"):
        if v[key] is not None and v[key] >= NUM_TOKENS:
            v[key] = None
    if v["model"] == "gpt2":
        tok = hf_reference.build_byte_level(v)
        write(os.path.join(out_dir, f"{name}.json"), tok.to_str().encode())
    else:
        for style in (None, "metaspace_first"):
            tok = hf_reference.build_spm(v, style)
            suffix = "" if style is None else "_" + style
            write(os.path.join(out_dir, f"{name}{suffix}.json"), tok.to_str().encode())


def safetensors_seeds(out_dir):
    for model in ("llama", "gemma3", "qwen2"):
        path = f"tests/model/fixtures/tiny/{model}/model.safetensors"
        with open(path, "rb") as f:
            n = struct.unpack("<Q", f.read(8))[0]
            header = json.loads(f.read(n))
        for dtype, size in (("F32", 4), ("F16", 2), ("BF16", 2)):
            out, data = {"__metadata__": {"format": "pt"}}, b""
            for i, name in enumerate(k for k in sorted(header) if k != "__metadata__"):
                if i == 6:
                    break
                shape = [2, 3] if len(header[name]["shape"]) == 2 else [4]
                nbytes = int(np.prod(shape)) * size
                out[name] = {"dtype": dtype, "shape": shape,
                             "data_offsets": [len(data), len(data) + nbytes]}
                data += bytes((i * 7 + j) % 251 for j in range(nbytes))
            text = json.dumps(out).encode()
            text += b" " * (-len(text) % 8)
            write(os.path.join(out_dir, f"{model}_{dtype.lower()}.safetensors"),
                  struct.pack("<Q", len(text)) + text + data)


def cache_file_seeds(out_dir):
    # cache_file_fuzz.cc's running model: 3 layers (window 8 in the middle), 2 KV heads x 4, f32
    arch, weight_hash, heads, head_dim = b"testarch", 0x0123456789ABCDEF, 2, 4
    layers = [(0, 0), (1, 8), (0, 0)]
    for num_tokens in (0, 5, 13):
        body = b"KVPCACHE" + struct.pack("<II", 1, len(arch)) + arch
        body += struct.pack("<QIIII", weight_hash, len(layers), heads, head_dim, 0)
        for kind, window in layers:
            body += struct.pack("<II", kind, window)
        body += struct.pack("<Q", num_tokens)
        body += b"".join(struct.pack("<i", 3 + 5 * t) for t in range(num_tokens))
        for kind, window in layers:
            kept = min(num_tokens, window) if kind == 1 else num_tokens
            values = np.arange(2 * kept * heads * head_dim, dtype=np.float32) / 7.0
            body += values.tobytes()
        write(os.path.join(out_dir, f"tokens_{num_tokens}.kvc"), b"\x01" + body + bytes(8))


def tokenizer_seeds(out_dir):
    with open("tests/tokenizer/corpus.txt", encoding="utf-8") as f:
        lines = [line for line in f.read().split("\n") if line.strip()]
    for i, line in enumerate(lines[:24]):
        mode = i % 8 & ~2  # encode, either tokenizer, special tokens parsed or not
        write(os.path.join(out_dir, f"encode_{i:02d}"), bytes([mode]) + line.encode()[:300])
    ids = [1, 2, 3, 100, 260, 1000, 30000, 49151, 262143, 238, 493, 0, -1, 1 << 20]
    for mode in (2, 3, 6, 7):  # decode, either tokenizer, skipping special tokens or not
        write(os.path.join(out_dir, f"decode_{mode}"),
              bytes([mode]) + b"".join(struct.pack("<i", x) for x in ids))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default="fuzz/corpus")
    ap.add_argument("--models", default="models")
    args = ap.parse_args()
    for target in ("gguf", "safetensors", "config", "tokenizer_json", "cache_file", "tokenizer"):
        shutil.rmtree(os.path.join(args.out, target), ignore_errors=True)
    for model in MODELS:
        path = os.path.join(args.models, model)
        name = model.split(".")[0].split("-q")[0].lower()
        gguf_seed(path, os.path.join(args.out, "gguf", f"{name}.gguf"), tiny_dims=False)
        gguf_seed(path, os.path.join(args.out, "gguf", f"{name}_tiny_dims.gguf"), tiny_dims=True)
        tokenizer_json_seeds(path, os.path.join(args.out, "tokenizer_json"), name)
    safetensors_seeds(os.path.join(args.out, "safetensors"))
    os.makedirs(os.path.join(args.out, "config"), exist_ok=True)
    for src in sorted(os.listdir("tests/cache/fixtures")):
        shutil.copy(os.path.join("tests/cache/fixtures", src), os.path.join(args.out, "config"))
    for model in ("llama", "gemma3", "qwen2"):
        shutil.copy(f"tests/model/fixtures/tiny/{model}/config.json",
                    os.path.join(args.out, "config", f"tiny_{model}.json"))
    cache_file_seeds(os.path.join(args.out, "cache_file"))
    tokenizer_seeds(os.path.join(args.out, "tokenizer"))


if __name__ == "__main__":
    main()
