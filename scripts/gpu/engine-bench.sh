#!/usr/bin/env bash
# The engine on the GPU (docs/perf/engine.md, "H100"): `kvpool bench --device cuda` on the
# Llama-3.1-8B shape with random bf16 weights made on the device, and on the SmolLM2-135M shape,
# plus the model gpu tests of the same build. Run from a folder holding kvpool,
# kvp_model_gpu_tests, lib/ and tests/model/fixtures/tiny (scripts/gpu/package-engine.sh):
#   bash gpu/engine-bench.sh OUTDIR
# The floor of one 8B decode step comes from model_cuda_bench in the same run (--quick). Last,
# compute-sanitizer memcheck and racecheck over a few model gpu tests (the row kernels).
set -u -o pipefail
out=${1:?usage: engine-bench.sh OUTDIR}
here=$(cd "$(dirname "$0")/.." && pwd)
cd "$here"
source gpu/cuda-env.sh
status=0
{ date -u; nvidia-smi --query-gpu=name,memory.total,clocks.max.sm --format=csv; ldd ./kvpool; } \
  > "$out/engine-env.txt" 2>&1
echo "== model gpu tests"
timeout 300 ./kvp_model_gpu_tests --gtest_brief=1 > "$out/model-tests.log" 2>&1 || status=1
tail -3 "$out/model-tests.log"
echo "== model_cuda_bench --quick (floors)"
[ -x ./model_cuda_bench ] && timeout 200 ./model_cuda_bench "$out/model-quick.csv" --quick \
  > "$out/model-quick.log" 2>&1
tail -25 "$out/model-quick.log"
echo "== sampler_bench (host side of every step: one 128256-logit row per sequence)"
[ -x ./sampler_bench ] && timeout 60 ./sampler_bench --benchmark_min_time=0.2 2>&1 \
  | tee "$out/sampler-bench.log" | tail -7
b8base="./kvpool bench --random-model llama3-8b --device cuda --block-size 16"
b8="$b8base --blocks 16384"
echo "== 8B offline, 64 requests"
timeout 240 $b8 --workload offline --requests 64 --prompt-tokens-min 256 --prompt-tokens-max 1024 \
  --output-tokens-min 128 --output-tokens-max 128 --max-seqs 64 --step-tokens 4096 \
  --csv "$out/8b-offline.csv" 2>&1 | tee "$out/8b-offline.log" || status=1
echo "== 8B agents: sessions vs resend vs re-prefill"
timeout 300 $b8 --workload agents --agents 16 --turns 4 --system-prompt-tokens 1024 \
  --turn-tokens 256 --reply-tokens 64 --max-seqs 64 --step-tokens 4096 --compare-sessions \
  --csv "$out/8b-agents.csv" --plot "$out/8b-agents.png" 2>&1 | tee "$out/8b-agents.log" || status=1
echo "== 8B closed loop, 32 clients"
timeout 200 $b8 --workload closed --concurrency 32 --target-output-tokens 8192 \
  --prompt-tokens-min 256 --prompt-tokens-max 2048 --output-tokens-min 64 \
  --output-tokens-max 256 --max-seqs 64 --step-tokens 4096 --csv "$out/8b-closed.csv" \
  2>&1 | tee "$out/8b-closed.log" || status=1
# 2048 blocks = 32K tokens (4 GiB of bf16 KV) for 32 agents whose histories grow to ~2.3K
# tokens (74K in all), 8 running at a time: idle sessions must leave the pool; with a host
# tier they move there (read_blocks / write_blocks through the device) instead of being
# dropped and recomputed.
for tier in none host; do
  extra=""
  [ "$tier" = host ] && extra="--host-tier-bytes 17179869184"
  echo "== 8B agents under pool pressure, tier: $tier"
  timeout 200 $b8base --blocks 2048 --workload agents --agents 32 --turns 4 \
    --system-prompt-tokens 1024 --turn-tokens 256 --reply-tokens 64 --max-seqs 8 \
    --step-tokens 4096 $extra 2>&1 | tee "$out/8b-pressure-$tier.log" || status=1
done
echo "== SmolLM2-135M shape offline, 64 requests"
timeout 120 ./kvpool bench --random-model smollm2-135m --device cuda --blocks 16384 \
  --workload offline --requests 64 --prompt-tokens-min 256 --prompt-tokens-max 1024 \
  --output-tokens-min 128 --output-tokens-max 128 --max-seqs 64 --step-tokens 4096 \
  2>&1 | tee "$out/smollm2-offline.log" || status=1
filter='*CudaTinyModel.PrefillLogits*/0:*CudaMixedBatch.*/1:CudaForwardBackendGraphs.*'
echo "== compute-sanitizer memcheck / racecheck, model tests (filter $filter)"
# racecheck is slow (shared-memory tracking): one prefill test covers every row kernel
for run in "memcheck $filter" "racecheck *CudaTinyModel.PrefillLogits*/0"; do
  set -- $run
  timeout 200 compute-sanitizer --tool "$1" --error-exitcode 9 ./kvp_model_gpu_tests \
    --gtest_filter="$2" --gtest_brief=1 > "$out/model-$1.log" 2>&1 \
    || { echo "model $1 FAILED (rc $?)"; status=1; }
  grep -E "ERROR SUMMARY|RACECHECK SUMMARY|FAILED|PASSED" "$out/model-$1.log" | tail -3
done
exit $status
