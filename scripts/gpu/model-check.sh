#!/usr/bin/env bash
# The CUDA model runner's checks, called by scripts/gpu-check.sh (run from the repository root:
# the tests read tests/model/fixtures/tiny): the model gpu tests, compute-sanitizer memcheck over
# a few of them, and the model benchmark, into OUTDIR.
#
#   model-check.sh OUTDIR TESTS_BINARY BENCH_BINARY [--tests-only]
#
# Finds a libcublas.so.13 on this machine (the binaries link the shared cuBLAS) and puts its
# folder on LD_LIBRARY_PATH. Exit status: non-zero if a test or the sanitizer run failed.
set -u -o pipefail
out=${1:?usage: model-check.sh OUTDIR TESTS BENCH [--tests-only]}
tests=${2:?}
bench=${3:?}
mode=${4:-all}
status=0

if ! ldd "$tests" | grep -q "libcublas.so.13 => /"; then
  cublas_dir=""
  for d in /usr/local/cuda/lib64 /usr/local/cuda/targets/x86_64-linux/lib /usr/local/cuda/lib; do
    [ -e "$d/libcublas.so.13" ] && { cublas_dir=$d; break; }
  done
  if [ -z "$cublas_dir" ]; then
    site=$(python3 -c 'import nvidia, os; print(os.path.dirname(nvidia.__path__[0]))' 2>/dev/null)
    [ -n "$site" ] && cublas_dir=$(dirname "$(find "$site" -name 'libcublas.so.13' | head -1)")
  fi
  [ -n "$cublas_dir" ] && export LD_LIBRARY_PATH="$cublas_dir:${LD_LIBRARY_PATH:-}"
fi
ldd "$tests" | grep -E "cublas|not found" > "$out/model-env.txt" 2>&1

echo "== model gpu tests"
timeout 300 "$tests" > "$out/model-tests.log" 2>&1 || status=1
grep -E "^\[ (prefill|teacher|greedy|mixed|blocks|f16 kv|graphs) " "$out/model-tests.log"
tail -4 "$out/model-tests.log"

filter='*CudaTinyModel.PrefillLogits*/0:*CudaMixedBatch.*/1:CudaForwardBackendBlocks.*:CudaForwardBackendErrors.*:CudaForwardBackendGraphs.*'
echo "== compute-sanitizer memcheck, model tests (filter $filter)"
timeout 300 compute-sanitizer --tool memcheck --error-exitcode 9 "$tests" \
  --gtest_filter="$filter" --gtest_brief=1 > "$out/model-sanitizer.log" 2>&1 \
  || { echo "model memcheck FAILED"; status=1; }
grep -E "ERROR SUMMARY|FAILED|PASSED" "$out/model-sanitizer.log" | tail -4

if [ "$mode" != "--tests-only" ]; then
  echo "== model benchmark"
  timeout 400 "$bench" "$out/model-bench.csv" > "$out/model-bench.log" 2>&1 \
    || { echo "model bench failed"; status=1; }
  cat "$out/model-bench.log"
fi
exit $status
