#!/usr/bin/env bash
# 8-bit KV on the GPU (issue 17, docs/kv-int8.md): the 8-bit backend and model GPU tests, the
# attention grid bf16 vs int8 vs fp8 (attention_cuda_bench), and end to end on the 8B shape at the same
# pool bytes: the agents pressure workload (sessions resident, prefill saved) and long-context
# decode (TPOT at batch 16 x 8K). Run from the unpacked packages of scripts/gpu/package.sh and
# scripts/gpu/package-engine.sh (one folder):  bash gpu/kv8-bench.sh OUTDIR
set -u -o pipefail
out=${1:?usage: kv8-bench.sh OUTDIR}
here=$(cd "$(dirname "$0")/.." && pwd)
cd "$here"
source gpu/cuda-env.sh
status=0
{ date -u; nvidia-smi --query-gpu=name,memory.total,clocks.max.sm --format=csv; } > "$out/kv8-env.txt" 2>&1
echo "== 8-bit (int8, fp8) backend tests, model GPU tests"
timeout 120 ./kvp_backend_gpu_tests --gtest_filter='*Kv8*' > "$out/kv8-backend-tests.log" 2>&1 || status=1
tail -2 "$out/kv8-backend-tests.log"
timeout 200 ./kvp_model_gpu_tests > "$out/kv8-model-tests.log" 2>&1 || status=1
tail -2 "$out/kv8-model-tests.log"
echo "== attention grid, bf16 vs int8 vs fp8"
timeout 200 ./attention_cuda_bench "$out/kv8-attention.csv" --kv bf16,int8,fp8 --kinds decode,prefill \
  > "$out/kv8-attention.log" 2>&1 || status=1
grep -E "decode|prefill" "$out/kv8-attention.log" | tail -40
b8="./kvpool bench --random-model llama3-8b --device cuda --block-size 16"
for kv in bf16 int8 fp8; do
  echo "== 8B agents under pressure at 4 GiB of KV, $kv"
  timeout 120 $b8 --kv-dtype $kv --kv-memory 4GiB --workload agents --agents 32 --turns 4 \
    --system-prompt-tokens 1024 --turn-tokens 256 --reply-tokens 64 --max-seqs 8 \
    --step-tokens 4096 2>&1 | tee "$out/kv8-agents-$kv.log" | grep -E "engine:|bench agents|tpot|evictions" || status=1
done
for kv in bf16 int8 fp8; do
  echo "== 8B long-context decode (16 x 8K prompts, 128 outputs), $kv"
  timeout 120 $b8 --kv-dtype $kv --blocks 8704 --workload offline --requests 16 \
    --prompt-tokens-min 8192 --prompt-tokens-max 8192 --output-tokens-min 128 \
    --output-tokens-max 128 --max-seqs 16 --step-tokens 8192 --warmup off 2>&1 \
    | tee "$out/kv8-long-$kv.log" | grep -E "bench offline|tpot|itl" || status=1
done
( cd "$out" && tar -czf kv8-logs.tgz --remove-files ./*.log ) 2>/dev/null
exit $status
