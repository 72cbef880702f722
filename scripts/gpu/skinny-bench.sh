#!/usr/bin/env bash
# The few-rows matrix product (src/model/cuda/skinny_gemm.h) on the GPU machine
# (docs/perf/model-cuda.md): its tests and the model tests that go through it, compute-sanitizer
# over them, model_cuda_bench --gemm (each product of the 8B decode step at 1/2/4/8 rows, cuBLAS
# against every variant), then the whole decode steps with cuBLAS only (KVP_SKINNY_GEMM=0), the
# skinny product launched plainly (=plain) and as a dependent launch (the default), alternating, and `kvpool bench` offline (64 requests) both ways. Run
# from the package of scripts/gpu/package-engine.sh:
#   bash gpu/skinny-bench.sh OUTDIR [tests] [gemm] [steps] [offline]   (no sections: all)
set -u -o pipefail
out=${1:?usage: skinny-bench.sh OUTDIR}
here=$(cd "$(dirname "$0")/.." && pwd)
cd "$here"
source gpu/cuda-env.sh
status=0
{ date -u; nvidia-smi --query-gpu=name,memory.total,clocks.max.sm --format=csv; } \
  > "$out/skinny-env.txt" 2>&1
sections=${*:2}
[ -z "$sections" ] && sections="tests gemm steps offline"
want() { [[ " $sections " == *" $1 "* ]]; }
if want tests; then
  echo "== model gpu tests"
  timeout 300 ./kvp_model_gpu_tests > "$out/skinny-tests.log" 2>&1 || status=1
  if [ -x ./kvp_backend_gpu_tests ]; then
    echo "== backend gpu tests"
    timeout 300 ./kvp_backend_gpu_tests > "$out/skinny-backend-tests.log" 2>&1 || status=1
    tail -3 "$out/skinny-backend-tests.log"
  fi
  grep -E "^\[ (skinny|prefill|teacher|greedy|graphs) |OK|FAILED|SKIPPED|PASSED" \
    "$out/skinny-tests.log" | grep -v "^\[       OK" | tail -30
  # sanitize NAME BINARY FILTER: memcheck, racecheck and synccheck over FILTER's tests
  sanitize() {
    echo "== compute-sanitizer over $1 ($3)"
    for tool in memcheck racecheck synccheck; do
      timeout 300 compute-sanitizer --tool $tool --error-exitcode 9 "$2" --gtest_filter="$3" \
        --gtest_brief=1 > "$out/skinny-$1-$tool.log" 2>&1 || { echo "$1 $tool FAILED"; status=1; }
      grep -E "ERROR SUMMARY|FAILED|PASSED" "$out/skinny-$1-$tool.log" | tail -3
    done
  }
  sanitize model ./kvp_model_gpu_tests \
    'CudaSkinnyGemm.*:*CudaTinyModel.PrefillLogits*/0:CudaForwardBackendGraphs.*'
  # the decode attention, its merge and the KV writes (dependent launches too)
  [ -x ./kvp_backend_gpu_tests ] && sanitize backend ./kvp_backend_gpu_tests \
    '*block16_d*_gqa4_q*:*block1_d64_gqa8_q*:PagedAttention.Mixed*:PagedAttention.Window*:CudaKvPool.*:*Int8*'
fi
if want gemm; then
  echo "== model_cuda_bench --gemm"
  timeout 300 ./model_cuda_bench "$out/gemm.csv" --gemm 2>&1 | tee "$out/skinny-gemm.log" \
    || status=1
fi
if want steps; then
  # a model_cuda_bench_prev beside the package's binary (an earlier build, copied in by hand) is
  # run as a fourth mode, "prev"
  modes="0 plain 1"
  [ -x ./model_cuda_bench_prev ] && modes="prev $modes"
  for run in 1 2; do
    for skinny in $modes; do
      echo "== model_cuda_bench, KVP_SKINNY_GEMM=$skinny (run $run)"
      bin=./model_cuda_bench
      [ "$skinny" = prev ] && bin=./model_cuda_bench_prev
      KVP_SKINNY_GEMM=$([ "$skinny" = prev ] && echo 1 || echo "$skinny") timeout 300 $bin \
        "$out/steps-$skinny-$run.csv" > "$out/steps-$skinny-$run.log" 2>&1 || status=1
      grep -E "graph|prefill|ceilings" "$out/steps-$skinny-$run.log"
    done
  done
fi
if want offline; then
  b8="./kvpool bench --random-model llama3-8b --device cuda --block-size 16 --blocks 16384"
  for run in 1 2; do
    for skinny in 0 1; do
      echo "== 8B offline, 64 requests, KVP_SKINNY_GEMM=$skinny (run $run)"
      KVP_SKINNY_GEMM=$skinny timeout 200 $b8 --workload offline --requests 64 \
        --prompt-tokens-min 256 --prompt-tokens-max 1024 --output-tokens-min 128 \
        --output-tokens-max 128 --max-seqs 64 --step-tokens 4096 2>&1 \
        | tee "$out/offline-$skinny-run$run.log" | tail -3 || status=1
      echo "== 8B one sequence, KVP_SKINNY_GEMM=$skinny (run $run)"
      KVP_SKINNY_GEMM=$skinny timeout 200 $b8 --workload offline --requests 4 \
        --prompt-tokens-min 512 --prompt-tokens-max 512 --output-tokens-min 256 \
        --output-tokens-max 256 --max-seqs 1 2>&1 \
        | tee "$out/single-$skinny-run$run.log" | tail -3 || status=1
    done
  done
fi
cd "$out" && tar -czf skinny-logs.tar.gz ./*.log ./*.csv ./*.txt 2>/dev/null && \
  find . -maxdepth 1 -type f ! -name skinny-logs.tar.gz ! -name skinny-gemm.log -delete
exit $status
