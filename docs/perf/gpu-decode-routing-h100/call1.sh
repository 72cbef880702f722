#!/usr/bin/env bash
# device call 1 (2026-12-07, fourth session): Auto's decode routing (short splits in one wave to
# the per-lane kernel) against both kernels over the decode grid and a small grid, SDPA and
# FlashInfer beside; the KV write fused into qkv_post (KVP_FUSED_KV_WRITE=1, default) against its
# own kernel (=0) in 8B graph decode steps; the model bench; offline 64 requests greedy and
# sampled; model and attention tests; memcheck over the model's graph tests. (FlashInfer did not
# fit beside the package in the device tool's 64 MiB.)
set -u
OUTD=${OUT:?}/w; mkdir -p $OUTD
rm -rf /tmp/kvp; mkdir -p /tmp/kvp && tar -xJf .gpu/s4/kvp-gpu.tar.xz -C /tmp/kvp
cd /tmp/kvp
export LD_LIBRARY_PATH=/tmp/kvp/lib:${LD_LIBRARY_PATH:-}
source gpu/cuda-env.sh 2>/dev/null
log=$OUT/run.log
lim() { local l=$(( ${DEADLINE:-570} - SECONDS )); [ $l -lt 5 ] && l=5; [ $1 -lt $l ] && echo $1 || echo $l; }
{ date -u; nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,power.draw --format=csv; } > $log 2>&1
export PYTHONPATH=/tmp/kvp/gpu
K=decode,decode_tc,decode_lanes,decode_small,decode_small_tc,decode_small_lanes
echo "== attention decode round 1 secs=$SECONDS" >> $log
timeout $(lim 60) ./attention_cuda_bench $OUTD/dec-1.csv --kinds $K 2>&1 | grep -E "decode|ceiling" >> $log
echo "== model gpu tests secs=$SECONDS" >> $log
timeout $(lim 150) ./kvp_model_gpu_tests --gtest_brief=1 > $OUTD/model-tests.log 2>&1; echo "model tests rc=$? secs=$SECONDS" >> $log
tail -3 $OUTD/model-tests.log >> $log; grep -E "FAILED|Failure" $OUTD/model-tests.log | head >> $log
echo "== sdpa decode secs=$SECONDS" >> $log
timeout $(lim 90) python3 gpu/sdpa_peer.py $OUTD/sdpa.csv --kinds decode >> $log 2>&1
echo "== attention decode round 2 secs=$SECONDS" >> $log
timeout $(lim 60) ./attention_cuda_bench $OUTD/dec-2.csv --kinds $K 2>&1 | grep -E "decode|ceiling" >> $log
for r in 1 2; do for f in 1 0; do
  echo "== 8B decode steps, KVP_FUSED_KV_WRITE=$f round $r secs=$SECONDS" >> $log
  KVP_FUSED_KV_WRITE=$f timeout $(lim 60) ./model_cuda_bench $OUTD/steps-f$f-r$r.csv --decode-kernels 2>&1 | grep -E "graph|ceiling|bandwidth" >> $log
done; done
echo "== attention tests secs=$SECONDS" >> $log
timeout $(lim 120) ./kvp_backend_gpu_tests --gtest_filter='PagedAttention.*:PagedAttentionKv8*:CudaKvPool.*' --gtest_brief=1 > $OUTD/tests.log 2>&1; echo "tests rc=$? secs=$SECONDS" >> $log
tail -2 $OUTD/tests.log >> $log; grep -E "FAILED|Failure" $OUTD/tests.log | head >> $log
for mode in greedy sampled; do
  echo "== kvpool bench offline 64, $mode secs=$SECONDS" >> $log
  extra=""; [ $mode = sampled ] && extra="--temperature 0.8 --top-p 0.95"
  timeout $(lim 100) ./kvpool bench --random-model llama3-8b --device cuda --block-size 16 --blocks 16384 \
    --workload offline --requests 64 --prompt-tokens-min 256 --prompt-tokens-max 1024 \
    --output-tokens-min 128 --output-tokens-max 128 --max-seqs 64 --step-tokens 4096 $extra > $OUTD/offline-$mode.log 2>&1
  echo "rc=$?" >> $log; grep -iE "tok/s|tpot|ttft|requests" $OUTD/offline-$mode.log | head -12 >> $log
done
echo "== memcheck model graph tests secs=$SECONDS" >> $log
timeout $(lim 90) compute-sanitizer --tool memcheck --error-exitcode 9 ./kvp_model_gpu_tests --gtest_filter='*CudaTinyModel.PrefillLogits*/0:CudaForwardBackendGraphs.*' --gtest_brief=1 > $OUTD/memcheck.log 2>&1; echo "memcheck rc=$?" >> $log
grep -E "ERROR SUMMARY|FAILED|PASSED" $OUTD/memcheck.log | tail -3 >> $log
echo "== attention grid tests secs=$SECONDS" >> $log
timeout $(lim 150) ./kvp_backend_gpu_tests --gtest_filter='Grid/PagedAttentionMatrix.*' --gtest_brief=1 > $OUTD/tests-grid.log 2>&1; echo "tests rc=$? secs=$SECONDS" >> $log
tail -2 $OUTD/tests-grid.log >> $log; grep -E "FAILED|Failure" $OUTD/tests-grid.log | head >> $log
echo "end secs=$SECONDS" >> $log
mkdir -p $OUT/csv; cp $OUTD/*.csv $OUT/csv/ 2>/dev/null
tar -C $OUTD -czf $OUT/logs.tar.gz . && rm -rf $OUTD
tar -C $OUT -czf $OUT/csv.tar.gz csv && rm -rf $OUT/csv
cat $log
