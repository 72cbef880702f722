#!/usr/bin/env bash
# Runs the CUDA backend's checks on a machine with an NVIDIA GPU, from a build copied there
# (docs/cuda.md): the gpu tests, compute-sanitizer memcheck and racecheck over a reduced set of
# them, then the GPU benchmark and its torch peer, then the model runner's checks
# (scripts/gpu/model-check.sh: model gpu tests, memcheck, model benchmark), writing logs and CSV
# into OUTDIR. Run it from the repository root (the model tests read tests/model/fixtures/).
#
#   scripts/gpu-check.sh OUTDIR [--tests-only]
#
# Binaries are taken from $KVP_GPU_BIN (default build/cuda: tests/kvp_backend_gpu_tests and
# bench/attention_cuda_bench, or a flat folder holding both); $KVP_GPU_LIB, if set, is put in
# front of LD_LIBRARY_PATH (bundled non-system libraries). Exit status: non-zero if a test or a
# sanitizer run failed.
set -u -o pipefail
out=${1:?usage: gpu-check.sh OUTDIR [--tests-only]}
mode=${2:-all}
here=$(cd "$(dirname "$0")" && pwd)
bin=${KVP_GPU_BIN:-build/cuda}
find_bin() {
  for p in "$bin/$1" "$bin/tests/$1" "$bin/bench/$1"; do
    [ -x "$p" ] && { echo "$p"; return; }
  done
  echo "gpu-check: $1 not found under $bin" >&2
  exit 2
}
tests=$(find_bin kvp_backend_gpu_tests)
bench=$(find_bin attention_cuda_bench)
model_tests=$(find_bin kvp_model_gpu_tests)
model_bench=$(find_bin model_cuda_bench)
[ -n "${KVP_GPU_LIB:-}" ] && export LD_LIBRARY_PATH="$KVP_GPU_LIB:${LD_LIBRARY_PATH:-}"
mkdir -p "$out"
status=0

{
  date -u
  nvidia-smi
  nvcc --version 2>&1 | tail -2
  python3 -c 'import torch; print("torch", torch.__version__)' 2>&1
  ldd "$tests"
} > "$out/env.txt" 2>&1
head -20 "$out/env.txt"

echo "== gpu tests"
timeout 300 "$tests" --gtest_brief=1 > "$out/tests.log" 2>&1 || status=1
tail -5 "$out/tests.log"

# Reduced case set under the sanitizers (the full matrix is ~10x slower there): one block size
# per kernel path, every head dim at GQA 4, windows, mixed batch, KV pool operations.
filter='*block16_d*_gqa4_q*:*block1_d64_gqa8_q*:*block256_d128_gqa1_q64:PagedAttention.Mixed*:PagedAttention.Window*:PagedAttention.SoftCap*:PagedAttention.Unusual*:CudaKvPool.*:PagedAttentionArgs.*'
echo "== compute-sanitizer memcheck + racecheck (filter $filter)"
{
  for tool in memcheck racecheck; do
    echo "---- $tool"
    timeout 240 compute-sanitizer --tool "$tool" --error-exitcode 9 "$tests" \
      --gtest_filter="$filter" --gtest_brief=1 2>&1 || { echo "$tool FAILED"; status=1; }
  done
} > "$out/sanitizer.log" 2>&1
grep -E "ERROR SUMMARY|RACECHECK SUMMARY|FAILED|PASSED" "$out/sanitizer.log" | tail -8

if [ "$mode" != "--tests-only" ]; then
  echo "== benchmark"
  timeout 300 "$bench" "$out/bench.csv" > "$out/bench.log" 2>&1 || { echo "bench failed"; status=1; }
  cat "$out/bench.log"
  echo "== torch SDPA peer"
  PYTHONUNBUFFERED=1 timeout 240 python3 "$here/gpu/sdpa_peer.py" "$out/sdpa.csv" \
    > "$out/sdpa.log" 2>&1 || { echo "peer failed"; status=1; }
  cat "$out/sdpa.log"
  python3 "$here/gpu/compare.py" "$out/bench.csv" "$out/sdpa.csv" > "$out/summary.md" 2>&1
  cat "$out/summary.md"
fi

model_check=$here/gpu/model-check.sh
[ -f "$model_check" ] || model_check=$here/model-check.sh
bash "$model_check" "$out" "$model_tests" "$model_bench" "$mode" || status=1
exit $status
