#!/usr/bin/env bash
# Packs what scripts/gpu/engine-bench.sh needs from the cuda build into DEST/kvp-engine.tar.xz:
# kvpool, the model gpu tests and bench, their non-system libraries (not cuBLAS: see
# docs/cuda.md), the tiny fixtures and the scripts (engine-bench.sh, server-bench.sh).
set -euo pipefail
dest=${1:-/work/main/.gpu}
build=${KVP_BUILD:-build/cuda}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
mkdir -p "$tmp/lib" "$tmp/gpu" "$tmp/tests/model/fixtures" "$dest"
for b in apps/kvpool tests/kvp_model_gpu_tests tests/kvp_backend_gpu_tests \
         bench/model_cuda_bench bench/sampler_bench bench/attention_cuda_bench; do
  [ -x "$build/$b" ] || continue
  cp "$build/$b" "$tmp/"
  strip --strip-debug "$tmp/$(basename "$b")"
  ldd "$build/$b" | awk '/=> \// {print $3}' | while read -r lib; do
    case "$(basename "$lib")" in
      libc.so*|libm.so*|libgcc_s.so*|libstdc++.so*|ld-linux*|libpthread.so*|libdl.so*|librt.so*) ;;
      libcublas.so*|libcublasLt.so*|libcuda.so*) ;;
      *) cp -L "$lib" "$tmp/lib/" ;;
    esac
  done
done
cp -r tests/model/fixtures/tiny "$tmp/tests/model/fixtures/"
bash scripts/gpu/tiny-gguf.sh "$tmp"
cp scripts/gpu/engine-bench.sh scripts/gpu/server-bench.sh scripts/gpu/tp-bench.sh scripts/gpu/tier-bench.sh scripts/gpu/cuda-env.sh \
  scripts/gpu/kv8-bench.sh scripts/gpu/skinny-bench.sh scripts/gpu/moe-bench.sh \
  scripts/make_filler_tokenizer.py bench/server/compare_llama_server.py "$tmp/gpu/"
tar -cJf "$dest/kvp-engine.tar.xz" -C "$tmp" .
du -sh "$dest/kvp-engine.tar.xz"
