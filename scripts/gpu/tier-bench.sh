#!/usr/bin/env bash
# Session tiers on the GPU (docs/perf/engine.md, "Agents under pool pressure"): the tier
# transfer tests (and compute-sanitizer memcheck / racecheck over them), the pinned host <-> device
# copy bandwidth and the disk's sequential read bandwidth as ceilings, then the 8B-shape agents
# workloads with tiers none / host / disk, alternating. Run from the package of
# scripts/gpu/package-engine.sh:  bash gpu/tier-bench.sh OUTDIR
set -u -o pipefail
out=${1:?usage: tier-bench.sh OUTDIR}
here=$(cd "$(dirname "$0")/.." && pwd)
cd "$here"
source gpu/cuda-env.sh
status=0
{ date -u; nvidia-smi --query-gpu=name,memory.total,clocks.max.sm --format=csv; df -h /tmp; } \
  > "$out/tier-env.txt" 2>&1
echo "== tier transfer tests (+ memcheck, racecheck)"
timeout 120 ./kvp_model_gpu_tests --gtest_filter='CudaTierTransfers.*:CudaForwardBackendBlocks.*' \
  > "$out/tier-tests.log" 2>&1 || status=1
tail -3 "$out/tier-tests.log"
for tool in memcheck racecheck; do
  timeout 240 compute-sanitizer --tool $tool --error-exitcode 3 ./kvp_model_gpu_tests \
    --gtest_filter='CudaTierTransfers.*' > "$out/tier-$tool.log" 2>&1 || status=1
  echo "$tool: $(grep -E 'ERROR SUMMARY|PASSED|FAILED' "$out/tier-$tool.log" | tr '\n' ' ')"
done
echo "== ceilings: pinned cudaMemcpyAsync (torch), disk sequential read (dd)"
timeout 120 python3 - <<'EOF' 2>&1 | tee "$out/tier-ceilings.log"
import torch
n = 1 << 30
host = torch.empty(n, dtype=torch.uint8, pin_memory=True)
dev = torch.empty(n, dtype=torch.uint8, device="cuda")
s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
for name, dst, src in (("host->device", dev, host), ("device->host", host, dev)):
    best = 0.0
    for _ in range(5):
        s.record(); dst.copy_(src, non_blocking=True); e.record(); e.synchronize()
        best = max(best, n / (s.elapsed_time(e) / 1e3) / 1e9)
    print(f"pinned {name}: {best:.1f} GB/s (1 GiB, best of 5)")
EOF
tmpf=/tmp/kvp-dd-probe
dd if=/dev/zero of=$tmpf bs=16M count=128 oflag=direct 2>&1 | tail -1 | sed 's/^/dd write (direct): /' \
  | tee -a "$out/tier-ceilings.log"
dd if=$tmpf of=/dev/null bs=16M iflag=direct 2>&1 | tail -1 | sed 's/^/dd read (direct): /' \
  | tee -a "$out/tier-ceilings.log"
rm -f $tmpf
b8="./kvpool bench --random-model llama3-8b --device cuda --block-size 16"
# docs/perf/engine.md's pressure workload: 32 agents, histories to ~2.3K tokens, a 32K-token pool
for tier in none host disk; do
  case $tier in
    none) extra="" ;;
    host) extra="--host-tier-bytes 17179869184" ;;
    disk) extra="--disk-dir /tmp/kvp-spill --disk-tier-bytes 34359738368" ;;
  esac
  echo "== 8B agents under pool pressure (32 x 4, 2048 blocks), tier: $tier"
  timeout 200 $b8 --blocks 2048 --workload agents --agents 32 --turns 4 \
    --system-prompt-tokens 1024 --turn-tokens 256 --reply-tokens 64 --max-seqs 8 \
    --step-tokens 4096 $extra 2>&1 | tee "$out/8b-pressure-$tier.log" | tail -10 || status=1
  rm -rf /tmp/kvp-spill
done
# the issue's longer histories: 24 agents x 3 turns, 1K system prompt, 2K-token turns, 64K pool
for tier in none host; do
  extra=""
  [ "$tier" = host ] && extra="--host-tier-bytes 34359738368"
  echo "== 8B agents, 2K-token turns (24 x 3, 4096 blocks), tier: $tier"
  timeout 240 $b8 --blocks 4096 --workload agents --agents 24 --turns 3 \
    --system-prompt-tokens 1024 --turn-tokens 2048 --reply-tokens 64 --max-seqs 8 \
    --step-tokens 4096 $extra 2>&1 | tee "$out/8b-long-$tier.log" | tail -10 || status=1
done
# histories growing to ~16K tokens: 16 agents x 7 turns of 2K tokens, the same 64K pool
for tier in none host; do
  extra=""
  [ "$tier" = host ] && extra="--host-tier-bytes 42949672960"
  echo "== 8B agents to 16K-token histories (16 x 7, 4096 blocks), tier: $tier"
  timeout 300 $b8 --blocks 4096 --workload agents --agents 16 --turns 7 \
    --system-prompt-tokens 1024 --turn-tokens 2048 --reply-tokens 64 --max-seqs 8 \
    --step-tokens 4096 $extra 2>&1 | tee "$out/8b-16k-$tier.log" | tail -10 || status=1
done
exit $status
