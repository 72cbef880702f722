#!/usr/bin/env bash
# Copies what scripts/gpu-check.sh needs from the cuda build into DEST (default
# /work/main/.gpu): the gpu test and bench binaries, the non-system shared libraries they load
# (per ldd), the check scripts and the tiny model fixtures. Then on the GPU machine:
#   mkdir -p /tmp/kvp && tar -xJf DEST/kvp-gpu.tar.xz -C /tmp/kvp && cd /tmp/kvp &&
#   KVP_GPU_BIN=/tmp/kvp KVP_GPU_LIB=/tmp/kvp/lib bash /tmp/kvp/gpu-check.sh OUTDIR
# (the package carries the tiny model fixtures, so it runs from any folder)
# DEST holds only kvp-gpu.tar.xz (binaries with sm_90 + sm_80 code are ~15 MB each; xz keeps the
# package well under the device tool's 64 MiB).
# cuBLAS is not bundled: this toolkit has no static cuBLAS and libcublasLt.so alone is ~540 MB;
# gpu-check.sh finds the GPU machine's own libcublas.so.13 (CUDA toolkit or the nvidia-cublas
# Python wheel).
set -euo pipefail
dest=${1:-/work/main/.gpu}
build=${KVP_BUILD:-build/cuda}
# KVP_BINS (space-separated, relative to the build) packs fewer, e.g. for gpu/prefill-bench.sh:
#   KVP_BINS="tests/kvp_backend_gpu_tests bench/attention_cuda_bench"
read -r -a bins <<< "${KVP_BINS:-tests/kvp_backend_gpu_tests tests/kvp_model_gpu_tests bench/attention_cuda_bench bench/model_cuda_bench}"
final=$dest
dest=$(mktemp -d)
trap 'rm -rf "$dest"' EXIT
mkdir -p "$dest/lib" "$dest/gpu"
for b in "${bins[@]}"; do
  cp "$build/$b" "$dest/"
  strip --strip-debug "$dest/$(basename "$b")"
done
cp scripts/gpu-check.sh "$dest/"
# the model tests read their fixtures relative to the working directory: run from DEST's copy
mkdir -p "$dest/tests/model/fixtures"
cp -r tests/model/fixtures/tiny "$dest/tests/model/fixtures/"
bash scripts/gpu/tiny-gguf.sh "$dest"
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
rm -rf "$final"
mkdir -p "$final"
tar -C "$dest" -cf - . | xz -T2 -6 > "$final/kvp-gpu.tar.xz"
du -sh "$final/kvp-gpu.tar.xz"
