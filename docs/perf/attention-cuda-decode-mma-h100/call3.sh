#!/usr/bin/env bash
# device call 3 (2026-12-07c): the tensor-core decode with its split policy (16 splits at most up
# to 4K; 512 keys a split once the grid covers half the SMs) against the per-lane kernel, SDPA and
# FlashInfer in the same run; the decode tests
set -u
OUTD=${OUT:?}/w; mkdir -p $OUTD
rm -rf /tmp/kvp; mkdir -p /tmp/kvp && tar -xJf .gpu/dec3/kvp-gpu.tar.xz -C /tmp/kvp && tar -xf .gpu/dec3/extra.tar -C /tmp/kvp
cd /tmp/kvp
export LD_LIBRARY_PATH=/tmp/kvp/lib:${LD_LIBRARY_PATH:-}
source gpu/cuda-env.sh 2>/dev/null
log=$OUT/run.log
lim() { local l=$(( 300 - SECONDS )); [ $l -lt 5 ] && l=5; [ $1 -lt $l ] && echo $1 || echo $l; }
{ date -u; nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,power.draw --format=csv; } > $log 2>&1
pip install -q --no-deps --target /tmp/fi wheels/*.whl > $OUTD/pip.log 2>&1; echo "pip rc=$?" >> $log
export PYTHONPATH=/tmp/fi:/tmp/kvp/gpu FLASHINFER_CUDA_ARCH_LIST=9.0a
(python3 gpu/flashinfer_peer.py $OUTD/fi-warm.csv --warmup --kinds decode --decode-modes tc > $OUTD/fi-warm.log 2>&1; echo "warm rc=$?" >> $OUTD/fi-warm.log) &
warm=$!
for round in 1 2; do
  echo "== attention decode round $round secs=$SECONDS" >> $log
  timeout $(lim 60) ./attention_cuda_bench $OUTD/dec-$round.csv --kinds decode,decode_lanes,decode_factor 2>&1 | grep -E "decode|ceiling" >> $log
done
echo "== sdpa decode secs=$SECONDS" >> $log
timeout $(lim 90) python3 gpu/sdpa_peer.py $OUTD/sdpa.csv --kinds decode >> $log 2>&1
echo "== flashinfer decode (warmup wait, secs=$SECONDS)" >> $log
wait $warm; tail -3 $OUTD/fi-warm.log >> $log
timeout $(lim 90) python3 gpu/flashinfer_peer.py $OUTD/fi-decode.csv --kinds decode --decode-modes tc >> $log 2>&1
echo "== attention decode round 3 secs=$SECONDS" >> $log
timeout $(lim 60) ./attention_cuda_bench $OUTD/dec-3.csv --kinds decode,decode_lanes,decode_factor 2>&1 | grep -E "decode|ceiling" >> $log
echo "== decode tests secs=$SECONDS" >> $log
timeout $(lim 150) ./kvp_backend_gpu_tests --gtest_filter='PagedAttention.*:PagedAttentionKv8*:Grid/PagedAttentionMatrix.*' --gtest_brief=1 > $OUTD/tests.log 2>&1; echo "tests rc=$? secs=$SECONDS" >> $log
tail -2 $OUTD/tests.log >> $log; grep -E "FAILED|Failure" $OUTD/tests.log | head >> $log
echo "end secs=$SECONDS" >> $log
mkdir -p $OUT/csv; cp $OUTD/*.csv $OUT/csv/ 2>/dev/null
tar -C $OUTD -czf $OUT/logs.tar.gz . && rm -rf $OUTD
tar -C $OUT -czf $OUT/csv.tar.gz csv && rm -rf $OUT/csv
cat $log
