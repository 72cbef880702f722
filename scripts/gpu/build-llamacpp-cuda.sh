#!/usr/bin/env bash
# Builds llama.cpp's CUDA peer (llama-bench, llama-batched-bench) here, for sm_90a, and packs it
# for the GPU machine: DEST/llamacpp-cuda.tar.xz with bin/ (the two tools) and lib/ (libggml*,
# libllama*, libmtmd if linked, and the CUDA runtime and libgomp they load). ~27 minutes on the
# 2-core machine. The source is the llama-cpp-python sdist's vendor/llama.cpp (commit 0c1e570 for
# 0.3.36; /work/shared/PEERS.md), fetched as bench/cpu/compare_llamacpp.sh does when absent.
#   bash scripts/gpu/build-llamacpp-cuda.sh DEST [LLAMA_DIR]
# Then there: scripts/gpu/llamacpp-peer.sh (see its header).
set -euo pipefail
dest=${1:?usage: build-llamacpp-cuda.sh DEST [LLAMA_DIR]}
version=0.3.36
src=${2:-/work/peers/llama_cpp_python-$version/vendor/llama.cpp}
if [ ! -d "$src" ]; then
  peers=$(dirname "$(dirname "$(dirname "$src")")")
  mkdir -p "$peers"
  python3 -m pip download --no-deps --no-binary :all: "llama-cpp-python==$version" -d "$peers"
  tar xzf "$peers/llama_cpp_python-$version.tar.gz" -C "$peers"
fi
# the final link wants libcuda.so.1: the toolkit's stub stands in for it here
stub=$(mktemp -d)
trap 'rm -rf "$stub"' EXIT
ln -s /usr/local/cuda/lib64/stubs/libcuda.so "$stub/libcuda.so.1"
export LD_LIBRARY_PATH="$stub:${LD_LIBRARY_PATH:-}"
cmake -S "$src" -B "$src/build-cuda" -G Ninja -DGGML_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=90a \
  -DLLAMA_CURL=OFF -DGGML_NATIVE=OFF -DLLAMA_OPENSSL=OFF -DLLAMA_BUILD_TESTS=OFF \
  -DLLAMA_BUILD_EXAMPLES=OFF -DGGML_CUDA_NCCL=OFF -DCMAKE_BUILD_TYPE=Release
cmake --build "$src/build-cuda" -j"$(nproc)" --target llama-bench llama-batched-bench
pack=$(mktemp -d)
mkdir -p "$pack/bin" "$pack/lib" "$dest"
cp "$src/build-cuda/bin/llama-bench" "$src/build-cuda/bin/llama-batched-bench" "$pack/bin/"
for b in "$pack"/bin/*; do
  ldd "$b" | awk '/=> \// {print $3}' | while read -r lib; do
    case "$(basename "$lib")" in
      libggml*|libllama*|libmtmd*|libcudart.so*|libgomp.so*) cp -L "$lib" "$pack/lib/" ;;
    esac
  done
done
strip --strip-unneeded "$pack"/bin/* "$pack"/lib/* 2>/dev/null || true
tar -C "$pack" -cf - . | xz -T2 -6 > "$dest/llamacpp-cuda.tar.xz"
rm -rf "$pack"
du -sh "$dest/llamacpp-cuda.tar.xz"
