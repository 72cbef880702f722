#!/usr/bin/env bash
# bench/cpu/kv_quality.sh's kvpool part for the 16-bit KV dtypes only: perplexity with f32 KV
# (--logits-out), then f16 and bf16 against it (--kl-base). GPL-3 + GPL-2, windows of 512, 2 threads.
set -euo pipefail
model=${1:-models/SmolLM2-135M-Instruct.Q4_1.gguf}; tag=${2:-smollm2}
out=$(dirname "$0"); q=/tmp/kvq; kvpool=${KVPOOL:-/tmp/kvpool.before}
text=$q/gpl3_gpl2.txt
# KVP_PREFILL_ACT=f32 in the environment: prompt rows multiplied with f32 activations (tag it)
"$kvpool" perplexity --model "$model" --text-file "$text" --ctx 512 --threads 2 --kv-dtype f32 \
  --logits-out "$q/$tag.f32.logp" > "$out/$tag.quality.f32.txt" 2>&1
for d in bf16 f16; do
  "$kvpool" perplexity --model "$model" --text-file "$text" --ctx 512 --threads 2 --kv-dtype $d \
    --kl-base "$q/$tag.f32.logp" > "$out/$tag.quality.$d.txt" 2>&1
done
