#!/usr/bin/env bash
# Tensor parallelism on a 2-GPU machine (docs/perf/tensor-parallel.md): the split-model GPU tests,
# model_cuda_bench --tensor-parallel 2 (the 8B shape whole on one GPU, then split over two with
# NCCL and with peer all-reduces: decode steps as CUDA graphs at batch 1/4/64 x context
# 512/4096, prefill of 2048 tokens), the same for the 70B shape split only (--70b), the
# mixture-of-experts shapes whole and split (moe: --moe), and `kvpool bench` offline throughput
# at batch 64: whole, split (default all-reduces), split with NCCL only, alternating; and the
# same offline run on the Qwen3-30B-A3B shape, whole and split (moe-offline).
# Run from the package of scripts/gpu/package-engine.sh:
#   bash gpu/tp-bench.sh OUTDIR [tests] [8b] [70b] [moe] [offline] [moe-offline]
#   (no sections: all of them)
# TEST_FILTER narrows the tests (a gtest filter).
set -u -o pipefail
out=${1:?usage: tp-bench.sh OUTDIR}
here=$(cd "$(dirname "$0")/.." && pwd)
cd "$here"
source gpu/cuda-env.sh
status=0
{ date -u; nvidia-smi --query-gpu=name,memory.total,clocks.max.sm --format=csv;
  nvidia-smi topo -m; echo "KVP_NCCL_LIBRARY=${KVP_NCCL_LIBRARY:-}"; echo "LD_LIBRARY_PATH=$LD_LIBRARY_PATH"; } \
  > "$out/tp-env.txt" 2>&1
sections=${*:2}
[ -z "$sections" ] && sections="tests 8b 70b moe offline moe-offline"
want() { [[ " $sections " == *" $1 "* ]]; }
if want tests; then
  echo "== model gpu tests (the tensor parallel ones among them)"
  timeout 300 ./kvp_model_gpu_tests --gtest_filter="${TEST_FILTER:-*}" > "$out/tp-tests.log" 2>&1 \
    || status=1
  grep -E "^\[ tp \]|OK|FAILED|SKIPPED|PASSED" "$out/tp-tests.log" | tail -14
fi
if want 8b; then
  echo "== model_cuda_bench --tensor-parallel 2"
  timeout 240 ./model_cuda_bench "$out/tp-steps.csv" --tensor-parallel 2 2>&1 \
    | tee "$out/tp-steps.log" || status=1
fi
if want 70b; then
  echo "== model_cuda_bench --tensor-parallel 2 --70b"
  timeout 240 ./model_cuda_bench "$out/tp-steps-70b.csv" --tensor-parallel 2 --70b 2>&1 \
    | tee "$out/tp-steps-70b.log" || status=1
fi
if want moe; then
  echo "== model_cuda_bench --tensor-parallel 2 --moe"
  timeout 300 ./model_cuda_bench "$out/tp-steps-moe.csv" \
    --tensor-parallel 2 --moe 2>&1 | tee "$out/tp-steps-moe.log" || status=1
fi
if want offline; then
  b8="./kvpool bench --random-model llama3-8b --device cuda --block-size 16 --blocks 16384"
  for run in 1 2; do
    for mode in tp1 tp2 tp2-nccl; do
      echo "== 8B offline, 64 requests, $mode (run $run)"
      tp=${mode:2:1}
      ar=$([ "$mode" = tp2-nccl ] && echo nccl || echo default)
      KVP_TP_ALL_REDUCE=$ar timeout 200 $b8 --tensor-parallel "$tp" --workload offline \
        --requests 64 --prompt-tokens-min 256 --prompt-tokens-max 1024 --output-tokens-min 128 \
        --output-tokens-max 128 --max-seqs 64 --step-tokens 4096 2>&1 \
        | tee "$out/8b-offline-$mode-run$run.log" | tail -4 || status=1
    done
  done
fi
if want moe-offline; then
  bm="./kvpool bench --random-model qwen3-30b-a3b --device cuda --block-size 16 --blocks 6144"
  for run in 1 2; do
    for tp in 1 2; do
      echo "== Qwen3-30B-A3B offline, 64 requests, tp$tp (run $run)"
      timeout 200 $bm --tensor-parallel "$tp" --workload offline --requests 64 \
        --prompt-tokens-min 256 --prompt-tokens-max 1024 --output-tokens-min 128 \
        --output-tokens-max 128 --max-seqs 64 --step-tokens 4096 2>&1 \
        | tee "$out/moe-offline-tp$tp-run$run.log" | tail -4 || status=1
    done
  done
fi
exit $status
