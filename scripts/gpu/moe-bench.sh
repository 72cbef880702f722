#!/usr/bin/env bash
# Mixture of experts on one GPU (docs/perf/model-cuda.md, "Mixture of experts"): the model GPU
# tests (the MoE kernels against a double reference, the tiny MoE models through the decode
# kernels and the prompt steps' expert GEMMs against transformers), compute-sanitizer memcheck
# and racecheck over the MoE kernel and GEMM tests, then model_cuda_bench --moe (decode steps,
# and prefill of 2048 and 512 tokens with the experts as grouped GEMMs, one GEMM per expert and
# the decode kernels, same process). Run from the package of scripts/gpu/package-engine.sh:
#   bash gpu/moe-bench.sh OUTDIR [tests] [sanitize] [bench]   (no sections: all of them)
set -u -o pipefail
out=${1:?usage: moe-bench.sh OUTDIR}
here=$(cd "$(dirname "$0")/.." && pwd)
cd "$here"
source gpu/cuda-env.sh
status=0
{ date -u; nvidia-smi --query-gpu=name,memory.total,clocks.max.sm --format=csv; } \
  > "$out/moe-env.txt" 2>&1
sections=${*:2}
[ -z "$sections" ] && sections="tests sanitize bench"
want() { [[ " $sections " == *" $1 "* ]]; }
if want tests; then
  echo "== model gpu tests"
  timeout 420 ./kvp_model_gpu_tests > "$out/moe-tests.log" 2>&1 || status=1
  grep -E "^\[ (experts|moe gemm)|OK \]|FAILED|PASSED" "$out/moe-tests.log" | tail -40
fi
if want sanitize; then
  filter='CudaMoeExperts.*:CudaMoeGemm.*qwen3*'
  for tool in memcheck racecheck; do
    echo "== compute-sanitizer $tool ($filter)"
    timeout 300 compute-sanitizer --tool "$tool" --error-exitcode 9 ./kvp_model_gpu_tests \
      --gtest_filter="$filter" > "$out/moe-sanitize-$tool.log" 2>&1 || status=1
    grep -E "ERROR SUMMARY|PASSED|FAILED" "$out/moe-sanitize-$tool.log" | tail -4
  done
fi
if want bench; then
  echo "== model_cuda_bench --moe"
  timeout 420 ./model_cuda_bench "$out/moe.csv" --moe 2>&1 | tee "$out/moe-bench.log" || status=1
fi
exit $status
