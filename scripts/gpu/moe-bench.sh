#!/usr/bin/env bash
# Mixture of experts on one GPU (docs/perf/model-cuda.md, "Mixture of experts"): the model GPU
# tests (the MoE kernels against a double reference, the tiny MoE models through the decode
# kernels and the prompt steps' expert GEMMs against transformers), compute-sanitizer memcheck
# over the MoE kernel and GEMM tests (racecheck too with the section `racecheck`), then model_cuda_bench --moe (decode steps,
# and prefill of 2048 and 512 tokens with the experts as grouped GEMMs, one GEMM per expert and
# the decode kernels, same process). Run from the package of scripts/gpu/package-engine.sh:
#   bash gpu/moe-bench.sh OUTDIR [tests] [sanitize] [racecheck] [profile] [profile-decode] [bench]
# (no sections: tests, sanitize and bench)
set -u -o pipefail
out=${1:?usage: moe-bench.sh OUTDIR}
here=$(cd "$(dirname "$0")/.." && pwd)
cd "$here"
source gpu/cuda-env.sh
status=0
{ date -u; nvidia-smi --query-gpu=name,memory.total,clocks.max.sm --format=csv; } \
  > "$out/moe-env.txt" 2>&1
sections=${*:2}
[ -z "$sections" ] && sections="tests sanitize bench"
want() { [[ " $sections " == *" $1 "* ]]; }
if want tests; then
  echo "== model gpu tests"
  timeout 240 ./kvp_model_gpu_tests > "$out/moe-tests.log" 2>&1 || status=1
  grep -E "^\[ (experts|moe gemm)|OK \]|FAILED|PASSED" "$out/moe-tests.log" | tail -40
fi
if want sanitize || want racecheck; then
  filter='CudaMoeExperts.*:*CudaMoeGemm*/1'
  tools=""
  want sanitize && tools="memcheck"
  want racecheck && tools="$tools racecheck"
  for tool in $tools; do
    echo "== compute-sanitizer $tool ($filter)"
    timeout 150 compute-sanitizer --tool "$tool" --error-exitcode 9 ./kvp_model_gpu_tests \
      --gtest_filter="$filter" > "$out/moe-sanitize-$tool.log" 2>&1 || status=1
    grep -E "ERROR SUMMARY|PASSED|FAILED" "$out/moe-sanitize-$tool.log" | tail -4
  done
fi
# kernel times of one Qwen3-30B-A3B step (ncu, serialised): the prefill of 2048 tokens
# (section profile) or a decode step at batch 1, context 512 (profile-decode), summed per kernel
profile() {  # NAME FLAG
  echo "== ncu: one qwen3-30b-a3b $1"
  timeout 300 ncu --profile-from-start off --metrics gpu__time_duration.sum --csv \
    ./model_cuda_bench /tmp/moe-p.csv "$2" > "$out/moe-ncu-$1.csv" 2>&1 || status=1
  python3 - "$out/moe-ncu-$1.csv" <<'PY' | tee "$out/moe-ncu-$1-summary.txt"
import csv, sys, collections
rows = [l for l in open(sys.argv[1]) if l.startswith('"')]
t = collections.defaultdict(float); n = collections.Counter()
for r in csv.DictReader(rows):
    if r.get("Metric Name") != "gpu__time_duration.sum": continue
    v = float(r["Metric Value"].replace(",", "")); unit = r["Metric Unit"]
    us = v / 1000 if unit in ("ns", "nsecond") else v * 1000 if unit in ("ms", "msecond") else v
    name = r["Kernel Name"].split("(")[0][:70]
    t[name] += us; n[name] += 1
total = sum(t.values())
print(f"kernels: {sum(n.values())}, {total:.0f} us in all")
for k, v in sorted(t.items(), key=lambda x: -x[1])[:25]:
    print(f"{v:10.0f} us {100*v/total:5.1f} % {n[k]:5d}x  {k}")
PY
}
want profile && profile prefill --profile-moe-prefill
want profile-decode && profile decode --profile-moe-decode
if want bench; then
  echo "== model_cuda_bench --moe"
  timeout 260 ./model_cuda_bench "$out/moe.csv" --moe 2>&1 | tee "$out/moe-bench.log" || status=1
fi
exit $status
