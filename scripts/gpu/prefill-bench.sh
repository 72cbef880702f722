#!/usr/bin/env bash
# The Hopper prefill kernel (issue 18) in one GPU call, from the package of scripts/gpu/package.sh
# (or any folder holding kvp_backend_gpu_tests and attention_cuda_bench), run from its root:
#   tests      the CUDA attention tests (every prefill case on both kernels where the Hopper one
#              runs), then compute-sanitizer memcheck, racecheck and synccheck over the prefill
#              tests
#   bench      attention_cuda_bench's prefill grid on both kernels and torch SDPA beside them in the
#              same call (scripts/gpu/sdpa_peer.py: SDPA and the matmul and copy ceilings)
#   model      model_cuda_bench --prefill-kernels: the 8B shape's prefill of 2048 and 8192 tokens
#              with each kernel (needs model_cuda_bench in the package)
#
#   bash gpu/prefill-bench.sh OUTDIR [tests] [bench] [model]     (default: tests bench)
# SAN_FILTER (a gtest filter) and SAN_TOOLS (compute-sanitizer tools) narrow the sanitizer runs.
set -u -o pipefail
out=${1:?usage: prefill-bench.sh OUTDIR [tests] [bench]}
shift
sections=${*:-tests bench}
export LD_LIBRARY_PATH="$PWD/lib:${LD_LIBRARY_PATH:-}"
mkdir -p "$out"
status=0
log="$out/prefill.log"
{
  date -u
  nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,power.draw --format=csv
} > "$log" 2>&1
for section in $sections; do
  case "$section" in
    tests)
      echo "== attention gpu tests" >> "$log"
      timeout 420 ./kvp_backend_gpu_tests --gtest_filter='*PagedAttention*' --gtest_brief=1 \
        > "$out/tests.log" 2>&1 || status=1
      tail -4 "$out/tests.log" >> "$log"
      grep -E "hopper prefill call 1" "$out/tests.log" | head -40 >> "$log"
      filter=${SAN_FILTER:-'PagedAttention.PrefillTiles*:PagedAttention.Sinks*:PagedAttention.Mixed*:*block16_d*_gqa4_q64'}
      for tool in ${SAN_TOOLS:-memcheck racecheck synccheck}; do
        echo "---- $tool ($filter)" >> "$log"
        timeout 150 compute-sanitizer --tool "$tool" --error-exitcode 9 ./kvp_backend_gpu_tests \
          --gtest_filter="$filter" --gtest_brief=1 > "$out/san-$tool.log" 2>&1 ||
          { echo "$tool FAILED (rc $?)"; status=1; } >> "$log"
        grep -E "ERROR SUMMARY|RACECHECK SUMMARY|PASSED|FAILED" "$out/san-$tool.log" | tail -4 >> "$log"
      done
      ;;
    bench)
      echo "== prefill: kvpool (hopper, portable)" >> "$log"
      timeout 200 ./attention_cuda_bench "$out/prefill.csv" --kinds prefill,prefill_portable \
        >> "$log" 2>&1 || status=1
      echo "== prefill: torch SDPA and the ceilings" >> "$log"
      timeout 200 python3 gpu/sdpa_peer.py "$out/sdpa.csv" --kinds prefill >> "$log" 2>&1 ||
        status=1
      ;;
    model)
      echo "== 8B prefill, each attention kernel" >> "$log"
      # shellcheck disable=SC1091
      source gpu/cuda-env.sh 2>/dev/null
      timeout 300 ./model_cuda_bench "$out/model-prefill.csv" --prefill-kernels >> "$log" 2>&1 ||
        status=1
      ;;
    *) echo "unknown section $section" >> "$log"; status=2 ;;
  esac
done
# the logs travel as one file
tar -C "$out" -czf "$out/logs.tar.gz" tests.log $(cd "$out" && ls san-*.log 2>/dev/null) 2>/dev/null &&
  rm -f "$out"/tests.log "$out"/san-*.log
cat "$log"
exit $status
