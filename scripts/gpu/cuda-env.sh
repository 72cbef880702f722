# Sourced by the scripts that run the packaged kvpool on the GPU machine (engine-bench.sh,
# server-bench.sh), from the package's root: the bundled libraries, then cuBLAS from the CUDA
# toolkit or, where it has none, from the nvidia-cublas Python wheel (docs/cuda.md).
export LD_LIBRARY_PATH="$PWD/lib:${LD_LIBRARY_PATH:-}"
for d in /usr/local/cuda/lib64 /usr/local/cuda/targets/x86_64-linux/lib; do
  [ -e "$d/libcublas.so.13" ] && { export LD_LIBRARY_PATH="$d:$LD_LIBRARY_PATH"; break; }
done
if ! ldd ./kvpool | grep -q "libcublas.so.13 => /"; then
  site=$(python3 -c 'import nvidia, os; print(os.path.dirname(nvidia.__path__[0]))' 2>/dev/null)
  [ -n "$site" ] && export LD_LIBRARY_PATH="$(dirname "$(find "$site" -name 'libcublas.so.13' | head -1)"):$LD_LIBRARY_PATH"
fi
# NCCL (tensor parallelism only; kvpool dlopens it): the toolkit's, else the nvidia-nccl wheel's
for d in /usr/local/cuda/lib64 /usr/local/cuda/targets/x86_64-linux/lib; do
  [ -e "$d/libnccl.so.2" ] && { export KVP_NCCL_LIBRARY="$d/libnccl.so.2"; break; }
done
if [ -z "${KVP_NCCL_LIBRARY:-}" ]; then
  site=$(python3 -c 'import nvidia, os; print(os.path.dirname(nvidia.__path__[0]))' 2>/dev/null)
  nccl=$([ -n "$site" ] && find "$site" -name 'libnccl.so.2' | head -1)
  [ -n "$nccl" ] && export KVP_NCCL_LIBRARY="$nccl"
fi
export NCCL_NVLS_ENABLE=0  # NVLink multicast off, as the GPU machines require
