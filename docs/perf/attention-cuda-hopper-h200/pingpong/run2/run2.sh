#!/usr/bin/env bash
# run 2: the bench section of prefill-bench.sh (default variant 1 = ping-pong), then the variants,
# quick tests of the untested variants, SASS of the bf16 d128 kernels, ncu of v0 / v1 at 8K.
out=$1
cd /tmp/kvp
bash gpu/prefill-bench.sh "$out" bench; echo "bench rc=$?"
rm -f "$out/logs.tar.gz"
export LD_LIBRARY_PATH=$PWD/lib
for v in 0 1 2 3 5; do
  KVP_SM90_VARIANT=$v timeout 60 ./attention_cuda_bench /tmp/var$v.csv --kinds prefill 2>&1 |
    grep ^prefill | sed "s/^/v$v /" >> "$out/variants.log"
  cat /tmp/var$v.csv >> "$out/variants.csv"
done
cat "$out/variants.log"
for v in 2 3 5; do
  echo "== tests variant $v" >> "$out/variants.log"
  KVP_SM90_VARIANT=$v timeout 50 ./kvp_backend_gpu_tests --gtest_brief=1 \
    --gtest_filter='PagedAttention.PrefillTiles*:PagedAttention.Sinks*:PagedAttention.Mixed*:*block16_d*_gqa4_q64' \
    2>&1 | grep -E "hopper prefill call 1|PASSED|FAILED" | tail -8 >> "$out/variants.log"
done
tail -30 "$out/variants.log"
cuobjdump -sass ./attention_cuda_bench > /tmp/all.sass 2>/dev/null
for v in 0 1; do
  awk -v pat="bfloat16Li128ELNS1_8KvFormatE0ELi${v}E" '/Function :/{f=index($0,pat)>0} f' /tmp/all.sass > /tmp/k$v.sass
  echo "== v$v: $(wc -l < /tmp/k$v.sass) lines" >> "$out/sass.txt"
  awk '$1 ~ /^\/\*[0-9a-f]+\*\/$/ {op=$2; if (op ~ /^@/) op=$3; sub(/\..*/,"",op); c[op]++} END {for (o in c) print c[o], o}' /tmp/k$v.sass | sort -rn | head -40 >> "$out/sass.txt"
done
cat /tmp/k0.sass /tmp/k1.sass | xz -1 > "$out/sass-v0-v1.txt.xz"
head -100 "$out/sass.txt"
for v in 0 1; do
  KVP_SM90_VARIANT=$v timeout 75 ncu --clock-control none --kernel-name regex:prefill_attention_sm90 \
    --launch-count 1 --section SpeedOfLight --section WarpStateStats --section SchedulerStats \
    --section InstructionStats --section ComputeWorkloadAnalysis \
    ./attention_cuda_bench /tmp/ncu$v.csv --kinds prefill --ctx 8192 --quick > /tmp/ncu$v.txt 2>&1
  echo "== ncu variant $v rc=$?" >> "$out/ncu.txt"
  cat /tmp/ncu$v.txt >> "$out/ncu.txt"
done
grep -E "==|Duration|Issue Slots Busy|No Eligible|Warp Cycles Per Issued|Executed Ipc A|Active Warps Per|Eligible Warps" "$out/ncu.txt"
ls -la "$out"
