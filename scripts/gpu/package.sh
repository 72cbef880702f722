#!/usr/bin/env bash
# Copies what scripts/gpu-check.sh needs from the cuda build into DEST (default
# /work/main/.gpu): the gpu test and bench binaries, the non-system shared libraries they load
# (per ldd), and the check scripts. Then on the GPU machine:
#   KVP_GPU_BIN=DEST KVP_GPU_LIB=DEST/lib bash DEST/gpu-check.sh OUTDIR
set -euo pipefail
dest=${1:-/work/main/.gpu}
build=${KVP_BUILD:-build/cuda}
rm -rf "$dest"
mkdir -p "$dest/lib" "$dest/gpu"
cp "$build/tests/kvp_backend_gpu_tests" "$build/bench/attention_cuda_bench" "$dest/"
strip --strip-debug "$dest/kvp_backend_gpu_tests" "$dest/attention_cuda_bench"
cp scripts/gpu-check.sh "$dest/"
cp scripts/gpu/*.py "$dest/gpu/"
# bundle every library outside libc/libm/libgcc/libstdc++/the loader
for b in "$dest/kvp_backend_gpu_tests" "$dest/attention_cuda_bench"; do
  ldd "$b" | awk '/=> \// {print $3}' | while read -r lib; do
    case "$(basename "$lib")" in
      libc.so*|libm.so*|libgcc_s.so*|libstdc++.so*|ld-linux*|libpthread.so*|libdl.so*|librt.so*) ;;
      *) cp -L "$lib" "$dest/lib/" ;;
    esac
  done
done
du -sh "$dest"
