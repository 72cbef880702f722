#!/usr/bin/env bash
# device call 4 (2026-12-07b): grid order as a template parameter: base (pingpong, 17b0416) vs tpl (heads fastest up to 6 waves, main build) vs tall (the same code, heads fastest always); tests + sanitizers on tpl
set -u
OUTD=${OUT:?}/w; mkdir -p $OUTD
rm -rf /tmp/kvp; mkdir -p /tmp/kvp && tar -xJf .gpu/pkg/kvp-gpu.tar.xz -C /tmp/kvp && tar -xf .gpu/pkg/extra.tar -C /tmp/kvp && xz -dc /tmp/kvp/abb.xz > /tmp/kvp/attention_cuda_bench_base && chmod +x /tmp/kvp/attention_cuda_bench_base && xz -dc /tmp/kvp/abt.xz > /tmp/kvp/attention_cuda_bench_tall && chmod +x /tmp/kvp/attention_cuda_bench_tall
cd /tmp/kvp
export LD_LIBRARY_PATH=/tmp/kvp/lib:${LD_LIBRARY_PATH:-}
source gpu/cuda-env.sh 2>/dev/null
log=$OUT/run.log
lim() { local l=$(( 575 - SECONDS )); [ $l -lt 5 ] && l=5; [ $1 -lt $l ] && echo $1 || echo $l; }
{ date -u; nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,power.draw --format=csv; } > $log 2>&1
for round in 1 2; do
  for b in base tpl tall; do
    bin=./attention_cuda_bench_$b; [ $b = tpl ] && bin=./attention_cuda_bench
    echo "== $b round $round" >> $log
    timeout $(lim 60) $bin $OUTD/ab-$b-$round.csv --kinds prefill --ctx 2048,8192,32768 2>&1 | grep -E "prefill|ceiling" >> $log
  done
done
echo "== tests + sanitizers, concurrently secs=$SECONDS" >> $log
t=$(lim 260)
timeout $t ./kvp_backend_gpu_tests --gtest_filter='*PagedAttention*' --gtest_brief=1 > $OUTD/tests.log 2>&1 &
p1=$!
timeout $t compute-sanitizer --tool racecheck --error-exitcode 9 ./kvp_backend_gpu_tests --gtest_filter='PagedAttention.PrefillTiles*' --gtest_brief=1 > $OUTD/san-racecheck.log 2>&1 &
p2=$!
timeout $t compute-sanitizer --tool memcheck --error-exitcode 9 ./kvp_backend_gpu_tests --gtest_filter='PagedAttention.PrefillTiles*:PagedAttention.Window*:PagedAttention.Mixed*:*block8_d128_gqa4_q64:*block32_d128_gqa4_q64' --gtest_brief=1 > $OUTD/san-memcheck.log 2>&1 &
p3=$!
timeout $t compute-sanitizer --tool synccheck --error-exitcode 9 ./kvp_backend_gpu_tests --gtest_filter='PagedAttention.PrefillTiles*:*block32_d64_gqa8_q64' --gtest_brief=1 > $OUTD/san-synccheck.log 2>&1 &
p4=$!
wait $p1; echo "tests rc=$? secs=$SECONDS" >> $log
tail -3 $OUTD/tests.log >> $log; grep -E "FAILED|Failure" $OUTD/tests.log | head -10 >> $log
for n in racecheck:$p2 memcheck:$p3 synccheck:$p4; do wait ${n#*:}; echo "${n%:*} rc=$?" >> $log; grep -E "ERROR SUMMARY|RACECHECK SUMMARY|PASSED|FAILED" $OUTD/san-${n%:*}.log | tail -3 >> $log; done
echo "end secs=$SECONDS" >> $log
tar -C $OUTD -czf $OUT/logs.tar.gz . && rm -rf $OUTD
cat $log
