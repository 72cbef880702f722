#!/usr/bin/env bash
# Tensor parallelism on a 2-GPU machine (docs/perf/tensor-parallel.md): the split-model GPU tests,
# model_cuda_bench --tensor-parallel 2 (the 8B shape whole on one GPU, then split over two with
# NCCL and with peer all-reduces: decode steps as CUDA graphs at batch 1/4/64 x context
# 512/4096, prefill of 2048 tokens), the same for the 70B shape split only (--70b), and
# `kvpool bench` offline throughput at batch 64: whole, split (default all-reduces), split with
# NCCL only, alternating. Run from the package of scripts/gpu/package-engine.sh:
#   bash gpu/tp-bench.sh OUTDIR [tests] [8b] [70b] [offline]   (no sections: all of them)
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
[ -z "$sections" ] && sections="tests 8b 70b offline"
want() { [[ " $sections " == *" $1 "* ]]; }
if want tests; then
  echo "== model gpu tests (the tensor parallel ones among them)"
  timeout 240 ./kvp_model_gpu_tests > "$out/tp-tests.log" 2>&1 || status=1
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
exit $status
