#!/usr/bin/env bash
# `kvpool serve` against the engine in-process on the GPU (docs/perf/server.md, "H100"): the
# Llama-3.1-8B shape with random bf16 weights, the same closed-loop load (32 clients, 256 requests
# of 256-1024 random prompt ids and 128 output tokens) through `kvpool bench --workload closed`
# and through the server (bench/server/compare_llama_server.py --workloads closed, streamed
# /v1/completions on token ids, the prompt lengths of the bench run just before; every run draws
# other ids, so no run hits the prefix cache), twice each, alternating. Each side runs the load
# once unmeasured first (bench --warmup, the server's first closed run). The server's model decodes through
# a filler tokenizer of the shape's 128256 ids (scripts/make_filler_tokenizer.py). Run from the
# folder scripts/gpu/package-engine.sh unpacks:
#   bash gpu/server-bench.sh OUTDIR
set -u -o pipefail
out=${1:?usage: server-bench.sh OUTDIR}
here=$(cd "$(dirname "$0")/.." && pwd)
cd "$here"
source gpu/cuda-env.sh
status=0
python3 gpu/make_filler_tokenizer.py --vocab 128256 --out /tmp/kvp-filler || exit 1
shape="--random-model llama3-8b --device cuda --block-size 16 --blocks 16384 --max-seqs 64 \
--step-tokens 4096"
load_bench="--workload closed --concurrency 32 --target-output-tokens 32768 --prompt-tokens-min 256 \
--prompt-tokens-max 1024 --output-tokens-min 128 --output-tokens-max 128 --warmup on"
load_server="--workloads closed,closed --concurrency 32 --max-tokens 128 --time-limit 200"
for rep in 1 2; do
  echo "== in-process kvpool bench, rep $rep"
  timeout 240 ./kvpool bench $shape $load_bench --csv "$out/inprocess-$rep.csv" 2>&1 \
    | tee "$out/inprocess-$rep.log" || status=1
  echo "== kvpool serve, rep $rep (two runs of the load: the first warms the server up)"
  timeout 400 python3 gpu/compare_llama_server.py --kvpool ./kvpool --servers kvpool \
    --kvpool-args "$shape --tokenizer /tmp/kvp-filler" $load_server \
    --prompt-lengths-csv "$out/inprocess-$rep.csv" --out "$out/server-$rep" \
    2>&1 | tee "$out/server-$rep.log" || status=1
done
exit $status
