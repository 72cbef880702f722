// CPU paged attention benchmark: decode (q_len 1) and prefill (q_len 512 on a 4K prefix) with
// Llama 3.1 8B attention geometry (32 query heads, 8 KV heads, head dim 128, block size 16).
// Decode reports KV bytes read per second against a memory-copy ceiling (memcpy over buffers far
// larger than the LLC, bytes read + written, all threads); prefill reports GFLOP/s against an f32
// FMA ceiling (register-only multiply-adds, all threads). Both ceilings are measured at the start
// and again just before each case (the line's percentage uses the latter: on a shared machine the
// ceiling drifts). Inputs rotate through a pool far larger than the LLC so every call streams KV
// from memory. Times are medians over repetitions.
//
// Variants (--variant, default "1,2"): 1 = cpu::paged_attention_scalar (one query row at a time,
// scalar, what the fast path replaced), 2 = cpu::paged_attention (Highway, tiled, split KV),
// 3 = variant 2 without its software prefetch (to measure what the prefetch buys), 4 = variant 2
// widening bf16 KV with PromoteTo instead of in paired order (to measure what pairing buys).
//
//   attention_cpu_bench [--variant 1,2,3,4] [--threads N] [--kv bf16,f32,f16,int8,fp8] [--batch
//   1,8,32]
//                       [--ctx 512,4096,16384] [--no-decode] [--no-prefill] [--min-time S]
//                       [--rotate-mb MB] [--tile-rows N] [--csv FILE]
// --rotate-mb (default 512) sets the KV footprint the calls rotate through; a small value keeps
// the KV in cache, which shows the kernel's compute-bound speed. --tile-rows sets
// cpu::AttentionTuning::tile_rows (query rows per KV head per tile).

#include <fmt/format.h>
#include <sys/mman.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <numeric>
#include <random>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include "backend/attention.h"
#include "backend/cpu_attention.h"
#include "backend/cpu_probe.h"
#include "cache/kv_quant.h"
#include "common/thread_pool.h"

