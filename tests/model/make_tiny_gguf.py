#!/usr/bin/env python3
"""Writes a tiny Hugging Face fixture model (config.json + model.safetensors) as a GGUF file the
way llama.cpp's convert_hf_to_gguf.py lays such models out, with the `gguf` package:
  - tensor names: token_embd, blk.N.attn_q, ..., output_norm, output (absent when tied)
  - Llama: q/k projection rows permuted within each head (pairs (i, i + d/2) become adjacent
    rows), Llama 3 rope scaling as the per-frequency divisors `rope_freqs.weight`
  - Gemma 3: every norm weight stored as 1 + w; linear rope scaling as rope.scaling.* keys
  - Qwen2 / Qwen3: rows as transformers has them (neox rope); Qwen3's per-head q/k norms as
    blk.N.attn_q_norm / attn_k_norm, plain w
  - Qwen3-MoE (arch qwen3moe): Qwen3's attention; each layer's experts stacked into one 3-D
    tensor per projection, blk.N.ffn_{gate,up,down}_exps.weight [experts, rows, cols], the
    router as blk.N.ffn_gate_inp.weight, and {arch}.expert_count / expert_used_count /
    expert_feed_forward_length
  - Qwen2-MoE (arch qwen2moe): Qwen2's attention, experts as Qwen3-MoE's, the shared expert as
    blk.N.ffn_{gate,up,down}_shexp.weight, its gate as blk.N.ffn_gate_inp_shexp.weight, and
    {arch}.expert_shared_feed_forward_length
  - GPT-OSS (arch gpt-oss), as conversion/gpt_oss.py writes unquantised experts: transformers'
    gate_up_proj [experts, hidden, 2 * ffn] transposed and split into its interleaved gate (even)
    and up (odd) rows, blk.N.ffn_{gate,up}_exps.weight [experts, ffn, hidden] and .bias
    [experts, ffn]; down_proj transposed to blk.N.ffn_down_exps.weight [experts, hidden, ffn];
    the router as blk.N.ffn_gate_inp.{weight,bias}, sinks as blk.N.attn_sinks.weight, the norm
    before the MLP as blk.N.post_attention_norm.weight; {arch}.attention.sliding_window and the
    YaRN keys rope.scaling.{type,factor,original_context_length,yarn_beta_fast,yarn_beta_slow}
All tensors stay F32 (the goldens' greedy margins are as small as 2e-4; conversions of other
types are tested against the gguf package in gguf_file_test.cc).
kvpool reads the result with its own GGUF reader; the test compares the logits with the
transformers goldens of the same weights.
Usage: make_tiny_gguf.py MODEL_DIR OUT.gguf [--arch NAME] [--drop TENSOR] [--transpose TENSOR]
                         [--expert-type Q8_0 [--expert-roundtrip]]
  --arch, --drop, --transpose make damaged variants for the error tests (another architecture
  name, a GGUF tensor left out, a GGUF tensor written transposed); --expert-type stores the
  3-D expert tensors quantised by the gguf package (the reader's row slices of a block format);
  --expert-roundtrip writes those experts' dequantised values as F32 instead (the same numbers
  without the block format).
"""
import argparse
import json
import math
import struct
import sys

import numpy as np
import gguf


def read_safetensors(path):
    with open(path, "rb") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        header = json.loads(f.read(n))
        data = f.read()
    out = {}
    for name, info in header.items():
        if name == "__metadata__":
            continue
        assert info["dtype"] == "F32", (name, info["dtype"])
        b, e = info["data_offsets"]
        out[name] = np.frombuffer(data[b:e], dtype=np.float32).reshape(info["shape"]).copy()
    return out


