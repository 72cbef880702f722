#!/usr/bin/env bash
# device call 2: v1 (committed TMA) vs v4 (main build: table a tile ahead) vs v5 (unconditional rescale) vs v6 (producer warpgroup)
set -u
OUTD=${OUT:?}/w; mkdir -p $OUTD
rm -rf /tmp/kvp; mkdir -p /tmp/kvp && tar -xJf .gpu/pkg/kvp-gpu.tar.xz -C /tmp/kvp && tar -xJf .gpu/pkg/old.tar.xz -C /tmp/kvp
cd /tmp/kvp
export LD_LIBRARY_PATH=/tmp/kvp/lib:${LD_LIBRARY_PATH:-}
source gpu/cuda-env.sh 2>/dev/null
log=$OUT/run.log
{ date -u; nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,power.draw --format=csv; } > $log 2>&1
echo "== v6 quick test" >> $log
timeout 100 ./kvp_backend_gpu_tests_v6 --gtest_filter='PagedAttention.PrefillTiles*:PagedAttention.Window*' --gtest_brief=1 > $OUTD/quick-v6.log 2>&1; echo "rc=$?" >> $log
tail -3 $OUTD/quick-v6.log >> $log; grep -E "FAILED|Failure" $OUTD/quick-v6.log | head -5 >> $log
for round in 1 2; do
  for b in v1 v4 v5 v6; do
    bin=./attention_cuda_bench_$b; [ $b = v4 ] && bin=./attention_cuda_bench
    echo "== $b round $round" >> $log
    timeout 60 $bin $OUTD/ab-$b-$round.csv --kinds prefill --ctx 2048,8192,32768 2>&1 | grep -E "prefill|ceiling" >> $log
  done
done
echo "== v4 all attention tests" >> $log
timeout 150 ./kvp_backend_gpu_tests --gtest_filter='PagedAttention*' --gtest_brief=1 > $OUTD/tests.log 2>&1; echo "rc=$?" >> $log
tail -3 $OUTD/tests.log >> $log; grep -E "FAILED|Failure" $OUTD/tests.log | head -10 >> $log
filter='PagedAttention.PrefillTiles*:PagedAttention.Sinks*:PagedAttention.Mixed*:PagedAttention.Window*:*block16_d*_gqa4_q64'
for tool in memcheck racecheck synccheck; do
  echo "---- v4 $tool" >> $log
  timeout 100 compute-sanitizer --tool $tool --error-exitcode 9 ./kvp_backend_gpu_tests --gtest_filter="$filter" --gtest_brief=1 > $OUTD/san-$tool.log 2>&1; echo "rc=$?" >> $log
  grep -E "ERROR SUMMARY|RACECHECK SUMMARY|PASSED|FAILED" $OUTD/san-$tool.log | tail -3 >> $log
done
echo "== v6 all attention tests" >> $log
timeout 120 ./kvp_backend_gpu_tests_v6 --gtest_filter='PagedAttention*' --gtest_brief=1 > $OUTD/tests-v6.log 2>&1; echo "rc=$?" >> $log
tail -3 $OUTD/tests-v6.log >> $log; grep -E "FAILED|Failure" $OUTD/tests-v6.log | head -10 >> $log
for tool in racecheck synccheck; do
  echo "---- v6 $tool" >> $log
  timeout 80 compute-sanitizer --tool $tool --error-exitcode 9 ./kvp_backend_gpu_tests_v6 --gtest_filter='PagedAttention.PrefillTiles*' --gtest_brief=1 > $OUTD/san-v6-$tool.log 2>&1; echo "rc=$?" >> $log
  grep -E "ERROR SUMMARY|RACECHECK SUMMARY|PASSED|FAILED" $OUTD/san-v6-$tool.log | tail -3 >> $log
done
ls -la $OUTD >> $log; tar -C $OUTD -czf $OUT/logs.tar.gz . && rm -rf $OUTD
cat $log