namespace kvp::bench {
namespace {

constexpr int32_t kNumQHeads = 32;
constexpr int32_t kNumKvHeads = 8;
constexpr int32_t kHeadDim = 128;
constexpr int32_t kBlockSize = 16;

using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point start) {
  return std::chrono::duration<double>(Clock::now() - start).count();
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n % 2 == 1 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

// Runs fn until min_time seconds and at least min_reps repetitions have passed (after one
// warm-up call); returns the median seconds per call.
// A warm-up call slower than 4 * min_time is taken as the only sample (the scalar variant on
// large cases), so the whole matrix stays runnable.
template <typename Fn>
double time_median(double min_time, int min_reps, Fn&& fn) {
  const auto warm_up = Clock::now();
  fn();
  const double warm_up_seconds = seconds_since(warm_up);
  if (warm_up_seconds >= 4 * min_time) return warm_up_seconds;
  std::vector<double> times;
  const auto start = Clock::now();
  while (static_cast<int>(times.size()) < min_reps || seconds_since(start) < min_time) {
    const auto t0 = Clock::now();
    fn();
    times.push_back(seconds_since(t0));
    if (times.size() >= 20000) break;
  }
  return median(times);
}

// Random-ish values in [-1, 1) of dtype t, fast enough for gigabytes.
void fill_fast(void* data, DType t, size_t count, uint64_t seed) {
  uint64_t x = seed * 0x9E3779B97F4A7C15ull + 1;
  for (size_t i = 0; i < count; ++i) {
    x ^= x << 13;
    x ^= x >> 7;
    x ^= x << 17;
    const float f = static_cast<float>(x >> 40) * (2.0f / 16777216.0f) - 1.0f;
    store_from_f32(data, t, i, f);
  }
}

// 8-bit KV: random codes (int8 in [-127, 127]; fp8: every e4m3 code but the NaNs) and every
// row's scale 1 / kv8_max_value (a finite f16).
void fill_kv8(const KvLayout& layout, std::byte* slab) {
  uint64_t x = 0x9E3779B97F4A7C15ull;
  for (int64_t i = 0; i < layout.size_elems(); ++i) {
    x ^= x << 13;
    x ^= x >> 7;
    x ^= x << 17;
    auto code = static_cast<uint8_t>(static_cast<int8_t>(int64_t(x >> 40) % 255 - 127));
    if (layout.dtype == DType::FP8 && (code & 0x7fu) == 0x7fu) code ^= 1u;  // not NaN
    slab[i] = static_cast<std::byte>(code);
  }
  const F16 scale = f32_to_f16(1.0f / kv8_max_value(layout.dtype));
  for (int32_t layer = 0; layer < layout.num_layers; ++layer) {
    for (int32_t block = 0; block < layout.num_blocks; ++block) {
      for (int32_t kv = 0; kv < 2; ++kv) {
        for (int32_t head = 0; head < layout.num_kv_heads; ++head) {
          for (int32_t token = 0; token < layout.block_size; ++token) {
            std::memcpy(slab + layout.scale_offset(layer, block, kv, head, token), &scale,
                        sizeof scale);
          }
        }
      }
    }
  }
}

// The memory ceiling: every thread memcpy's its share of a buffer far larger than the LLC.
class CopyProbe {
 public:
  CopyProbe() : src_(new char[kBytes]), dst_(new char[kBytes]) {
    std::memset(src_.get(), 1, kBytes);
    std::memset(dst_.get(), 2, kBytes);
  }
  // Bytes read + written per second, median over at least 5 copies.
  double measure_gbps(ThreadPool& pool, double min_time) {
    const int threads = pool.num_threads();
    const double seconds = time_median(min_time, 5, [&] {
      pool.parallel_for(threads, [&](int64_t item, int) {
        const size_t share = kBytes / size_t(threads);
        std::memcpy(dst_.get() + size_t(item) * share, src_.get() + size_t(item) * share, share);
      });
    });
    return 2.0 * double(kBytes) / seconds / 1e9;
  }

 private:
  static constexpr size_t kBytes = size_t{1} << 30;  // 1 GiB source, 1 GiB destination
  std::unique_ptr<char[]> src_;
  std::unique_ptr<char[]> dst_;
};

double measure_fma_gflops(ThreadPool& pool, double min_time) {
  const int64_t iterations = 50'000'000;
  std::vector<float> sink(size_t(pool.num_threads()));
  const double seconds = time_median(min_time, 3, [&] {
    pool.parallel_for(pool.num_threads(),
                      [&](int64_t item, int) { sink[size_t(item)] = cpu::fma_probe(iterations); });
  });
  if (std::accumulate(sink.begin(), sink.end(), 0.0f) == 12345.0f) std::puts("");
  const double flops =
      2.0 * 8 * double(cpu::fma_probe_lanes()) * double(iterations) * pool.num_threads();
  return flops / seconds / 1e9;
}

// One decode or prefill case: sequences of equal shape, a KV pool rotated through in sets.
class Case {
 public:
  // rotation_bytes: KV footprint the calls rotate through (>> LLC streams from memory).
  Case(DType kv_dtype, int32_t batch, int32_t q_len, int32_t kv_len, size_t rotation_bytes)
      : q_len_(q_len) {
    const int32_t blocks_per_seq = (kv_len + kBlockSize - 1) / kBlockSize;
    const int32_t blocks_per_set = blocks_per_seq * batch;
    const KvLayout one_block{1, 1, kNumKvHeads, kBlockSize, kHeadDim, kv_dtype};
    const size_t set_bytes = size_t(blocks_per_set) * one_block.size_bytes();
    num_sets_ = static_cast<int32_t>(std::max<size_t>(1, rotation_bytes / set_bytes));
    layout_ = KvLayout{1, blocks_per_set * num_sets_, kNumKvHeads, kBlockSize, kHeadDim, kv_dtype};
    // 2 MiB-aligned and madvised for transparent huge pages, as a serving pool would be: blocks
    // are scattered, and with 4 KiB pages every block costs a TLB miss.
    const size_t huge = size_t{2} << 20;
    const size_t slab_bytes = (layout_.size_bytes() + huge - 1) / huge * huge;
    slab_.reset(static_cast<std::byte*>(std::aligned_alloc(huge, slab_bytes)));
    if (slab_ == nullptr) {
      std::fprintf(stderr, "cannot allocate a %zu-byte KV pool\n", slab_bytes);
      std::exit(1);
    }
    madvise(slab_.get(), slab_bytes, MADV_HUGEPAGE);
    if (is_kv8(kv_dtype)) {
      fill_kv8(layout_, slab_.get());
    } else {
      fill_fast(slab_.get(), kv_dtype, size_t(layout_.size_elems()), 1);
    }
    kv_ = paged_kv_for_layer(layout_, slab_.get(), 0);

    // Each set's blocks, shuffled, so tables are non-contiguous as in a live pool.
    std::mt19937_64 rng(2);
    tables_.resize(size_t(num_sets_));
    for (int32_t s = 0; s < num_sets_; ++s) {
      std::vector<int32_t> ids(static_cast<size_t>(blocks_per_set));
      std::iota(ids.begin(), ids.end(), s * blocks_per_set);
      std::shuffle(ids.begin(), ids.end(), rng);
      tables_[size_t(s)] = std::move(ids);  // [batch][blocks_per_seq]
    }
    query_start_.resize(size_t(batch) + 1);
    for (int32_t i = 0; i <= batch; ++i) query_start_[size_t(i)] = i * q_len;
    kv_lens_.assign(size_t(batch), kv_len);
    batch_.num_seqs = batch;
    batch_.num_tokens = batch * q_len;
    batch_.query_start = query_start_.data();
    batch_.kv_lens = kv_lens_.data();
    batch_.max_blocks_per_seq = blocks_per_seq;
    batch_.max_q_len = q_len;
    batch_.max_kv_len = kv_len;
    params_.num_q_heads = kNumQHeads;
    params_.scale = 1.0f / std::sqrt(float(kHeadDim));
    const size_t rows = size_t(batch_.num_tokens) * kNumQHeads * kHeadDim;
    q_.resize(rows);
    out_.resize(rows);
    fill_fast(q_.data(), DType::F32, rows, 3);
  }

  // Runs one call of a variant on the next set of blocks.
  void run(int variant, ThreadPool& pool, int32_t tile_rows) {
    batch_.block_tables = tables_[size_t(next_set_)].data();
    next_set_ = (next_set_ + 1) % num_sets_;
    cpu::AttentionTuning tuning;
    tuning.prefetch = variant != 3;
    tuning.pair_bf16 = variant != 4;
    tuning.tile_rows = tile_rows;
    const Status status = variant == 1
                              ? cpu::paged_attention_scalar(params_, batch_, kv_, q_.data(),
                                                            DType::F32, out_.data(), &pool)
                              : cpu::paged_attention(params_, batch_, kv_, q_.data(), DType::F32,
                                                     out_.data(), &pool, tuning);
    if (!status.is_ok()) {
      std::fprintf(stderr, "attention failed: %s\n", status.to_string().c_str());
      std::exit(1);
    }
  }

  // KV bytes one call reads (every sequence's K and V, all KV heads; 8-bit: with the scales).
  double kv_bytes() const {
    return double(batch_.num_seqs) * batch_.max_kv_len * kNumKvHeads * 2.0 *
           double(kv_vector_bytes(layout_.dtype, kHeadDim));
  }
  // Multiply-add FLOPs of one call: q·k and p·v over every visible key of every query row.
  double flops() const {
    double keys = 0;
    for (int32_t t = 0; t < q_len_; ++t) keys += batch_.max_kv_len - q_len_ + t + 1;
    return 4.0 * kHeadDim * keys * kNumQHeads * batch_.num_seqs;
  }
  int32_t num_sets() const { return num_sets_; }

 private:
  int32_t q_len_;
  int32_t num_sets_ = 1;
  int32_t next_set_ = 0;
  KvLayout layout_;
  struct Free {
    void operator()(std::byte* p) const { std::free(p); }
  };
  std::unique_ptr<std::byte, Free> slab_;  // [num_blocks][K,V][kv_heads][block_size][head_dim]
  PagedKv kv_;
  std::vector<std::vector<int32_t>> tables_;  // per set: [batch][blocks_per_seq]
  std::vector<int32_t> query_start_;          // [batch + 1]
  std::vector<int32_t> kv_lens_;              // [batch]
  AttentionParams params_;
  AttentionBatch batch_;
  std::vector<float> q_, out_;  // [batch * q_len][32][128]
};

std::vector<int> parse_ints(std::string_view s) {
  std::vector<int> v;
  size_t pos = 0;
  while (pos <= s.size()) {
    const size_t comma = std::min(s.find(',', pos), s.size());
    v.push_back(std::atoi(std::string(s.substr(pos, comma - pos)).c_str()));
    pos = comma + 1;
  }
  return v;
}

int usage(const char* why) {
  std::fprintf(
      stderr,
      "attention_cpu_bench: %s\n"
      "usage: attention_cpu_bench [--variant 1,2,3,4] [--threads N] [--kv bf16,f32,f16,int8,fp8]\n"
      "       [--batch 1,8,32] [--ctx 512,4096,16384] [--no-decode] [--no-prefill]\n"
      "       [--min-time S] [--rotate-mb MB] [--tile-rows N] [--csv FILE]\n",
      why);
  return 2;
}

}  // namespace
}  // namespace kvp::bench

