#!/usr/bin/env bash
# Alternating KV dtypes run by run: model_cpu_bench (bench/model_cpu_bench.cc with --kv-dtype,
# snapshot of the release build) at 2 threads, prompt 512, 32 decode steps, batch 1 and 8.
#   bench/cpu/results/2026-12-07b-kvdtype/run.sh MODEL TAG ROUNDS DTYPES...
set -euo pipefail
model=$1; tag=$2; rounds=$3; shift 3
out=$(dirname "$0")
bin=${BIN:-/tmp/model_cpu_bench.kvd}
for r in $(seq "${FIRST:-1}" $((${FIRST:-1} + rounds - 1))); do
  for d in "$@"; do
    f=$out/$tag.$d.$r.txt
    echo "date: $(date -u +%H:%M:%S) load: $(cut -d' ' -f1-3 /proc/loadavg)" > "$f"
    "$bin" --model "$model" --threads 2 --prompt 512 --decode 32 --batch 1,8 --kv-dtype "$d" >> "$f"
    echo "end: $(date -u +%H:%M:%S) load: $(cut -d' ' -f1-3 /proc/loadavg)" >> "$f"
  done
done
