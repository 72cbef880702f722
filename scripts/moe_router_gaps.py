#!/usr/bin/env python3
# Usage: .venv/bin/python scripts/moe_router_gaps.py qwen3_moe   (from the repository root)
# Why the CUDA MoE tests allow a few rows over the bf16 tolerance (tests/model/gpu/
# cuda_forward_backend_test.cc, kRoutingFlipTolerance): with numpy alone (no torch), an f64
# forward of the tiny qwen3_moe / qwen2_moe fixtures over each prompt and its greedy tokens,
# checked against the golden logits, prints the smallest gaps between a token's k-th and
# (k+1)-th router probabilities (the decisions bf16 rounding upstream can flip).
import json, sys, numpy as np
from safetensors.numpy import load_file
name = sys.argv[1]; d = f"tests/model/fixtures/tiny/{name}"
c = json.load(open(f"{d}/config.json")); W = {k: v.astype(np.float64) for k, v in load_file(f"{d}/model.safetensors").items()}
g = load_file(f"{d}/golden.safetensors")
H = c["hidden_size"]; nh = c["num_attention_heads"]; nkv = c["num_key_value_heads"]; hd = c.get("head_dim") or H // nh
E = c.get("num_experts") or c.get("num_local_experts"); k = c["num_experts_per_tok"]; eps = c["rms_norm_eps"]
theta = c["rope_parameters"]["rope_theta"]; only = c.get("mlp_only_layers", [])
def rms(x, w): return x / np.sqrt((x * x).mean(-1, keepdims=True) + eps) * w
def rope(x, pos):
    inv = 1.0 / theta ** (np.arange(0, hd, 2) / hd); a = pos[:, None] * inv[None]
    cos = np.cos(np.concatenate([a, a], -1))[:, None]; sin = np.sin(np.concatenate([a, a], -1))[:, None]
    x1, x2 = x[..., :hd // 2], x[..., hd // 2:]
    return x * cos + np.concatenate([-x2, x1], -1) * sin
silu = lambda v: v / (1 + np.exp(-v))
gaps = []; worst = 0
i = 0
while f"prompt_{i}" in g:
    ids = np.concatenate([g[f"prompt_{i}"], g[f"greedy_{i}"]]).astype(np.int64); T = len(ids); pos = np.arange(T, dtype=np.float64)
    x = W["model.embed_tokens.weight"][ids]
    for l in range(c["num_hidden_layers"]):
        p = f"model.layers.{l}."
        h = rms(x, W[p + "input_layernorm.weight"])
        q = h @ W[p + "self_attn.q_proj.weight"].T; kk = h @ W[p + "self_attn.k_proj.weight"].T; v = h @ W[p + "self_attn.v_proj.weight"].T
        if p + "self_attn.q_proj.bias" in W: q += W[p + "self_attn.q_proj.bias"]; kk += W[p + "self_attn.k_proj.bias"]; v += W[p + "self_attn.v_proj.bias"]
        q = q.reshape(T, nh, hd); kk = kk.reshape(T, nkv, hd); v = v.reshape(T, nkv, hd)
        if p + "self_attn.q_norm.weight" in W: q = rms(q, W[p + "self_attn.q_norm.weight"]); kk = rms(kk, W[p + "self_attn.k_norm.weight"])
        q = rope(q, pos); kk = rope(kk, pos)
        rep = nh // nkv; kk = np.repeat(kk, rep, 1); v = np.repeat(v, rep, 1)
        s = np.einsum("thd,shd->hts", q, kk) / np.sqrt(hd) + np.triu(np.full((T, T), -np.inf), 1)
        s = np.exp(s - s.max(-1, keepdims=True)); s /= s.sum(-1, keepdims=True)
        o = np.einsum("hts,shd->thd", s, v).reshape(T, nh * hd) @ W[p + "self_attn.o_proj.weight"].T
        x = x + o
        h = rms(x, W[p + "post_attention_layernorm.weight"])
        if l in only or p + "mlp.gate.weight" not in W:
            x = x + (silu(h @ W[p + "mlp.gate_proj.weight"].T) * (h @ W[p + "mlp.up_proj.weight"].T)) @ W[p + "mlp.down_proj.weight"].T
            continue
        lg = h @ W[p + "mlp.gate.weight"].T; pr = np.exp(lg - lg.max(-1, keepdims=True)); pr /= pr.sum(-1, keepdims=True)
        srt = -np.sort(-pr, -1); gaps.extend((srt[:, k - 1] - srt[:, k]).tolist())
        out = np.zeros_like(x)
        for t in range(T):
            top = np.argsort(-pr[t], kind="stable")[:k]; w = pr[t, top]
            if c.get("norm_topk_prob"): w = w / w.sum()
            for e, we in sorted(zip(top, w)):
                q_ = f"{p}mlp.experts.{e}."
                out[t] += we * ((silu(h[t] @ W[q_ + "gate_proj.weight"].T) * (h[t] @ W[q_ + "up_proj.weight"].T)) @ W[q_ + "down_proj.weight"].T)
        if p + "mlp.shared_expert.gate_proj.weight" in W:
            q_ = p + "mlp.shared_expert."
            sh = (silu(h @ W[q_ + "gate_proj.weight"].T) * (h @ W[q_ + "up_proj.weight"].T)) @ W[q_ + "down_proj.weight"].T
            out += 1 / (1 + np.exp(-(h @ W[p + "mlp.shared_expert_gate.weight"].T))) * sh
        x = x + out
    logits = rms(x, W["model.norm.weight"]) @ W["lm_head.weight"].T
    ref = g[f"logits_{i}"].reshape(-1, logits.shape[-1]); n = len(ref)
    worst = max(worst, np.linalg.norm(logits[:n] - ref) / np.linalg.norm(ref)); i += 1
gaps = np.sort(np.array(gaps))
print(f"{name}: numpy forward vs golden logits rel err {worst:.2e}; {len(gaps)} routing decisions, smallest k-th/(k+1)-th probability gaps {np.round(gaps[:5], 5).tolist()}, {int((gaps < 2e-3).sum())} below 2e-3")
