#!/usr/bin/env bash
# device call 3 (2026-12-07b): grid order: base (pingpong, 17b0416) vs lpt (heads fastest always) vs cond (heads fastest up to 6 waves, main build); SDPA and FlashInfer fa3 beside; tests + sanitizers on cond
set -u
OUTD=${OUT:?}/w; mkdir -p $OUTD
rm -rf /tmp/kvp; mkdir -p /tmp/kvp && tar -xJf .gpu/pkg/kvp-gpu.tar.xz -C /tmp/kvp && tar -xf .gpu/pkg/extra.tar -C /tmp/kvp && xz -dc /tmp/kvp/abb.xz > /tmp/kvp/attention_cuda_bench_base && chmod +x /tmp/kvp/attention_cuda_bench_base && xz -dc /tmp/kvp/abl.xz > /tmp/kvp/attention_cuda_bench_lpt && chmod +x /tmp/kvp/attention_cuda_bench_lpt
cd /tmp/kvp
export LD_LIBRARY_PATH=/tmp/kvp/lib:${LD_LIBRARY_PATH:-}
source gpu/cuda-env.sh 2>/dev/null
log=$OUT/run.log
lim() { local l=$(( 575 - SECONDS )); [ $l -lt 5 ] && l=5; [ $1 -lt $l ] && echo $1 || echo $l; }
{ date -u; nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,power.draw --format=csv; } > $log 2>&1
pip install -q --no-deps --target /tmp/fi wheels/*.whl > $OUTD/pip.log 2>&1; echo "pip rc=$?" >> $log
export PYTHONPATH=/tmp/fi:/tmp/kvp/gpu FLASHINFER_CUDA_ARCH_LIST=9.0a
(python3 gpu/flashinfer_peer.py $OUTD/fi-warm.csv --warmup --kinds prefill --prefill-backends fa3 > $OUTD/fi-warm.log 2>&1) &
warm=$!
for round in 1 2; do
  for b in base lpt cond; do
    bin=./attention_cuda_bench_$b; [ $b = cond ] && bin=./attention_cuda_bench
    echo "== $b round $round" >> $log
    timeout $(lim 60) $bin $OUTD/ab-$b-$round.csv --kinds prefill --ctx 1024,2048,4096,8192 2>&1 | grep -E "prefill|ceiling" >> $log
  done
done
echo "== sdpa prefill secs=$SECONDS" >> $log
timeout $(lim 90) python3 gpu/sdpa_peer.py $OUTD/sdpa.csv --kinds prefill >> $log 2>&1
wait $warm; tail -3 $OUTD/fi-warm.log >> $log
echo "== flashinfer fa3 secs=$SECONDS" >> $log
timeout $(lim 90) python3 gpu/flashinfer_peer.py $OUTD/fi-prefill.csv --kinds prefill --prefill-backends fa3 >> $log 2>&1
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
