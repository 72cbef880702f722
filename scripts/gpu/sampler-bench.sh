#!/usr/bin/env bash
# GPU sampler (docs/perf/model-cuda.md, "GPU sampler"): sampler tests with the kernel timing,
# kvpool bench sampled vs greedy (8B and SmolLM2-135M shapes), a mutant, memcheck, racecheck.
# Packed by package-engine.sh into .gpu/sampler/kvp-engine.tar.xz (the mutant, if built, beside
# it as kvp_model_gpu_tests_mutant.xz); run from the checkout root: bash run.sh OUT
set -u
out=$1
src=$PWD/.gpu/sampler
mkdir -p /tmp/s && tar -xJf "$src/kvp-engine.tar.xz" -C /tmp/s
[ -f "$src/kvp_model_gpu_tests_mutant.xz" ] && xz -dc "$src/kvp_model_gpu_tests_mutant.xz" > /tmp/s/mutant && chmod +x /tmp/s/mutant
cd /tmp/s && source gpu/cuda-env.sh
nvidia-smi --query-gpu=name,memory.total,clocks.max.sm --format=csv > "$out/env.txt" 2>&1
echo "== sampler tests"
timeout 150 ./kvp_model_gpu_tests --gtest_filter='CudaSampler*' > "$out/tests.log" 2>&1; echo "rc $?" >> "$out/tests.log"
grep -E "^\[  (PASSED|FAILED)|FAILED|gpu sampler|agree|rc " "$out/tests.log" | head -40
b8="./kvpool bench --random-model llama3-8b --device cuda --block-size 16 --blocks 16384 --workload offline --requests 64 --prompt-tokens-min 256 --prompt-tokens-max 1024 --output-tokens-min 128 --output-tokens-max 128 --max-seqs 64 --step-tokens 4096"
for mode in greedy device cpu; do
  extra=""
  [ $mode = device ] && extra="--temperature 0.8 --top-p 0.95"
  [ $mode = cpu ] && extra="--temperature 0.8 --top-p 0.95 --cpu-sampling"
  echo "== 8B offline $mode"
  timeout 100 $b8 $extra > "$out/bench-8b-$mode.log" 2>&1; echo "rc $?" >> "$out/bench-8b-$mode.log"
  grep -iE "output tok/s|tok/s|TPOT|sampling|rc " "$out/bench-8b-$mode.log" | head -8
done
if [ -x ./mutant ]; then
  echo "== mutant (presence penalty dropped on the GPU)"
  timeout 60 ./mutant --gtest_filter='CudaSampler.Distribution*:CudaSampler.Penalties*:CudaSampler.SameUniform*' > "$out/mutant.log" 2>&1; echo "rc $?" >> "$out/mutant.log"
  grep -E "^\[  FAILED|^\[       OK|rc " "$out/mutant.log" | head -12
fi
echo "== memcheck"
timeout 90 compute-sanitizer --tool memcheck --error-exitcode 9 ./kvp_model_gpu_tests --gtest_filter='CudaSampler.Penalties*:CudaSampler.Logprobs*:CudaSampler.BadBatches*' > "$out/memcheck.log" 2>&1; echo "rc $?" >> "$out/memcheck.log"
tail -3 "$out/memcheck.log"
timeout 60 compute-sanitizer --tool racecheck --error-exitcode 9 ./kvp_model_gpu_tests --gtest_filter='CudaSampler.Penalties*' > "$out/racecheck.log" 2>&1; echo "rc $?" >> "$out/racecheck.log"
tail -3 "$out/racecheck.log"
bs="./kvpool bench --random-model smollm2-135m --device cuda --block-size 16 --blocks 16384 --workload offline --requests 64 --prompt-tokens-min 256 --prompt-tokens-max 1024 --output-tokens-min 128 --output-tokens-max 128 --max-seqs 64 --step-tokens 4096"
for mode in greedy device; do
  extra=""
  [ $mode = device ] && extra="--temperature 0.8 --top-p 0.95"
  echo "== smollm2 offline $mode"
  timeout 60 $bs $extra > "$out/bench-135m-$mode.log" 2>&1; echo "rc $?" >> "$out/bench-135m-$mode.log"
  grep -iE "output tok/s|TPOT|rc " "$out/bench-135m-$mode.log" | head -4
done
echo "== other model gpu tests"
timeout 120 ./kvp_model_gpu_tests --gtest_brief=1 --gtest_filter='-CudaSampler*' > "$out/other-tests.log" 2>&1; echo "rc $?" >> "$out/other-tests.log"
tail -4 "$out/other-tests.log"
cd "$out" && tar -czf logs.tgz ./*.log ./*.txt && rm -f ./*.log ./*.txt