int main(int argc, char** argv) {
  using namespace kvp;
  using namespace kvp::bench;
  std::vector<int> variants = {1, 2};
  int threads = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  std::vector<DType> kv_dtypes = {DType::BF16, DType::F32};
  std::vector<int> batches = {1, 8, 32};
  std::vector<int> contexts = {512, 4096, 16384};
  bool decode = true, prefill = true;
  double min_time = 0.5;
  std::string csv_path;
  size_t rotation_bytes = size_t{512} << 20;
  int32_t tile_rows = cpu::AttentionTuning().tile_rows;
  for (int i = 1; i < argc; ++i) {
    const std::string_view arg = argv[i];
    const bool has_value = i + 1 < argc;
    if (arg == "--no-decode") {
      decode = false;
    } else if (arg == "--no-prefill") {
      prefill = false;
    } else if (!has_value) {
      return usage(fmt::format("unknown or incomplete option '{}'", arg).c_str());
    } else if (arg == "--variant") {
      variants = parse_ints(argv[++i]);
      for (int v : variants) {
        if (v < 1 || v > 4) {
          return usage(
              "variants: 1 (scalar), 2 (fast), 3 (fast, no prefetch), 4 (fast, bf16 not paired)");
        }
      }
    } else if (arg == "--threads") {
      threads = std::atoi(argv[++i]);
      if (threads < 1) return usage("--threads must be >= 1");
    } else if (arg == "--kv") {
      kv_dtypes.clear();
      std::string_view list = argv[++i];
      size_t pos = 0;
      while (pos <= list.size()) {
        const size_t comma = std::min(list.find(',', pos), list.size());
        const auto t = parse_kv_cache_dtype(list.substr(pos, comma - pos));
        if (!t) return usage("--kv takes f32, f16, bf16, int8, fp8");
        kv_dtypes.push_back(*t);
        pos = comma + 1;
      }
    } else if (arg == "--batch") {
      batches = parse_ints(argv[++i]);
    } else if (arg == "--ctx") {
      contexts = parse_ints(argv[++i]);
    } else if (arg == "--min-time") {
      min_time = std::atof(argv[++i]);
    } else if (arg == "--tile-rows") {
      tile_rows = std::atoi(argv[++i]);
      if (tile_rows < 1) return usage("--tile-rows must be >= 1");
    } else if (arg == "--rotate-mb") {
      rotation_bytes = size_t(std::atol(argv[++i])) << 20;
    } else if (arg == "--csv") {
      csv_path = argv[++i];
    } else {
      return usage(fmt::format("unknown option '{}'", arg).c_str());
    }
  }
  for (int b : batches) {
    if (b < 1) return usage("batch sizes must be >= 1");
  }
  for (int c : contexts) {
    if (c < 1) return usage("contexts must be >= 1");
  }

  ThreadPool pool(threads);
  std::FILE* csv = nullptr;
  if (!csv_path.empty()) {
    csv = std::fopen(csv_path.c_str(), "w");
    if (csv == nullptr) return usage(fmt::format("cannot open --csv '{}'", csv_path).c_str());
    std::fprintf(csv,
                 "case,variant,kv_dtype,batch,q_len,kv_len,threads,median_ms,kv_gbps,gflops,"
                 "ceiling,ceiling_value,fraction_of_ceiling\n");
  }
  CopyProbe copy_probe;
  const double copy_gbps = copy_probe.measure_gbps(pool, min_time);
  const double fma_gflops = prefill ? measure_fma_gflops(pool, min_time) : 0.0;
  std::printf("target %s threads %d\n", cpu::kernel_target(), threads);
  std::printf("ceiling copy_GBps %.1f (1 GiB memcpy, read+write, %d threads)\n", copy_gbps,
              threads);
  if (prefill)
    std::printf("ceiling fma_GFLOPs %.1f (f32 register FMAs, %d threads)\n", fma_gflops, threads);
  if (csv != nullptr) {
    std::fprintf(csv, "ceiling,,,,,,%d,,%.3f,,copy_gbps,%.3f,\n", threads, copy_gbps, copy_gbps);
    if (prefill)
      std::fprintf(csv, "ceiling,,,,,,%d,,,%.3f,fma_gflops,%.3f,\n", threads, fma_gflops,
                   fma_gflops);
  }

  // The machine may be shared, so each case is compared with a ceiling measured just before it.
  double case_ceiling = 0.0;
  auto measure_case_ceiling = [&](bool is_decode) {
    case_ceiling = is_decode ? copy_probe.measure_gbps(pool, 0.3) : measure_fma_gflops(pool, 0.3);
  };
  auto report = [&](const char* name, int variant, DType kv_dtype, int batch, int q_len, int kv_len,
                    Case& c) {
    const double seconds = time_median(min_time, 3, [&] { c.run(variant, pool, tile_rows); });
    const double gbps = c.kv_bytes() / seconds / 1e9;
    const double gflops = c.flops() / seconds / 1e9;
    const bool is_decode = q_len == 1;
    const double fraction = (is_decode ? gbps : gflops) / case_ceiling;
    std::printf(
        "%-7s v%d kv=%-4s batch=%-2d q_len=%-3d kv_len=%-5d  %9.3f ms  %7.2f KV_GB/s  %8.2f "
        "GFLOP/s  %5.1f%% of %s %.1f\n",
        name, variant, std::string(dtype_name(kv_dtype)).c_str(), batch, q_len, kv_len,
        seconds * 1e3, gbps, gflops, 100.0 * fraction, is_decode ? "copy_GBps" : "fma_GFLOPs",
        case_ceiling);
    std::fflush(stdout);
    if (csv != nullptr) {
      std::fprintf(csv, "%s,%d,%s,%d,%d,%d,%d,%.4f,%.3f,%.3f,%s,%.3f,%.4f\n", name, variant,
                   std::string(dtype_name(kv_dtype)).c_str(), batch, q_len, kv_len, threads,
                   seconds * 1e3, gbps, gflops, is_decode ? "copy_gbps" : "fma_gflops",
                   case_ceiling, fraction);
    }
  };

  if (decode) {
    for (DType kv_dtype : kv_dtypes) {
      for (int batch : batches) {
        for (int ctx : contexts) {
          Case c(kv_dtype, batch, 1, ctx, rotation_bytes);
          measure_case_ceiling(true);
          for (int variant : variants) report("decode", variant, kv_dtype, batch, 1, ctx, c);
        }
      }
    }
  }
  if (prefill) {
    for (DType kv_dtype : kv_dtypes) {
      Case c(kv_dtype, 1, 512, 4096 + 512, rotation_bytes);
      measure_case_ceiling(false);
      for (int variant : variants) report("prefill", variant, kv_dtype, 1, 512, 4096 + 512, c);
    }
  }
  if (csv != nullptr) std::fclose(csv);
  return 0;
}
