#!/usr/bin/env python3
"""Makes kvpool's tiny random-weight reference models with Hugging Face transformers.

For each architecture (Llama with Llama 3 rope scaling and tied embeddings, Qwen2 with q/k/v
bias, Gemma 3 with interleaved sliding-window and global layers, Qwen3 with per-head q/k RMS
norms, an explicit head_dim unequal to hidden / heads and tied embeddings, Qwen3-MoE with 4
experts of which each token runs 2, Qwen2-MoE with 6 experts, top 2, a gated shared expert and a
dense layer between its MoE layers, GPT-OSS with alternating sliding-window (8 tokens) and global
layers, attention sinks, YaRN rope over a short original context, and 4 biased experts, top 2,
whose clamped SwiGLU is driven past its limit) it builds a small model with
random weights, saves it as safetensors + config.json, and records golden outputs computed by
transformers in float32 on the CPU (eager attention):
  golden.safetensors: prompt_{i} (int32 token ids), logits_{i} ([len, vocab] float32, every
                      prompt position), greedy_{i} (int32, 32 tokens from generate(do_sample=False))
  meta.json:          versions of torch/transformers, seeds, the smallest top-1/top-2 logit margin
                      seen along the greedy paths (how robust the greedy goldens are).
Run where torch and transformers exist (the GPU machine has both):
  python3 scripts/make_tiny_models.py OUTDIR [NAME...]
(NAMEs pick architectures; all of them when none are given) and commit OUTDIR's contents to tests/model/fixtures/tiny/.
"""
import json
import os
import sys

import torch
import transformers
from safetensors.torch import save_file
from transformers import (Gemma3ForCausalLM, Gemma3TextConfig, GptOssConfig, GptOssForCausalLM,
                          LlamaConfig, LlamaForCausalLM,
                          Qwen2Config, Qwen2ForCausalLM, Qwen3Config, Qwen3ForCausalLM,
                          Qwen2MoeConfig, Qwen2MoeForCausalLM, Qwen3MoeConfig,
                          Qwen3MoeForCausalLM)

VOCAB = 256
PROMPT_LENGTHS = [1, 7, 29, 45]
NEW_TOKENS = 32


