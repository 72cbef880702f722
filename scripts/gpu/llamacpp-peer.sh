#!/usr/bin/env bash
# The end-to-end GPU peer of issue 18 in one call on the GPU machine: llama.cpp's CUDA build
# (scripts/gpu/build-llamacpp-cuda.sh) and kvpool on the same Llama-3.1-8B-shaped bf16 GGUF
# (random weights, written to /dev/shm by scripts/gpu/make_llama8b_bf16.py with the carried
# `gguf` wheel), then kvpool's own 8B decode steps and prefill (model_cuda_bench, the same shape
# with random weights made on the device). Logs under OUTDIR (docs/perf/model-cuda.md).
#   bash llamacpp-peer.sh OUTDIR PKG   # PKG holds llamacpp-cuda.tar.xz, kvp-engine.tar.xz and
#                                      # gguf-*.whl
# llama.cpp: llama-bench -fa 1 -ngl 99 (prefill 512 / 2048; decode 128 tokens at depth 512 and
# 4096), llama-batched-bench (512-token prompts, 128 new tokens, 1 / 4 / 64 sequences).
# kvpool: `kvpool bench` offline on the GGUF (64 requests of 512 + 128 tokens, and 1 request),
# model_cuda_bench (graph decode steps at batch 1 / 4 / 64 x context 512 / 4096, prefill 2048).
# The deadline (DEADLINE seconds, default 540) bounds every step.
set -u
out=${1:?usage: llamacpp-peer.sh OUTDIR PKG}
pkg=$(cd "${2:?usage: llamacpp-peer.sh OUTDIR PKG}" && pwd)
deadline=${DEADLINE:-540}
lim() { local l=$(( deadline - SECONDS )); [ $l -lt 5 ] && l=5; [ "$1" -lt $l ] && echo "$1" || echo $l; }
log=$out/peer.log
mkdir -p "$out" /tmp/llcpp /tmp/kvpe /tmp/ggufpy
tar -xJf "$pkg/llamacpp-cuda.tar.xz" -C /tmp/llcpp
tar -xJf "$pkg/kvp-engine.tar.xz" -C /tmp/kvpe
pip install -q --no-deps --target /tmp/ggufpy "$pkg"/gguf-*.whl > "$out/pip.log" 2>&1
{ date -u; nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,memory.total --format=csv; } > "$log" 2>&1
model=/dev/shm/llama8b-bf16.gguf
here=$(dirname "$(readlink -f "$0")")
echo "== gguf secs=$SECONDS" >> "$log"
PYTHONPATH=/tmp/ggufpy timeout "$(lim 120)" python3 "$here/make_llama8b_bf16.py" --out $model >> "$log" 2>&1
ll() { LD_LIBRARY_PATH=/tmp/llcpp/lib:${LD_LIBRARY_PATH:-} "$@"; }
echo "== llama-bench prefill secs=$SECONDS" >> "$log"
ll timeout "$(lim 120)" /tmp/llcpp/bin/llama-bench -m $model -ngl 99 -fa 1 -p 512,2048 -n 0 -r 5 -o md >> "$log" 2>&1
echo "== llama-bench decode secs=$SECONDS" >> "$log"
ll timeout "$(lim 120)" /tmp/llcpp/bin/llama-bench -m $model -ngl 99 -fa 1 -p 0 -n 128 -d 512,4096 -r 3 -o md >> "$log" 2>&1
echo "== llama-batched-bench secs=$SECONDS" >> "$log"
ll timeout "$(lim 150)" /tmp/llcpp/bin/llama-batched-bench -m $model -ngl 99 -fa 1 -c 45056 -b 2048 -ub 512 \
  -npp 512 -ntg 128 -npl 1,4,64 >> "$log" 2>&1
cd /tmp/kvpe
source gpu/cuda-env.sh
for n in 1 64; do
  echo "== kvpool bench on the GGUF, $n request(s) secs=$SECONDS" >> "$log"
  timeout "$(lim 150)" ./kvpool bench --model $model --device cuda --block-size 16 --blocks 16384 \
    --workload offline --requests $n --prompt-tokens-min 512 --prompt-tokens-max 512 \
    --output-tokens-min 128 --output-tokens-max 128 --max-seqs 64 --step-tokens 4096 \
    >> "$log" 2>&1
  echo "rc=$?" >> "$log"
done
rm -f $model
echo "== model_cuda_bench secs=$SECONDS" >> "$log"
timeout "$(lim 150)" ./model_cuda_bench "$out/model.csv" 2>&1 | grep -E "llama31-8b|ceiling|bandwidth|matmul" >> "$log"
echo "end secs=$SECONDS" >> "$log"
