#!/usr/bin/env bash
# Tensor parallelism on a 2-GPU machine (docs/perf/tensor-parallel.md): the split-model GPU tests,
# model_cuda_bench --tensor-parallel 2 (the 8B shape whole on one GPU, then split over two:
# decode steps as CUDA graphs at batch 1/4/64 x context 512/4096, prefill of 2048 tokens) and
# `kvpool bench` offline throughput at batch 64, whole and split, alternating. Run from the
# package of scripts/gpu/package-engine.sh:  bash gpu/tp-bench.sh OUTDIR
set -u -o pipefail
out=${1:?usage: tp-bench.sh OUTDIR}
here=$(cd "$(dirname "$0")/.." && pwd)
cd "$here"
source gpu/cuda-env.sh
status=0
{ date -u; nvidia-smi --query-gpu=name,memory.total,clocks.max.sm --format=csv;
  nvidia-smi topo -m; echo "KVP_NCCL_LIBRARY=${KVP_NCCL_LIBRARY:-}"; echo "LD_LIBRARY_PATH=$LD_LIBRARY_PATH"; } \
  > "$out/tp-env.txt" 2>&1
echo "== model gpu tests (the tensor parallel ones among them)"
timeout 240 ./kvp_model_gpu_tests > "$out/tp-tests.log" 2>&1 \
  || status=1
grep -E "^\[ tp \]|OK|FAILED|SKIPPED|PASSED" "$out/tp-tests.log" | tail -12
echo "== model_cuda_bench --tensor-parallel 2"
timeout 240 ./model_cuda_bench "$out/tp-steps.csv" --tensor-parallel 2 2>&1 | tee "$out/tp-steps.log" \
  || status=1
b8="./kvpool bench --random-model llama3-8b --device cuda --block-size 16 --blocks 16384"
for run in 1 2; do
  for tp in 1 2; do
    echo "== 8B offline, 64 requests, tensor parallel $tp (run $run)"
    timeout 200 $b8 --tensor-parallel $tp --workload offline --requests 64 \
      --prompt-tokens-min 256 --prompt-tokens-max 1024 --output-tokens-min 128 \
      --output-tokens-max 128 --max-seqs 64 --step-tokens 4096 2>&1 \
      | tee "$out/8b-offline-tp$tp-run$run.log" | tail -4 || status=1
  done
done
exit $status
