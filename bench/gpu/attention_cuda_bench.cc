// GPU benchmark of cuda::paged_attention (docs/perf/attention-cuda.md holds the numbers).
//
//   attention_cuda_bench OUT.csv [--quick] [--kv bf16,int8,fp8] [--kinds decode,prefill,...]
//
// --kv: KV dtypes to run each case with (default bf16). int8 and fp8 (e4m3) are the 8-bit pools of
// cache/kv_layout.h (q and out stay bf16); their bytes count the 8-bit rows and their f16 scales,
// what the kernels read. --kinds: case families to run (default all: decode, decode_block,
// prefill, prefill_portable, decode_split, decode_lanes, decode_tc, decode_small{,_tc,_lanes},
// decode_factor). prefill runs the library's choice of kernel (on an H100 the Hopper wgmma kernel,
// for bf16 KV); prefill_portable the same shapes on the portable mma.sync kernel, for a same-run
// comparison. decode runs the library's choice (DecodeKernel::Auto: the tensor-core kernel at
// head dim 128 but for short splits in one wave); decode_lanes / decode_tc the decode grid on the
// per-lane / tensor-core kernel; decode_small* batch {1,2,4,8} x context {256..2048} on each;
// decode_split and decode_factor the library's split-KV choice varied (fewest keys per split;
// the split count halved and doubled).
//
// Cases: decode 32 q / 8 KV heads, head dim 128, bf16, block 16, batch {1,16,64,256} x context
// {512,4096,16384}; decode against block size {16..256}; causal prefill, batch 1, length
// {2048,8192,32768}. Each case rotates over enough input sets (KV pool blocks, block tables, q,
// out; fresh random values) that one pass reads well over the 50 MB L2, and reports
//   graph_us : median over replays of a CUDA graph of many back-to-back calls, per call
//   eager_us : median of plainly launched back-to-back calls, per call
// beside the ceiling measured in the same run: device-to-device copy bandwidth (bytes read +
// written). The matmul ceiling comes from scripts/gpu/sdpa_peer.py (torch) in the same check.
// One fixed-format line per case on stdout, all of them in OUT.csv.
//
// (A .cc, not a .cu: nvcc's front end cannot compile fmt's consteval format strings, which
// backend/attention.h pulls in through common/status.h.)
#include <cuda_runtime_api.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <numeric>
#include <optional>
#include <random>
#include <string>
#include <vector>

#include "backend/attention.h"
#include "backend/cuda/device_buffer.h"
#include "backend/cuda/kernels.h"
#include "backend/cuda/paged_attention.h"

