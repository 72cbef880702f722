#!/usr/bin/env bash
# A mutant of the GPU sampler (the presence penalty dropped on the device) linked into a copy of
# kvp_model_gpu_tests, xz-packed into DEST for scripts/gpu/sampler-bench.sh: the sampler tests
# must fail with it. Run from the checkout root after the cuda build.
set -euo pipefail
dest=${1:?usage: build-sampler-mutant.sh DEST}
root=$PWD
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
sed 's/l -= req.presence_penalty + req.frequency_penalty/l -= 0.0f * req.presence_penalty + req.frequency_penalty/' \
  src/model/cuda/sampler_kernels.cu > "$tmp/sampler_kernels.cu"
grep -q "0.0f \* req.presence_penalty" "$tmp/sampler_kernels.cu"
/usr/local/cuda/bin/nvcc -DFMT_SHARED -DKVP_HAVE_CUDA=1 -DKVP_HAVE_CUDA_MODEL=1 -I"$root/src" -O3 \
  -DNDEBUG --generate-code=arch=compute_90,code=[compute_90,sm_90] -std=c++17 \
  --expt-relaxed-constexpr -c "$tmp/sampler_kernels.cu" -o "$tmp/sampler_kernels.cu.o"
cp build/cuda/libkvp_model.a "$tmp/libkvp_model.a"
ar r "$tmp/libkvp_model.a" "$tmp/sampler_kernels.cu.o"
cd build/cuda/tests
link=$(cat CMakeFiles/kvp_model_gpu_tests.dir/link.txt)
link=${link//..\/libkvp_model.a/$tmp/libkvp_model.a}
link=${link//-o kvp_model_gpu_tests /-o $tmp/mutant }
eval "$link"
strip --strip-debug "$tmp/mutant"
xz -T2 -c "$tmp/mutant" > "$root/$dest/kvp_model_gpu_tests_mutant.xz"
