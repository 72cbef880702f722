#!/usr/bin/env bash
# 8-bit KV on the GPU (issue 17, docs/kv-int8.md), in sections:
#   tests      the backend GPU tests (all of them: the 8-bit ones and the 16-bit kernels beside
#              them), the model GPU tests where the package has them, and compute-sanitizer
#              memcheck and racecheck over the 8-bit decode tests
#   attention  the attention grid bf16 vs int8 vs fp8 (attention_cuda_bench, decode and prefill)
#   engine     end to end on the 8B shape at the same pool bytes: the agents pressure workload
#              (sessions resident) and long-context decode (TPOT at batch 16 x 8K); needs kvpool
# TEST_FILTER and SAN_FILTER (gtest filters) narrow the backend tests and the sanitizer runs,
# KINDS the attention grid's kinds.
# Run from the unpacked package(s) of scripts/gpu/package.sh (and package-engine.sh for engine):
#   bash gpu/kv8-bench.sh OUTDIR [tests] [attention] [engine]     (default: all three)
set -u -o pipefail
out=${1:?usage: kv8-bench.sh OUTDIR [tests] [attention] [engine]}
shift
sections=${*:-tests attention engine}
here=$(cd "$(dirname "$0")/.." && pwd)
cd "$here"
# shellcheck disable=SC1091
source gpu/cuda-env.sh 2>/dev/null
export LD_LIBRARY_PATH="$PWD/lib:${LD_LIBRARY_PATH:-}"
mkdir -p "$out"
status=0
{ date -u; nvidia-smi --query-gpu=name,memory.total,clocks.max.sm --format=csv; } > "$out/kv8-env.txt" 2>&1
for section in $sections; do
  case "$section" in
    tests)
      echo "== backend GPU tests"
      timeout 300 ./kvp_backend_gpu_tests --gtest_filter="${TEST_FILTER:-*}" --gtest_brief=1 \
        > "$out/kv8-backend-tests.log" 2>&1 || status=1
      tail -3 "$out/kv8-backend-tests.log"
      grep -E "FAILED|Failure|relative error" "$out/kv8-backend-tests.log" | head -20
      if [ -x ./kvp_model_gpu_tests ]; then
        timeout 200 ./kvp_model_gpu_tests > "$out/kv8-model-tests.log" 2>&1 || status=1
        tail -2 "$out/kv8-model-tests.log"
      fi
      filter=${SAN_FILTER:-'*Kv8*TensorCoreDecodeShapes*:*Kv8*Mixed*:*Kv8*Window*:*Kv8Matrix*d128_gqa4_q1'}
      for tool in memcheck racecheck; do
        echo "---- $tool ($filter)"
        timeout 200 compute-sanitizer --tool "$tool" --error-exitcode 9 ./kvp_backend_gpu_tests \
          --gtest_filter="$filter" --gtest_brief=1 > "$out/kv8-san-$tool.log" 2>&1 ||
          { echo "$tool FAILED (rc $?)"; status=1; }
        grep -E "ERROR SUMMARY|RACECHECK SUMMARY|PASSED|FAILED" "$out/kv8-san-$tool.log" | tail -4
      done
      ;;
    attention)
      echo "== attention grid, bf16 vs int8 vs fp8"
      timeout 240 ./attention_cuda_bench "$out/kv8-attention.csv" --kv bf16,int8,fp8 \
        --kinds "${KINDS:-decode,prefill}" > "$out/kv8-attention.log" 2>&1 || status=1
      grep -E "decode|prefill|copy" "$out/kv8-attention.log" | tail -60
      ;;
    engine)
      b8="./kvpool bench --random-model llama3-8b --device cuda --block-size 16"
      for kv in bf16 int8 fp8; do
        echo "== 8B agents under pressure at 4 GiB of KV, $kv"
        timeout 120 $b8 --kv-dtype $kv --kv-memory 4GiB --workload agents --agents 32 --turns 4 \
          --system-prompt-tokens 1024 --turn-tokens 256 --reply-tokens 64 --max-seqs 8 \
          --step-tokens 4096 2>&1 | tee "$out/kv8-agents-$kv.log" |
          grep -E "engine:|bench agents|tpot|evictions" || status=1
      done
      for kv in bf16 int8 fp8; do
        echo "== 8B long-context decode (16 x 8K prompts, 128 outputs), $kv"
        timeout 120 $b8 --kv-dtype $kv --blocks 8704 --workload offline --requests 16 \
          --prompt-tokens-min 8192 --prompt-tokens-max 8192 --output-tokens-min 128 \
          --output-tokens-max 128 --max-seqs 16 --step-tokens 8192 --warmup off 2>&1 |
          tee "$out/kv8-long-$kv.log" | grep -E "bench offline|tpot|itl" || status=1
      done
      ;;
    *) echo "unknown section $section"; status=2 ;;
  esac
done
( cd "$out" && tar -czf kv8-logs.tgz --remove-files ./*.log ) 2>/dev/null
exit $status
