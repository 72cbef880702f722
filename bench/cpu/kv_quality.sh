#!/usr/bin/env bash
# Issue 17's quality check of 8-bit KV (docs/kv-int8.md, "Quality"): perplexity and mean KL
# divergence of next-token distributions, each tool's 8-bit KV against its own 16-bit (and f32)
# baseline, on the same model file and text, windows of 512 tokens with the second half scored.
#
#   kvpool:    kvpool perplexity --kv-dtype f32 (baseline, --logits-out), f16, bf16, int8 and
#              fp8 (--kl-base of the f32 run; KL over the base's top-1024 tokens + a rest
#              bucket), and int8 and fp8 against the f16 run
#   llama.cpp: llama-perplexity -fa on with f16 KV (--kl-divergence-base) and with
#              -ctk q8_0 -ctv q8_0 (--kl-divergence against the f16 run; full vocabulary)
#
# Run from the repository root after building kvpool (cmake --build --preset release --target
# kvpool):
#   bench/cpu/kv_quality.sh [--threads 2] [--text FILE] [--model FILE] [--llama-dir DIR]
# The text defaults to /usr/share/common-licenses/GPL-3 followed by GPL-2 (Debian base-files:
# English prose, 53,241 bytes, ~10K tokens: 20 windows of 512, 5,100 scored tokens; GPL-3 alone
# gives 14 windows, 3,570 scored tokens, under issue 17's 4,000).
# Outputs (logs and logits files, ~0.5 GB for llama.cpp's full-vocabulary base) go to
# ${OUT:-/tmp/kv_quality}.
set -euo pipefail

threads=2
text=
model=models/SmolLM2-135M-Instruct.Q4_1.gguf
llama_dir=/work/peers/llama_cpp_python-0.3.36/vendor/llama.cpp
ctx=512
while [ $# -gt 0 ]; do
  case "$1" in
    --threads) threads=$2; shift 2 ;;
    --text) text=$2; shift 2 ;;
    --model) model=$2; shift 2 ;;
    --llama-dir) llama_dir=$2; shift 2 ;;
    *) echo "kv_quality.sh: unknown option $1" >&2; exit 2 ;;
  esac
done
out=${OUT:-/tmp/kv_quality}
mkdir -p "$out"
if [ -z "$text" ]; then
  text=$out/gpl3_gpl2.txt
  cat /usr/share/common-licenses/GPL-3 /usr/share/common-licenses/GPL-2 > "$text"
fi
kvpool=build/release/apps/kvpool
[ -x "$kvpool" ] || kvpool=build/release/kvpool

echo "== kvpool ($model, $text, ctx $ctx, $threads threads)"
"$kvpool" perplexity --model "$model" --text-file "$text" --ctx $ctx --threads "$threads" \
  --kv-dtype f32 --logits-out "$out/kvpool_f32.logp" | tee "$out/kvpool_f32.txt"
"$kvpool" perplexity --model "$model" --text-file "$text" --ctx $ctx --threads "$threads" \
  --kv-dtype f16 --kl-base "$out/kvpool_f32.logp" --logits-out "$out/kvpool_f16.logp" |
  tee "$out/kvpool_f16.txt"
for dtype in bf16 int8 fp8; do
  "$kvpool" perplexity --model "$model" --text-file "$text" --ctx $ctx --threads "$threads" \
    --kv-dtype $dtype --kl-base "$out/kvpool_f32.logp" | tee "$out/kvpool_$dtype.txt"
done
# 8-bit against 16-bit KV (f16, as llama.cpp's baseline)
for dtype in int8 fp8; do
  "$kvpool" perplexity --model "$model" --text-file "$text" --ctx $ctx --threads "$threads" \
    --kv-dtype $dtype --kl-base "$out/kvpool_f16.logp" | tee "$out/kvpool_${dtype}_vs_f16.txt"
done

ppl="$llama_dir/build/bin/llama-perplexity"
if [ ! -x "$ppl" ]; then
  echo "no $ppl: skipping llama.cpp (build its llama-perplexity target)" >&2
  exit 0
fi
echo "== llama.cpp"
"$ppl" -m "$model" -f "$text" -c $ctx -t "$threads" -fa on \
  --kl-divergence-base "$out/llama_f16.kld" > "$out/llama_f16.txt" 2>&1
grep -E "^\[|Final estimate" "$out/llama_f16.txt" | tail -2
"$ppl" -m "$model" -f "$text" -c $ctx -t "$threads" -fa on -ctk q8_0 -ctv q8_0 \
  --kl-divergence-base "$out/llama_f16.kld" --kl-divergence > "$out/llama_q8_0.txt" 2>&1
grep -E "Mean PPL\(Q\)|Mean PPL\(base\)|Mean    KLD|Same top p|ln\(PPL\(Q\)/PPL\(base\)\)" \
  "$out/llama_q8_0.txt"