def configs():
    return {
        "llama": (LlamaForCausalLM, LlamaConfig(
            vocab_size=VOCAB, hidden_size=64, intermediate_size=160, num_hidden_layers=3,
            num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=1024,
            rms_norm_eps=1e-5, tie_word_embeddings=True, initializer_range=0.08,
            rope_parameters={"rope_type": "llama3", "rope_theta": 500000.0, "factor": 8.0,
                             "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                             "original_max_position_embeddings": 32},
            bos_token_id=1, eos_token_id=2)),
        "qwen2": (Qwen2ForCausalLM, Qwen2Config(
            vocab_size=VOCAB, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
            num_attention_heads=8, num_key_value_heads=2, max_position_embeddings=1024,
            rms_norm_eps=1e-6, tie_word_embeddings=False, initializer_range=0.08,
            rope_parameters={"rope_type": "default", "rope_theta": 1000000.0},
            use_sliding_window=False, bos_token_id=1, eos_token_id=2)),
        "gemma3": (Gemma3ForCausalLM, Gemma3TextConfig(
            vocab_size=VOCAB, hidden_size=64, intermediate_size=128, num_hidden_layers=6,
            num_attention_heads=4, num_key_value_heads=2, head_dim=32, sliding_window=8,
            layer_types=["sliding_attention"] * 5 + ["full_attention"],
            query_pre_attn_scalar=32, rms_norm_eps=1e-6, max_position_embeddings=1024,
            initializer_range=0.08, tie_word_embeddings=True,
            rope_parameters={"full_attention": {"rope_type": "linear", "rope_theta": 1000000.0,
                                                "factor": 8.0},
                             "sliding_attention": {"rope_type": "default",
                                                   "rope_theta": 10000.0}},
            bos_token_id=2, eos_token_id=1, pad_token_id=0)),
        "qwen3": (Qwen3ForCausalLM, Qwen3Config(
            vocab_size=VOCAB, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
            num_attention_heads=4, num_key_value_heads=2, head_dim=32,
            max_position_embeddings=1024, rms_norm_eps=1e-6, tie_word_embeddings=True,
            initializer_range=0.08, attention_bias=False,
            rope_parameters={"rope_type": "default", "rope_theta": 1000000.0},
            use_sliding_window=False, bos_token_id=1, eos_token_id=2)),
        "qwen3_moe": (Qwen3MoeForCausalLM, Qwen3MoeConfig(
            vocab_size=VOCAB, hidden_size=64, intermediate_size=96, moe_intermediate_size=32,
            num_experts=4, num_experts_per_tok=2, norm_topk_prob=True, decoder_sparse_step=1,
            mlp_only_layers=[], num_hidden_layers=2, num_attention_heads=4,
            num_key_value_heads=2, head_dim=32, max_position_embeddings=1024,
            rms_norm_eps=1e-6, tie_word_embeddings=False, initializer_range=0.08,
            attention_bias=False, rope_parameters={"rope_type": "default", "rope_theta": 1000000.0},
            use_sliding_window=False, bos_token_id=1, eos_token_id=2)),
        "qwen2_moe": (Qwen2MoeForCausalLM, Qwen2MoeConfig(
            vocab_size=VOCAB, hidden_size=64, intermediate_size=96, moe_intermediate_size=32,
            shared_expert_intermediate_size=48, num_experts=6, num_experts_per_tok=2,
            norm_topk_prob=False, decoder_sparse_step=1, mlp_only_layers=[1],
            num_hidden_layers=3, num_attention_heads=8, num_key_value_heads=2,
            max_position_embeddings=1024, rms_norm_eps=1e-6, tie_word_embeddings=False,
            initializer_range=0.08, qkv_bias=True,
            rope_parameters={"rope_type": "default", "rope_theta": 1000000.0},
            use_sliding_window=False, bos_token_id=1, eos_token_id=2)),
        "gpt_oss": (GptOssForCausalLM, GptOssConfig(
            vocab_size=VOCAB, hidden_size=64, intermediate_size=32, num_local_experts=4,
            num_experts_per_tok=2, num_hidden_layers=4, num_attention_heads=4,
            num_key_value_heads=2, head_dim=16, sliding_window=8,
            layer_types=["sliding_attention", "full_attention"] * 2,
            max_position_embeddings=128, rms_norm_eps=1e-5, tie_word_embeddings=False,
            initializer_range=0.08, attention_bias=True,
            rope_parameters={"rope_type": "yarn", "rope_theta": 150000.0, "factor": 8.0,
                             "beta_fast": 32.0, "beta_slow": 1.0, "truncate": False,
                             "original_max_position_embeddings": 16},
            bos_token_id=1, eos_token_id=2)),
    }


# Per architecture, after the norms: weights scaled so the features under test act. GPT-OSS's
# sinks are drawn wide enough to take a real share of the softmax, and its experts' gate/up
# projection is scaled up so the SwiGLU's clamp at 7 cuts many values.
def shape_weights(name, model):
    if name != "gpt_oss":
        return
    for pname, p in model.named_parameters():
        if pname.endswith("self_attn.sinks"):
            p.copy_(torch.randn_like(p) * 1.5)
        elif pname.endswith("experts.gate_up_proj"):
            p.mul_(10.0)


def main():
    out_root, names = sys.argv[1], sys.argv[2:]
    torch.manual_seed(0)
    for name, (cls, config) in configs().items():
        if names and name not in names:
            continue
        config._attn_implementation = "eager"
        torch.manual_seed(1234)
        model = cls(config).eval().to(torch.float32)
        with torch.no_grad():  # norms start at 1 (or 0 for Gemma's 1+w): randomise them too
            for pname, p in model.named_parameters():
                if "norm" in pname:
                    p.add_(torch.randn_like(p) * 0.1)
            shape_weights(name, model)
        out = os.path.join(out_root, name)
        os.makedirs(out, exist_ok=True)
        model.save_pretrained(out, safe_serialization=True)
        gen = torch.Generator().manual_seed(99)
        golden, min_margin = {}, float("inf")
        for i, length in enumerate(PROMPT_LENGTHS):
            prompt = torch.randint(3, VOCAB, (1, length), generator=gen)
            with torch.no_grad():
                logits = model(prompt).logits[0].float()
                seq = model.generate(prompt, attention_mask=torch.ones_like(prompt),
                                     do_sample=False, max_new_tokens=NEW_TOKENS,
                                     min_new_tokens=NEW_TOKENS, output_scores=True,
                                     return_dict_in_generate=True, pad_token_id=0)
            for score in seq.scores:
                top2 = torch.topk(score[0].float(), 2).values
                min_margin = min(min_margin, float(top2[0] - top2[1]))
            golden[f"prompt_{i}"] = prompt[0].to(torch.int32).contiguous()
            golden[f"logits_{i}"] = logits.contiguous()
            golden[f"greedy_{i}"] = seq.sequences[0, length:].to(torch.int32).contiguous()
        save_file(golden, os.path.join(out, "golden.safetensors"))
        meta = {"architecture": type(model).__name__, "torch": torch.__version__,
                "transformers": transformers.__version__, "prompt_lengths": PROMPT_LENGTHS,
                "new_tokens": NEW_TOKENS, "min_greedy_margin": min_margin,
                "dtype": "float32", "attention": "eager", "seed": 1234}
        with open(os.path.join(out, "meta.json"), "w") as f:
            json.dump(meta, f, indent=2)
        print(name, json.dumps(meta), sorted(os.listdir(out)))


if __name__ == "__main__":
    main()
