#!/usr/bin/env bash
# device call 2 (2026-12-07, fourth session): the model GPU tests on main after the reverts (call 1's
# build crashed in them), with a backtrace if they crash again; the decode routing test at 64 keys
set -u
rm -rf /tmp/kvp; mkdir -p /tmp/kvp && tar -xJf .gpu/s5/kvp-gpu.tar.xz -C /tmp/kvp
cd /tmp/kvp
source gpu/cuda-env.sh 2>/dev/null
export LD_LIBRARY_PATH=/tmp/kvp/lib:${LD_LIBRARY_PATH:-}
log=$OUT/run.log
{ date -u; nvidia-smi --query-gpu=name,clocks.max.sm --format=csv; } > $log 2>&1
echo "== model gpu tests secs=$SECONDS" >> $log
timeout 200 ./kvp_model_gpu_tests > $OUT/model-tests.log 2>&1; rc=$?; echo "model tests rc=$rc secs=$SECONDS" >> $log
grep -E "^\[  (FAILED|PASSED|SKIPPED) |^\[==========\]" $OUT/model-tests.log | tail -12 >> $log
if [ $rc -ne 0 ]; then
  last=$(grep -E "^\[ RUN      \]" $OUT/model-tests.log | tail -1 | awk '{print $4}')
  echo "last test started: $last" >> $log; tail -15 $OUT/model-tests.log >> $log
  dbg=$(command -v gdb || command -v cuda-gdb)
  echo "debugger: $dbg" >> $log
  [ -n "$dbg" ] && timeout 120 $dbg -batch -ex run -ex bt --args ./kvp_model_gpu_tests --gtest_filter="$last" > $OUT/bt.log 2>&1
  grep -A25 "SIGSEGV\|signal" $OUT/bt.log | head -40 >> $log
fi
echo "== routing and decode tests secs=$SECONDS" >> $log
timeout 120 ./kvp_backend_gpu_tests --gtest_filter='PagedAttention.Auto*:PagedAttention.TensorCore*:PagedAttention.*Decode*' --gtest_brief=1 >> $log 2>&1; echo "rc=$? secs=$SECONDS" >> $log
echo "end secs=$SECONDS" >> $log
cat $log
