#!/usr/bin/env bash
# int8 KV checks on the GPU machine (second run); from the unpacked package root, logs into $1.
out=$1
source gpu/cuda-env.sh
nvidia-smi -L; date -u
echo "== int8 backend tests"
timeout 90 ./kvp_backend_gpu_tests --gtest_filter='*Int8*' > $out/int8_tests.log 2>&1; echo "rc=$?"
grep -E "PASSED|FAILED|tests ran" $out/int8_tests.log | tail -12
echo "== mutation (decode V scale and prefill K scale skipped): int8 tests must fail"
timeout 40 ./kvp_backend_gpu_tests_mut --gtest_filter='PagedAttentionInt8Matrix.*d128_gqa4*:PagedAttention.Int8Mixed*:CudaKvPool.Int8*' > $out/mutation.log 2>&1; echo "rc=$?"
grep -E "^\[  FAILED|^\[  PASSED|^\[       OK" $out/mutation.log | tail -12
echo "== model gpu tests (all)"
timeout 150 ./kvp_model_gpu_tests > $out/model_tests.log 2>&1; echo "rc=$?"
grep -E "int8 kv|PASSED|FAILED" $out/model_tests.log | tail -12
echo "== bench"
timeout 150 ./attention_cuda_bench $out/bench.csv --kv bf16,int8 --kinds decode,prefill,decode_block > $out/bench.log 2>&1; echo "rc=$?"
cat $out/bench.log
echo "== sanitizers"
f='PagedAttentionInt8Matrix.*block16_d*_gqa4_q3:PagedAttentionInt8Matrix.*block32_d64_gqa1_q64:PagedAttention.Int8Mixed*:PagedAttention.Int8Window*:CudaKvPool.Int8*'
{ for tool in memcheck racecheck; do echo "---- $tool"; timeout 60 compute-sanitizer --tool $tool --error-exitcode 9 ./kvp_backend_gpu_tests --gtest_filter="$f" --gtest_brief=1 2>&1; echo "rc=$?"; done; } > $out/sanitizer.log 2>&1
grep -E "ERROR SUMMARY|RACECHECK SUMMARY|FAILED|PASSED|rc=" $out/sanitizer.log | tail -8
echo "== kvpool bench, random smollm2-135m, bf16 vs int8"
{ for kv in bf16 int8; do echo "---- $kv"; timeout 40 ./kvpool bench --random-model smollm2-135m --device cuda --kv-dtype $kv --requests 32 2>&1 | tail -25; echo "rc=$?"; done; } > $out/kvpool.log 2>&1
cat $out/kvpool.log | tail -60
echo "== regression: all other backend gpu tests"
timeout 100 ./kvp_backend_gpu_tests --gtest_filter='-*Int8*' --gtest_brief=1 > $out/other_tests.log 2>&1; echo "rc=$?"
tail -3 $out/other_tests.log
