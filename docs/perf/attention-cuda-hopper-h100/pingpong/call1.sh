#!/usr/bin/env bash
# device call 1 (2026-12-07b): pingpong (main build) vs base (HEAD) prefill, SDPA, tests incl. Grid, FlashInfer
set -u
OUTD=${OUT:?}/w; mkdir -p $OUTD
rm -rf /tmp/kvp; mkdir -p /tmp/kvp && tar -xJf .gpu/pkg/kvp-gpu.tar.xz -C /tmp/kvp && tar -xf .gpu/pkg/extra.tar -C /tmp/kvp && xz -dc /tmp/kvp/abb.xz > /tmp/kvp/attention_cuda_bench_base && chmod +x /tmp/kvp/attention_cuda_bench_base
cd /tmp/kvp
export LD_LIBRARY_PATH=/tmp/kvp/lib:${LD_LIBRARY_PATH:-}
source gpu/cuda-env.sh 2>/dev/null
log=$OUT/run.log
lim() { local l=$(( 575 - SECONDS )); [ $l -lt 5 ] && l=5; [ $1 -lt $l ] && echo $1 || echo $l; }
{ date -u; nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,power.draw --format=csv; } > $log 2>&1
pip install -q --no-deps --target /tmp/fi wheels/*.whl > $OUTD/pip.log 2>&1; echo "pip rc=$?" >> $log
export PYTHONPATH=/tmp/fi:/tmp/kvp/gpu FLASHINFER_CUDA_ARCH_LIST=9.0a
(python3 gpu/flashinfer_peer.py $OUTD/fi-warm.csv --warmup > $OUTD/fi-warm.log 2>&1; echo "warm rc=$?" >> $OUTD/fi-warm.log) &
warm=$!
for round in 1 2; do
  for b in base pp; do
    bin=./attention_cuda_bench_base; [ $b = pp ] && bin=./attention_cuda_bench
    echo "== $b round $round" >> $log
    timeout $(lim 60) $bin $OUTD/ab-$b-$round.csv --kinds prefill --ctx 2048,8192,32768 2>&1 | grep -E "prefill|ceiling" >> $log
  done
done
echo "== sdpa prefill" >> $log
timeout $(lim 90) python3 gpu/sdpa_peer.py $OUTD/sdpa.csv --kinds prefill >> $log 2>&1
echo "== pp attention tests (incl Grid)" >> $log
timeout $(lim 200) ./kvp_backend_gpu_tests --gtest_filter='*PagedAttention*' --gtest_brief=1 > $OUTD/tests.log 2>&1; echo "rc=$? secs=$SECONDS" >> $log
tail -3 $OUTD/tests.log >> $log; grep -E "FAILED|Failure" $OUTD/tests.log | head -10 >> $log
for tool in racecheck synccheck; do
  echo "---- pp $tool" >> $log
  timeout $(lim 70) compute-sanitizer --tool $tool --error-exitcode 9 ./kvp_backend_gpu_tests --gtest_filter='PagedAttention.PrefillTiles*' --gtest_brief=1 > $OUTD/san-$tool.log 2>&1; echo "rc=$? secs=$SECONDS" >> $log
  grep -E "ERROR SUMMARY|RACECHECK SUMMARY|PASSED|FAILED" $OUTD/san-$tool.log | tail -3 >> $log
done
echo "== flashinfer (warmup wait, secs=$SECONDS)" >> $log
wait $warm; tail -8 $OUTD/fi-warm.log >> $log
timeout $(lim 120) python3 gpu/flashinfer_peer.py $OUTD/fi-prefill.csv --kinds prefill >> $log 2>&1
timeout $(lim 150) python3 gpu/flashinfer_peer.py $OUTD/fi-decode.csv --kinds decode --decode-modes tc >> $log 2>&1
echo "== kvpool decode secs=$SECONDS" >> $log
timeout $(lim 100) ./attention_cuda_bench $OUTD/decode.csv --kinds decode 2>&1 | grep -E "decode|ceiling" >> $log
echo "end secs=$SECONDS" >> $log
cp $OUTD/*.csv $OUT/ 2>/dev/null; mkdir -p $OUT/csv; mv $OUT/*.csv $OUT/csv/ 2>/dev/null
tar -C $OUTD -czf $OUT/logs.tar.gz . && rm -rf $OUTD
tar -C $OUT -czf $OUT/csv.tar.gz csv && rm -rf $OUT/csv
cat $log
