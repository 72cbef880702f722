#!/usr/bin/env bash
# one device call: TMA page copies trial (issue 18). From the repo root on the device.
set -u
OUTD=${OUT:?}/w; mkdir -p $OUTD
rm -rf /tmp/kvp; mkdir -p /tmp/kvp && tar -xJf .gpu/pkg/kvp-gpu.tar.xz -C /tmp/kvp && tar -xJf .gpu/pkg/old.tar.xz -C /tmp/kvp
cd /tmp/kvp
export LD_LIBRARY_PATH=/tmp/kvp/lib:${LD_LIBRARY_PATH:-}
source gpu/cuda-env.sh 2>/dev/null
log=$OUT/run.log
{ date -u; nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,power.draw --format=csv; } > $log 2>&1
echo "== quick test" >> $log
timeout 90 ./kvp_backend_gpu_tests --gtest_filter='PagedAttention.PrefillTiles*' --gtest_brief=1 > $OUTD/quick.log 2>&1; echo "rc=$?" >> $log
tail -3 $OUTD/quick.log >> $log
for round in 1 2; do
  for b in old new v2 v3; do
    bin=./attention_cuda_bench; [ $b != new ] && bin=./attention_cuda_bench_$b
    echo "== $b round $round" >> $log
    timeout 120 $bin $OUTD/ab-$b-$round.csv --kinds prefill --ctx 2048,8192,32768 2>&1 | grep -E "prefill|ceiling" >> $log
  done
done
echo "== all attention tests" >> $log
timeout 240 ./kvp_backend_gpu_tests --gtest_filter='PagedAttention*' --gtest_brief=1 > $OUTD/tests.log 2>&1; echo "rc=$?" >> $log
tail -4 $OUTD/tests.log >> $log; grep -E "FAILED|Failure" $OUTD/tests.log | head -20 >> $log
filter='PagedAttention.PrefillTiles*:PagedAttention.Sinks*:PagedAttention.Mixed*:PagedAttention.Window*:*block16_d*_gqa4_q64'
for tool in memcheck racecheck synccheck; do
  echo "---- $tool" >> $log
  timeout 150 compute-sanitizer --tool $tool --error-exitcode 9 ./kvp_backend_gpu_tests --gtest_filter="$filter" --gtest_brief=1 > $OUTD/san-$tool.log 2>&1; echo "rc=$?" >> $log
  grep -E "ERROR SUMMARY|RACECHECK SUMMARY|PASSED|FAILED" $OUTD/san-$tool.log | tail -4 >> $log
done
echo "== v3 tests" >> $log
timeout 120 ./kvp_backend_gpu_tests_v3 --gtest_filter='PagedAttention*' --gtest_brief=1 > $OUTD/tests-v3.log 2>&1; echo "rc=$?" >> $log
tail -3 $OUTD/tests-v3.log >> $log; grep -E "FAILED|Failure" $OUTD/tests-v3.log | head -10 >> $log
for tool in racecheck synccheck; do
  echo "---- v3 $tool" >> $log
  timeout 100 compute-sanitizer --tool $tool --error-exitcode 9 ./kvp_backend_gpu_tests_v3 --gtest_filter='PagedAttention.PrefillTiles*:PagedAttention.Window*' --gtest_brief=1 > $OUTD/san-v3-$tool.log 2>&1; echo "rc=$?" >> $log
  grep -E "ERROR SUMMARY|RACECHECK SUMMARY|PASSED|FAILED" $OUTD/san-v3-$tool.log | tail -4 >> $log
done
echo "== sdpa" >> $log
timeout 150 python3 gpu/sdpa_peer.py $OUTD/sdpa.csv --kinds prefill >> $log 2>&1
for b in old new; do
  bin=./attention_cuda_bench; [ $b != new ] && bin=./attention_cuda_bench_$b
  echo "== ncu $b" >> $log
  timeout 150 ncu --clock-control none --set full -k regex:prefill_attention_sm90 --launch-skip 3 --launch-count 1 -o $OUTD/ncu-$b $bin $OUTD/ncu-$b.csv --kinds prefill --ctx 8192 --quick > $OUTD/ncu-$b-run.log 2>&1; echo "rc=$?" >> $log
  ncu --import $OUTD/ncu-$b.ncu-rep --page details > $OUTD/ncu-$b-details.txt 2>&1
  ncu --import $OUTD/ncu-$b.ncu-rep --page raw --csv > $OUTD/ncu-$b-raw.csv 2>&1
  ncu --import $OUTD/ncu-$b.ncu-rep --page source --csv --print-source sass > $OUTD/ncu-$b-sass.csv 2>&1
  mv $OUTD/ncu-$b.ncu-rep $OUT/ 2>/dev/null
done
ls -la $OUTD >> $log; tar -C $OUTD -czf $OUT/logs.tar.gz . && rm -rf $OUTD
cat $log