def permute(w, n_head):
    # convert_hf_to_gguf.py LlamaModel.permute
    return (w.reshape(n_head, 2, w.shape[0] // n_head // 2, *w.shape[1:])
            .swapaxes(1, 2).reshape(w.shape))


def llama3_rope_factors(head_dim, rope):
    # convert_hf_to_gguf.py LlamaModel.generate_extra_tensors
    base = rope["rope_theta"]
    factor = rope["factor"]
    low, high = rope["low_freq_factor"], rope["high_freq_factor"]
    old_len = rope["original_max_position_embeddings"]
    freqs = 1.0 / (base ** (np.arange(0, head_dim, 2, dtype=np.float32) / head_dim))
    low_wavelen, high_wavelen = old_len / low, old_len / high
    factors = []
    for freq in freqs:
        wavelen = 2 * math.pi / freq
        if wavelen < high_wavelen:
            factors.append(1.0)
        elif wavelen > low_wavelen:
            factors.append(factor)
        else:
            smooth = (old_len / wavelen - low) / (high - low)
            factors.append(1 / ((1 - smooth) / factor + smooth))
    return np.array(factors, dtype=np.float32)


def main(model_dir, out_path, arch_override=None, drop=None, transpose=None, expert_type=None,
         expert_roundtrip=False):
    cfg = json.load(open(f"{model_dir}/config.json"))
    tensors = read_safetensors(f"{model_dir}/model.safetensors")
    arch = {"llama": "llama", "qwen2": "qwen2", "qwen3": "qwen3", "qwen3_moe": "qwen3moe",
            "qwen2_moe": "qwen2moe", "gpt_oss": "gpt-oss",
            "gemma3_text": "gemma3", "gemma3": "gemma3"}[cfg["model_type"]]
    convention = arch  # the tensor layout follows the real architecture
    n_head, n_kv = cfg["num_attention_heads"], cfg["num_key_value_heads"]
    head_dim = cfg.get("head_dim", cfg["hidden_size"] // n_head)
    rope = cfg["rope_parameters"]
    global_rope = rope.get("full_attention", rope)

    if arch_override:
        arch = arch_override
    w = gguf.GGUFWriter(out_path, arch)
    w.add_uint32(f"{arch}.block_count", cfg["num_hidden_layers"])
    w.add_uint32(f"{arch}.context_length", cfg["max_position_embeddings"])
    w.add_uint32(f"{arch}.embedding_length", cfg["hidden_size"])
    w.add_uint32(f"{arch}.feed_forward_length", cfg["intermediate_size"])
    w.add_uint32(f"{arch}.attention.head_count", n_head)
    w.add_uint32(f"{arch}.attention.head_count_kv", n_kv)
    w.add_uint32(f"{arch}.attention.key_length", head_dim)
    w.add_uint32(f"{arch}.attention.value_length", head_dim)
    w.add_uint32(f"{arch}.rope.dimension_count", head_dim)
    w.add_uint32(f"{arch}.vocab_size", cfg["vocab_size"])
    w.add_float32(f"{arch}.rope.freq_base", global_rope["rope_theta"])
    w.add_float32(f"{arch}.attention.layer_norm_rms_epsilon", cfg["rms_norm_eps"])
    if cfg.get("bos_token_id") is not None:
        w.add_uint32("tokenizer.ggml.bos_token_id", cfg["bos_token_id"])
    eos = cfg.get("eos_token_id")
    if eos is not None:
        w.add_uint32("tokenizer.ggml.eos_token_id", eos[0] if isinstance(eos, list) else eos)
    if convention in ("gemma3", "gpt-oss"):
        w.add_uint32(f"{arch}.attention.sliding_window", cfg["sliding_window"])
    if convention == "gpt-oss":
        w.add_uint32(f"{arch}.expert_count", cfg["num_local_experts"])
        w.add_uint32(f"{arch}.expert_used_count", cfg["num_experts_per_tok"])
        w.add_uint32(f"{arch}.expert_feed_forward_length", cfg["intermediate_size"])
        split_gpt_oss_experts(tensors)
    if global_rope.get("rope_type") == "yarn":
        w.add_string(f"{arch}.rope.scaling.type", "yarn")
        w.add_float32(f"{arch}.rope.scaling.factor", global_rope["factor"])
        w.add_uint32(f"{arch}.rope.scaling.original_context_length",
                     global_rope["original_max_position_embeddings"])
        w.add_float32(f"{arch}.rope.scaling.yarn_beta_fast", global_rope["beta_fast"])
        w.add_float32(f"{arch}.rope.scaling.yarn_beta_slow", global_rope["beta_slow"])
    if convention in ("qwen3moe", "qwen2moe"):
        # transformers 5 writes num_local_experts, Qwen's own configs num_experts
        num_experts = cfg.get("num_experts", cfg.get("num_local_experts"))
        w.add_uint32(f"{arch}.expert_count", num_experts)
        w.add_uint32(f"{arch}.expert_used_count", cfg["num_experts_per_tok"])
        w.add_uint32(f"{arch}.expert_feed_forward_length", cfg["moe_intermediate_size"])
        stack_experts(tensors, cfg["num_hidden_layers"], num_experts)
    if convention == "qwen2moe":
        w.add_uint32(f"{arch}.expert_shared_feed_forward_length",
                     cfg["shared_expert_intermediate_size"])
    if global_rope.get("rope_type") == "linear":
        w.add_string(f"{arch}.rope.scaling.type", "linear")
        w.add_float32(f"{arch}.rope.scaling.factor", global_rope["factor"])

    names = {
        "model.embed_tokens.weight": "token_embd.weight",
        "model.norm.weight": "output_norm.weight",
        "lm_head.weight": "output.weight",
    }
    per_layer = {
        "input_layernorm.weight": "attn_norm.weight",
        "self_attn.q_proj.weight": "attn_q.weight",
        "self_attn.k_proj.weight": "attn_k.weight",
        "self_attn.v_proj.weight": "attn_v.weight",
        "self_attn.o_proj.weight": "attn_output.weight",
        "self_attn.q_proj.bias": "attn_q.bias",
        "self_attn.k_proj.bias": "attn_k.bias",
        "self_attn.v_proj.bias": "attn_v.bias",
        "self_attn.q_norm.weight": "attn_q_norm.weight",
        "self_attn.k_norm.weight": "attn_k_norm.weight",
        "mlp.gate_proj.weight": "ffn_gate.weight",
        "mlp.up_proj.weight": "ffn_up.weight",
        "mlp.down_proj.weight": "ffn_down.weight",
        "mlp.gate.weight": "ffn_gate_inp.weight",
        "mlp.shared_expert.gate_proj.weight": "ffn_gate_shexp.weight",
        "mlp.shared_expert.up_proj.weight": "ffn_up_shexp.weight",
        "mlp.shared_expert.down_proj.weight": "ffn_down_shexp.weight",
        "mlp.shared_expert_gate.weight": "ffn_gate_inp_shexp.weight",
        "mlp.experts.gate_proj": "ffn_gate_exps.weight",
        "mlp.experts.up_proj": "ffn_up_exps.weight",
        "mlp.experts.down_proj": "ffn_down_exps.weight",
        "mlp.experts.gate_proj.bias": "ffn_gate_exps.bias",
        "mlp.experts.up_proj.bias": "ffn_up_exps.bias",
        "mlp.experts.down_proj.bias": "ffn_down_exps.bias",
        "mlp.router.weight": "ffn_gate_inp.weight",
        "mlp.router.bias": "ffn_gate_inp.bias",
        "self_attn.o_proj.bias": "attn_output.bias",
        "self_attn.sinks": "attn_sinks.weight",
        "pre_feedforward_layernorm.weight": "ffn_norm.weight",
        "post_feedforward_layernorm.weight": "post_ffw_norm.weight",
        "post_attention_layernorm.weight":
            "post_attention_norm.weight" if convention in ("gemma3", "gpt-oss")
            else "ffn_norm.weight",
    }
    for name in sorted(tensors):
        data = tensors[name]
        if name.startswith("model.layers."):
            _, _, layer, rest = name.split(".", 3)
            out = f"blk.{layer}.{per_layer[rest]}"
        else:
            out = names[name]
        if convention == "llama" and rest_is(name, "self_attn.q_proj.weight"):
            data = permute(data, n_head)
        if convention == "llama" and rest_is(name, "self_attn.k_proj.weight"):
            data = permute(data, n_kv)
        if convention == "gemma3" and name.endswith("norm.weight"):
            data = data + 1.0
        if out == drop:
            continue
        if out == transpose:
            data = data.T
        if expert_type and out.endswith("_exps.weight"):
            qtype = gguf.GGMLQuantizationType[expert_type]
            blocks = gguf.quants.quantize(np.ascontiguousarray(data), qtype)
            if expert_roundtrip:  # the rounded values, stored as F32
                w.add_tensor(out, gguf.quants.dequantize(blocks, qtype).astype(np.float32))
            else:
                w.add_tensor(out, blocks, raw_dtype=qtype)
            continue
        w.add_tensor(out, np.ascontiguousarray(data))
    if global_rope.get("rope_type") == "llama3":
        w.add_tensor("rope_freqs.weight", llama3_rope_factors(head_dim, global_rope))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def stack_experts(tensors, num_layers, num_experts):
    # convert_hf_to_gguf.py Qwen2MoeModel.modify_tensors: per-expert matrices → one 3-D tensor
    for layer in range(num_layers):
        for proj in ("gate_proj", "up_proj", "down_proj"):
            names = [f"model.layers.{layer}.mlp.experts.{e}.{proj}.weight"
                     for e in range(num_experts)]
            if names[0] not in tensors:
                continue
            tensors[f"model.layers.{layer}.mlp.experts.{proj}"] = np.stack(
                [tensors.pop(n) for n in names])


def split_gpt_oss_experts(tensors):
    # conversion/gpt_oss.py GptOssModel.modify_tensors (unquantised experts)
    for name in [n for n in tensors if n.endswith("mlp.experts.gate_up_proj")]:
        gate_up = tensors.pop(name).transpose(0, 2, 1)  # [experts, 2 * ffn, hidden]
        tensors[name.replace("gate_up_proj", "gate_proj")] = gate_up[:, ::2, :]
        tensors[name.replace("gate_up_proj", "up_proj")] = gate_up[:, 1::2, :]
        bias = tensors.pop(name + "_bias")
        tensors[name.replace("gate_up_proj", "gate_proj.bias")] = bias[..., ::2]
        tensors[name.replace("gate_up_proj", "up_proj.bias")] = bias[..., 1::2]
        down = name.replace("gate_up_proj", "down_proj")
        tensors[down] = tensors[down].transpose(0, 2, 1)  # [experts, hidden, ffn]
        tensors[down + ".bias"] = tensors.pop(down + "_bias")


def rest_is(name, suffix):
    return name.startswith("model.layers.") and name.endswith(suffix)


if __name__ == "__main__":
    ap = argparse.ArgumentParser()
    ap.add_argument("model_dir")
    ap.add_argument("out")
    ap.add_argument("--arch")
    ap.add_argument("--drop")
    ap.add_argument("--transpose")
    ap.add_argument("--expert-type")
    ap.add_argument("--expert-roundtrip", action="store_true")
    a = ap.parse_args()
    main(a.model_dir, a.out, a.arch, a.drop, a.transpose, a.expert_type, a.expert_roundtrip)