namespace kvp::cuda {
namespace {

#define BENCH_CHECK_CUDA(call)                                                  \
  do {                                                                          \
    const cudaError_t e = (call);                                               \
    if (e != cudaSuccess) {                                                     \
      std::fprintf(stderr, "%s:%d: %s failed: %s\n", __FILE__, __LINE__, #call, \
                   cudaGetErrorString(e));                                      \
      std::exit(1);                                                             \
    }                                                                           \
  } while (0)

void check_status(const Status& s, const char* what) {
  if (!s.is_ok()) {
    std::fprintf(stderr, "%s: %s\n", what, s.to_string().c_str());
    std::exit(1);
  }
}

template <typename T>
T value_or_die(Result<T> r, const char* what) {
  check_status(r.status(), what);
  return std::move(r).value();
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0.0 : v[v.size() / 2];
}

struct Timing {
  double graph_us = 0;
  double eager_us = 0;
};

// Times call(i) (i = rotation index) as described in the header comment.
Timing time_calls(const std::function<void(int, cudaStream_t)>& call, int num_sets,
                  cudaStream_t stream, bool quick) {
  cudaEvent_t start, stop;
  BENCH_CHECK_CUDA(cudaEventCreate(&start));
  BENCH_CHECK_CUDA(cudaEventCreate(&stop));
  for (int i = 0; i < num_sets; ++i) call(i, stream);  // warm-up, grows the workspace
  BENCH_CHECK_CUDA(cudaStreamSynchronize(stream));
  // one eager call sizes the batch of calls per timing (about 3 ms of work)
  BENCH_CHECK_CUDA(cudaEventRecord(start, stream));
  call(0, stream);
  BENCH_CHECK_CUDA(cudaEventRecord(stop, stream));
  BENCH_CHECK_CUDA(cudaEventSynchronize(stop));
  float one_ms = 0;
  BENCH_CHECK_CUDA(cudaEventElapsedTime(&one_ms, start, stop));
  int calls = static_cast<int>(std::ceil(3.0 / std::max(one_ms, 1e-4f)));
  calls = std::clamp(calls, num_sets, 512);
  calls = (calls + num_sets - 1) / num_sets * num_sets;
  const int repeats = quick ? 5 : 15;

  Timing t;
  std::vector<double> samples;
  for (int r = 0; r < repeats; ++r) {
    BENCH_CHECK_CUDA(cudaEventRecord(start, stream));
    for (int i = 0; i < calls; ++i) call(i % num_sets, stream);
    BENCH_CHECK_CUDA(cudaEventRecord(stop, stream));
    BENCH_CHECK_CUDA(cudaEventSynchronize(stop));
    float ms = 0;
    BENCH_CHECK_CUDA(cudaEventElapsedTime(&ms, start, stop));
    samples.push_back(1000.0 * ms / calls);
  }
  t.eager_us = median(samples);

  cudaGraph_t graph;
  cudaGraphExec_t exec;
  BENCH_CHECK_CUDA(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal));
  for (int i = 0; i < calls; ++i) call(i % num_sets, stream);
  BENCH_CHECK_CUDA(cudaStreamEndCapture(stream, &graph));
  BENCH_CHECK_CUDA(cudaGraphInstantiate(&exec, graph, 0));
  BENCH_CHECK_CUDA(cudaGraphLaunch(exec, stream));  // warm-up replay
  samples.clear();
  for (int r = 0; r < repeats; ++r) {
    BENCH_CHECK_CUDA(cudaEventRecord(start, stream));
    BENCH_CHECK_CUDA(cudaGraphLaunch(exec, stream));
    BENCH_CHECK_CUDA(cudaEventRecord(stop, stream));
    BENCH_CHECK_CUDA(cudaEventSynchronize(stop));
    float ms = 0;
    BENCH_CHECK_CUDA(cudaEventElapsedTime(&ms, start, stop));
    samples.push_back(1000.0 * ms / calls);
  }
  t.graph_us = median(samples);
  BENCH_CHECK_CUDA(cudaGraphExecDestroy(exec));
  BENCH_CHECK_CUDA(cudaGraphDestroy(graph));
  BENCH_CHECK_CUDA(cudaEventDestroy(start));
  BENCH_CHECK_CUDA(cudaEventDestroy(stop));
  return t;
}

// Device-to-device copy bandwidth, bytes read + written, GB/s.
double measure_copy_gbps(cudaStream_t stream) {
  const size_t bytes = size_t{2} << 30;
  DeviceBuffer a = value_or_die(DeviceBuffer::allocate(bytes), "copy src");
  DeviceBuffer b = value_or_die(DeviceBuffer::allocate(bytes), "copy dst");
  BENCH_CHECK_CUDA(detail::launch_fill_uniform(a.data(), true, bytes / 2, 1, -1, 1, stream));
  cudaEvent_t start, stop;
  BENCH_CHECK_CUDA(cudaEventCreate(&start));
  BENCH_CHECK_CUDA(cudaEventCreate(&stop));
  std::vector<double> gbps;
  for (int r = 0; r < 12; ++r) {
    BENCH_CHECK_CUDA(cudaEventRecord(start, stream));
    BENCH_CHECK_CUDA(cudaMemcpyAsync(b.data(), a.data(), bytes, cudaMemcpyDeviceToDevice, stream));
    BENCH_CHECK_CUDA(cudaEventRecord(stop, stream));
    BENCH_CHECK_CUDA(cudaEventSynchronize(stop));
    float ms = 0;
    BENCH_CHECK_CUDA(cudaEventElapsedTime(&ms, start, stop));
    if (r >= 2) gbps.push_back(2.0 * bytes / (ms * 1e-3) / 1e9);
  }
  BENCH_CHECK_CUDA(cudaEventDestroy(start));
  BENCH_CHECK_CUDA(cudaEventDestroy(stop));
  return median(gbps);
}

struct Shape {
  // "decode", "decode_block", "prefill", "prefill_portable", "decode_split", "decode_factor",
  // "decode_lanes", "decode_tc" or "decode_small" (+ "_tc", "_lanes")
  const char* kind;
  int32_t batch;
  int32_t ctx;    // kv_len of every sequence
  int32_t q_len;  // 1 (decode) or ctx (prefill)
  int32_t block_size;
  int32_t min_keys_per_split = 0;  // 0: the library's default
  float split_factor = 1.0f;       // decode_factor: set_decode_split_factor
  DType kv_dtype = DType::BF16;    // BF16, I8 or FP8
};

struct CaseResult {
  Timing timing;
  double bytes = 0;
  double flops = 0;
  int num_sets = 0;
};

constexpr int32_t kQHeads = 32, kKvHeads = 8, kHeadDim = 128;

CaseResult run_shape(const Shape& s, cudaStream_t stream, bool quick, uint64_t seed) {
  const int32_t blocks_per_seq = (s.ctx + s.block_size - 1) / s.block_size;
  const int64_t tokens = int64_t{s.batch} * s.q_len;
  // K and V of every key: D bf16 values, or D 8-bit codes and an f16 scale
  const double row_bytes = is_kv8(s.kv_dtype) ? kHeadDim + 2 : kHeadDim * 2;
  const double kv_bytes = double(s.batch) * s.ctx * kKvHeads * row_bytes * 2;
  const double q_bytes = double(tokens) * kQHeads * kHeadDim * 2;
  const double set_bytes = kv_bytes + 2 * q_bytes;
  const int num_sets = std::clamp(static_cast<int>(std::ceil(200e6 / set_bytes)), 2, 64);
  const int32_t num_blocks = num_sets * s.batch * blocks_per_seq;
  KvLayout layout{1, num_blocks, kKvHeads, s.block_size, kHeadDim, s.kv_dtype};
  DeviceBuffer slab = value_or_die(DeviceBuffer::allocate(layout.size_bytes()), "kv slab");
  // 8-bit: the slab's bytes filled as f16 values in [-1, 1) (bounded codes and scales)
  BENCH_CHECK_CUDA(detail::launch_fill_uniform(slab.data(), s.kv_dtype == DType::BF16,
                                               static_cast<int64_t>(layout.size_bytes() / 2), seed,
                                               -1, 1, stream));
  const PagedKv kv = paged_kv_for_layer(layout, slab.data(), 0);
  // shuffled block tables: set i, sequence b gets blocks order[(i*batch + b)*blocks_per_seq ...]
  std::vector<int32_t> order(num_blocks);
  std::iota(order.begin(), order.end(), 0);
  std::mt19937_64 rng(seed);
  std::shuffle(order.begin(), order.end(), rng);
  DeviceBuffer tables = value_or_die(DeviceBuffer::allocate(order.size() * 4), "tables");
  BENCH_CHECK_CUDA(
      cudaMemcpy(tables.data(), order.data(), order.size() * 4, cudaMemcpyHostToDevice));
  std::vector<int32_t> query_start(s.batch + 1), kv_lens(s.batch, s.ctx);
  for (int32_t b = 0; b <= s.batch; ++b) query_start[b] = b * s.q_len;
  DeviceBuffer d_start = value_or_die(DeviceBuffer::allocate(query_start.size() * 4), "start");
  DeviceBuffer d_lens = value_or_die(DeviceBuffer::allocate(kv_lens.size() * 4), "lens");
  BENCH_CHECK_CUDA(cudaMemcpy(d_start.data(), query_start.data(), query_start.size() * 4,
                              cudaMemcpyHostToDevice));
  BENCH_CHECK_CUDA(
      cudaMemcpy(d_lens.data(), kv_lens.data(), kv_lens.size() * 4, cudaMemcpyHostToDevice));
  const int64_t q_elems = tokens * kQHeads * kHeadDim;
  DeviceBuffer q = value_or_die(DeviceBuffer::allocate(num_sets * q_elems * 2), "q");
  DeviceBuffer out = value_or_die(DeviceBuffer::allocate(num_sets * q_elems * 2), "out");
  BENCH_CHECK_CUDA(
      detail::launch_fill_uniform(q.data(), true, num_sets * q_elems, seed + 1, -2, 2, stream));
  BENCH_CHECK_CUDA(cudaStreamSynchronize(stream));

  AttentionParams params;
  params.num_q_heads = kQHeads;
  params.scale = 1.0f / std::sqrt(float(kHeadDim));
  AttentionBatch batch;
  batch.num_seqs = s.batch;
  batch.num_tokens = static_cast<int32_t>(tokens);
  batch.query_start = d_start.as<int32_t>();
  batch.kv_lens = d_lens.as<int32_t>();
  batch.max_blocks_per_seq = blocks_per_seq;
  batch.max_q_len = s.q_len;
  batch.max_kv_len = s.ctx;
  AttentionWorkspace workspace;
  auto call = [&](int set, cudaStream_t st) {
    AttentionBatch b = batch;
    b.block_tables = tables.as<int32_t>() + int64_t{set} * s.batch * blocks_per_seq;
    const Status status =
        paged_attention(params, b, kv, q.as<uint16_t>() + set * q_elems, DType::BF16,
                        out.as<uint16_t>() + set * q_elems, workspace, st);
    check_status(status, "paged_attention");
  };
  CaseResult r;
  r.timing = time_calls(call, num_sets, stream, quick);
  r.num_sets = num_sets;
  r.bytes = kv_bytes + 2 * q_bytes;
  // causal: query t of a sequence sees ctx - q_len + t + 1 keys; 4 * D flops per (query, key)
  double pairs = 0;
  for (int64_t t = 0; t < s.q_len; ++t) pairs += double(s.ctx - s.q_len + t + 1);
  r.flops = 4.0 * kHeadDim * kQHeads * s.batch * pairs;
  return r;
}

const char* kv_name(DType dtype) { return dtype_name(dtype).data(); }

// Comma-separated list as strings.
std::vector<std::string> split_list(const std::string& list) {
  std::vector<std::string> items;
  size_t pos = 0;
  while (pos <= list.size()) {
    const size_t comma = std::min(list.find(',', pos), list.size());
    if (comma > pos) items.push_back(list.substr(pos, comma - pos));
    pos = comma + 1;
  }
  return items;
}

int bench_main(int argc, char** argv) {
  const char* usage =
      "usage: %s OUT.csv [--quick] [--kv bf16,int8,fp8] [--kinds decode,prefill] [--ctx "
      "8192,...]\n";
  if (argc < 2) {
    std::fprintf(stderr, usage, argv[0]);
    return 2;
  }
  bool quick = false;
  std::vector<DType> kv_dtypes = {DType::BF16};
  std::vector<std::string> kinds;  // empty: all
  std::vector<int32_t> ctxs;       // empty: all (one length under a profiler, say)
  for (int i = 2; i < argc; ++i) {
    const std::string arg = argv[i];
    if (arg == "--quick") {
      quick = true;
    } else if (arg == "--kv" && i + 1 < argc) {
      kv_dtypes.clear();
      for (const std::string& name : split_list(argv[++i])) {
        const std::optional<DType> dtype = parse_kv_cache_dtype(name);
        if (!dtype || (*dtype != DType::BF16 && !is_kv8(*dtype))) {
          std::fprintf(stderr, "--kv: %s (bf16, int8 or fp8)\n", name.c_str());
          return 2;
        }
        kv_dtypes.push_back(*dtype);
      }
    } else if (arg == "--kinds" && i + 1 < argc) {
      kinds = split_list(argv[++i]);
    } else if (arg == "--ctx" && i + 1 < argc) {
      for (const std::string& item : split_list(argv[++i])) {
        const long n = std::strtol(item.c_str(), nullptr, 10);
        if (n <= 0 || n > (1 << 20)) {
          std::fprintf(stderr, "--ctx: %s (a context length, 1 to 1048576)\n", item.c_str());
          return 2;
        }
        ctxs.push_back(static_cast<int32_t>(n));
      }
    } else {
      std::fprintf(stderr, usage, argv[0]);
      return 2;
    }
  }
  cudaDeviceProp prop;
  BENCH_CHECK_CUDA(cudaGetDeviceProperties(&prop, 0));
  cudaStream_t stream;
  BENCH_CHECK_CUDA(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  const double copy_gbps = measure_copy_gbps(stream);
  std::printf("gpu %s, %d SMs, L2 %d MB\n", prop.name, prop.multiProcessorCount,
              prop.l2CacheSize >> 20);
  std::printf("ceiling copy_GBps=%.0f (device-to-device, read + write)\n", copy_gbps);
  FILE* csv = std::fopen(argv[1], "w");
  if (csv == nullptr) {
    std::fprintf(stderr, "cannot write %s\n", argv[1]);
    return 1;
  }
  std::fprintf(csv,
               "kind,batch,ctx,q_len,block,min_keys,graph_us,eager_us,bytes,flops,gbps,frac_copy,"
               "tflops,sets,copy_gbps,kv\n");
  std::vector<Shape> all_shapes;
  for (int32_t b : {1, 16, 64, 256}) {
    for (int32_t ctx : {512, 4096, 16384}) all_shapes.push_back({"decode", b, ctx, 1, 16});
  }
  for (int32_t b : {1, 16, 64, 256}) {
    for (int32_t ctx : {512, 4096, 16384}) all_shapes.push_back({"decode_lanes", b, ctx, 1, 16});
  }
  for (int32_t b : {1, 16, 64, 256}) {
    for (int32_t ctx : {512, 4096, 16384}) all_shapes.push_back({"decode_tc", b, ctx, 1, 16});
  }
  // small decode calls, where Auto chooses between the two kernels, on each of the three settings
  for (const char* kind : {"decode_small", "decode_small_tc", "decode_small_lanes"}) {
    for (int32_t b : {1, 2, 4, 8}) {
      for (int32_t ctx : {256, 512, 1024, 2048}) all_shapes.push_back({kind, b, ctx, 1, 16});
    }
  }
  for (int32_t bs : {16, 32, 64, 128, 256}) {
    all_shapes.push_back({"decode_block", 16, 4096, 1, bs});
    all_shapes.push_back({"decode_block", 1, 16384, 1, bs});
  }
  for (int32_t len : {2048, 8192, 32768}) all_shapes.push_back({"prefill", 1, len, len, 16});
  for (int32_t len : {2048, 8192, 32768}) {
    all_shapes.push_back({"prefill_portable", 1, len, len, 16});
  }
  // decode split policy (variants of the fewest keys per split; the default is 32)
  for (int32_t min_keys : {64, 128, 256}) {
    for (int32_t b : {1, 16}) {
      for (int32_t ctx : {512, 4096, 16384}) {
        all_shapes.push_back({"decode_split", b, ctx, 1, 16, min_keys});
      }
    }
  }
  // decode split counts scaled (halved, doubled) from the library's choice
  for (float factor : {0.5f, 2.0f}) {
    for (int32_t b : {1, 16, 64}) {
      for (int32_t ctx : {512, 4096, 16384}) {
        all_shapes.push_back({"decode_factor", b, ctx, 1, 16, 0, factor});
      }
    }
  }
  // each selected case once per KV dtype, the dtypes side by side
  std::vector<Shape> shapes;
  for (const Shape& shape : all_shapes) {
    if (!kinds.empty() && std::find(kinds.begin(), kinds.end(), shape.kind) == kinds.end()) {
      continue;
    }
    if (!ctxs.empty() && std::find(ctxs.begin(), ctxs.end(), shape.ctx) == ctxs.end()) continue;
    for (const DType dtype : kv_dtypes) {
      Shape s = shape;
      s.kv_dtype = dtype;
      shapes.push_back(s);
    }
  }
  uint64_t seed = 12345;
  for (const Shape& s : shapes) {
    set_decode_min_keys_per_split(s.min_keys_per_split);
    set_decode_split_factor(s.split_factor);
    set_prefill_kernel(std::strcmp(s.kind, "prefill_portable") == 0 ? PrefillKernel::Portable
                                                                    : PrefillKernel::Auto);
    const std::string kind = s.kind;
    const auto ends_with = [&kind](const std::string& tail) {
      return kind.size() > tail.size() &&
             kind.compare(kind.size() - tail.size(), tail.size(), tail) == 0;
    };
    set_decode_kernel(ends_with("_lanes") ? DecodeKernel::Lanes
                      : ends_with("_tc")  ? DecodeKernel::TensorCores
                                          : DecodeKernel::Auto);
    const CaseResult r = run_shape(s, stream, quick, seed += 101);
    const double gbps = r.bytes / (r.timing.graph_us * 1e-6) / 1e9;
    const double tflops = r.flops / (r.timing.graph_us * 1e-6) / 1e12;
    std::printf(
        "%-12s kv=%-4s batch=%-3d ctx=%-5d q_len=%-5d block=%-3d graph_us=%9.2f eager_us=%9.2f "
        "GBps=%6.0f frac_copy=%.3f TFLOPs=%6.1f sets=%d%s\n",
        s.kind, kv_name(s.kv_dtype), s.batch, s.ctx, s.q_len, s.block_size, r.timing.graph_us,
        r.timing.eager_us, gbps, gbps / copy_gbps, tflops, r.num_sets,
        s.split_factor != 1.0f ? (s.split_factor < 1.0f ? " splits/2" : " splits*2") : "");
    std::fprintf(csv, "%s,%d,%d,%d,%d,%d,%.3f,%.3f,%.0f,%.0f,%.1f,%.4f,%.2f,%d,%.0f,%s\n", s.kind,
                 s.batch, s.ctx, s.q_len, s.block_size, s.min_keys_per_split, r.timing.graph_us,
                 r.timing.eager_us, r.bytes, r.flops, gbps, gbps / copy_gbps, tflops, r.num_sets,
                 copy_gbps, kv_name(s.kv_dtype));
    std::fflush(stdout);
    std::fflush(csv);
  }
  std::fclose(csv);
  BENCH_CHECK_CUDA(cudaStreamDestroy(stream));
  return 0;
}

}  // namespace
}  // namespace kvp::cuda

int main(int argc, char** argv) { return kvp::cuda::bench_main(argc, argv); }
