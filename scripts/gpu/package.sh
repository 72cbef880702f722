#!/usr/bin/env bash
# Copies what scripts/gpu-check.sh needs from the cuda build into DEST (default
# /work/main/.gpu): the gpu test and bench binaries, the non-system shared libraries they load
# (per ldd), and the check scripts. Then on the GPU machine, from the repository root (the model
# tests read tests/model/fixtures/):
#   KVP_GPU_BIN=DEST KVP_GPU_LIB=DEST/lib bash DEST/gpu-check.sh OUTDIR
# cuBLAS is not bundled: this toolkit has no static cuBLAS and libcublasLt.so alone is ~540 MB;
# gpu-check.sh finds the GPU machine's own libcublas.so.13 (CUDA toolkit or the nvidia-cublas
# Python wheel).
set -euo pipefail
dest=${1:-/work/main/.gpu}
build=${KVP_BUILD:-build/cuda}
bins=(tests/kvp_backend_gpu_tests tests/kvp_model_gpu_tests bench/attention_cuda_bench
      bench/model_cuda_bench)
rm -rf "$dest"
mkdir -p "$dest/lib" "$dest/gpu"
for b in "${bins[@]}"; do
  cp "$build/$b" "$dest/"
  strip --strip-debug "$dest/$(basename "$b")"
done
cp scripts/gpu-check.sh "$dest/"
cp scripts/gpu/*.py scripts/gpu/*.sh "$dest/gpu/"
# bundle every library outside libc/libm/libgcc/libstdc++/the loader and cuBLAS
for b in "${bins[@]}"; do
  ldd "$dest/$(basename "$b")" | awk '/=> \// {print $3}' | while read -r lib; do
    case "$(basename "$lib")" in
      libc.so*|libm.so*|libgcc_s.so*|libstdc++.so*|ld-linux*|libpthread.so*|libdl.so*|librt.so*) ;;
      libcublas.so*|libcublasLt.so*) ;;
      *) cp -L "$lib" "$dest/lib/" ;;
    esac
  done
done
du -sh "$dest"
