#!/usr/bin/env bash
# device call 1 (2026-12-07c): 16-bit decode on tensor cores (decode_attention_mma.cu) against the
# per-lane kernel, SDPA and FlashInfer in the same run; the 8B decode step with both; tests, sanitizers
set -u
OUTD=${OUT:?}/w; mkdir -p $OUTD
rm -rf /tmp/kvp; mkdir -p /tmp/kvp && tar -xJf .gpu/dec/kvp-gpu.tar.xz -C /tmp/kvp && tar -xf .gpu/dec/extra.tar -C /tmp/kvp
cd /tmp/kvp
export LD_LIBRARY_PATH=/tmp/kvp/lib:${LD_LIBRARY_PATH:-}
source gpu/cuda-env.sh 2>/dev/null
log=$OUT/run.log
lim() { local l=$(( 580 - SECONDS )); [ $l -lt 5 ] && l=5; [ $1 -lt $l ] && echo $1 || echo $l; }
{ date -u; nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,power.draw --format=csv; } > $log 2>&1
pip install -q --no-deps --target /tmp/fi wheels/*.whl > $OUTD/pip.log 2>&1; echo "pip rc=$?" >> $log
export PYTHONPATH=/tmp/fi:/tmp/kvp/gpu FLASHINFER_CUDA_ARCH_LIST=9.0a
(python3 gpu/flashinfer_peer.py $OUTD/fi-warm.csv --warmup --kinds decode --decode-modes tc > $OUTD/fi-warm.log 2>&1; echo "warm rc=$?" >> $OUTD/fi-warm.log) &
warm=$!
for round in 1 2; do
  echo "== attention decode round $round secs=$SECONDS" >> $log
  timeout $(lim 60) ./attention_cuda_bench $OUTD/dec-$round.csv --kinds decode,decode_lanes 2>&1 | grep -E "decode|ceiling" >> $log
done
echo "== int8, block sizes secs=$SECONDS" >> $log
timeout $(lim 40) ./attention_cuda_bench $OUTD/dec-int8.csv --kinds decode --kv int8 2>&1 | grep -E "decode|ceiling" >> $log
timeout $(lim 40) ./attention_cuda_bench $OUTD/dec-block.csv --kinds decode_block 2>&1 | grep -E "decode|ceiling" >> $log
echo "== sdpa decode secs=$SECONDS" >> $log
timeout $(lim 90) python3 gpu/sdpa_peer.py $OUTD/sdpa.csv --kinds decode >> $log 2>&1
echo "== 8B decode steps secs=$SECONDS" >> $log
timeout $(lim 150) ./model_cuda_bench $OUTD/model.csv --decode-kernels > $OUTD/model.log 2>&1; echo "rc=$?" >> $log
grep -E "decode|ceiling|copy" $OUTD/model.log >> $log
echo "== flashinfer decode (warmup wait, secs=$SECONDS)" >> $log
wait $warm; tail -3 $OUTD/fi-warm.log >> $log
timeout $(lim 90) python3 gpu/flashinfer_peer.py $OUTD/fi-decode.csv --kinds decode --decode-modes tc >> $log 2>&1
echo "== attention decode round 3 secs=$SECONDS" >> $log
timeout $(lim 60) ./attention_cuda_bench $OUTD/dec-3.csv --kinds decode,decode_lanes 2>&1 | grep -E "decode|ceiling" >> $log
echo "== tests + sanitizers secs=$SECONDS" >> $log
san='PagedAttention.SoftCapWithWindowAndGqa:PagedAttention.UnusualGqaRatiosAndBlockSizes:PagedAttention.F16KvAndQueries:PagedAttention.LongContextDecodeSplitsKv:PagedAttention.Sinks*:PagedAttentionKv8*TensorCoreDecodeShapes*'
( timeout $(lim 200) compute-sanitizer --tool memcheck --error-exitcode 9 ./kvp_backend_gpu_tests --gtest_filter="$san" --gtest_brief=1 > $OUTD/san-memcheck.log 2>&1; echo "memcheck rc=$?" >> $OUTD/san-memcheck.log ) &
( timeout $(lim 200) compute-sanitizer --tool racecheck --error-exitcode 9 ./kvp_backend_gpu_tests --gtest_filter='PagedAttention.F16KvAndQueries:PagedAttention.UnusualGqaRatiosAndBlockSizes:PagedAttention.LongContextDecodeSplitsKv' --gtest_brief=1 > $OUTD/san-racecheck.log 2>&1; echo "racecheck rc=$?" >> $OUTD/san-racecheck.log ) &
( timeout $(lim 200) compute-sanitizer --tool synccheck --error-exitcode 9 ./kvp_backend_gpu_tests --gtest_filter='PagedAttention.F16KvAndQueries:PagedAttention.UnusualGqaRatiosAndBlockSizes' --gtest_brief=1 > $OUTD/san-synccheck.log 2>&1; echo "synccheck rc=$?" >> $OUTD/san-synccheck.log ) &
timeout $(lim 300) ./kvp_backend_gpu_tests --gtest_filter='*PagedAttention*' --gtest_brief=1 > $OUTD/tests.log 2>&1; echo "tests rc=$? secs=$SECONDS" >> $log
tail -3 $OUTD/tests.log >> $log; grep -E "FAILED|Failure" $OUTD/tests.log | head -20 >> $log
grep -c "tensor-core decode" $OUTD/tests.log >> $log
wait
for t in memcheck racecheck synccheck; do echo "---- $t" >> $log; grep -E "ERROR SUMMARY|RACECHECK SUMMARY|PASSED|FAILED|rc=" $OUTD/san-$t.log | tail -4 >> $log; done
echo "end secs=$SECONDS" >> $log
mkdir -p $OUT/csv; cp $OUTD/*.csv $OUT/csv/ 2>/dev/null
tar -C $OUTD -czf $OUT/logs.tar.gz . && rm -rf $OUTD
tar -C $OUT -czf $OUT/csv.tar.gz csv && rm -rf $OUT/csv
cat $log
