#!/usr/bin/env bash
# A/B of the 3-row attention pass (2026-12-07, fifth session): main's model_cpu_bench before the
# change (BASE) and after it (NEW), alternated, SmolLM2-135M Q4_1, 2 threads, bf16 KV, batch 1 and 8.
#   bash rounds.sh OUTDIR ROUNDS BASE_BIN NEW_BIN
set -u
out=$1; rounds=$2; base=$3; new=$4
mkdir -p "$out"
for r in $(seq 1 "$rounds"); do
  for v in base new; do
    bin=$base; [ $v = new ] && bin=$new
    { uptime; "$bin" --model models/SmolLM2-135M-Instruct.Q4_1.gguf --threads 2 --prompt 512 \
        --decode 32 --batch 1,8 --kv-dtype bf16; } > "$out/$v.$r.txt" 2>&1
  done
done
