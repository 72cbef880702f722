// matmul over GGUF block formats (quant_matmul.h) on the default models' shapes and the
// Llama-3.1-8B shape's FFN.
//
//   quant_matmul_bench [TYPE...|all] [--rows N]... [--shape TEXT]... [--hot] [--cpu-time]
//                      [--variant V]... [--rounds K] [--csv FILE]
//   default: Q4_1 Q8_0 Q5_0 Q4_K Q6_K F16, activation rows 1 8 512, every shape (--shape keeps
//   those whose name contains TEXT, e.g. "8B" or "down")
//
// Per type, shape (rows x cols), activation rows (1, 8, 512) and threads (1, 2), one line:
//   weight GB/s   bytes of the stored weights ÷ time per call, next to the memcpy bandwidth of the
//                 same thread count measured in this run (the ceiling of decode: it reads every
//                 weight once per call). Decode cases rotate over enough copies of the matrix to
//                 miss the last-level cache, so the weights come from memory as in a model.
//   GFLOP/s       2 rows cols num_rows ÷ time, and for 512 rows next to OpenBLAS sgemm on the
//                 dequantised f32 matrix (same threads): the prefill baseline kvpool had before.
//   path          at 32+ rows, block formats run both prefill paths, one line each
//   (quant_matmul.h's
//                 ActPrecision): "f32" dequantised panels through sgemm (kF32), "int8" int8
//                 activations through the integer tiles (kInt8All); fewer rows: "int8" (decode).
// --cpu-time times one thread only, by its CPU time instead of the wall clock.
// --hot reads one copy of the matrix at every call (from cache where it fits): the kernel's
// compute rate without the memory stream.
// --variant picks the weights' row layout of the decode cases (below 32 activation rows; the
// path column names it), several in turn: 1 the file's layout (row_tile), 2 Q4_1 repacked into
// groups of 8 blocks (RowLayout::kDecodeGroup, repack_for_decode); default 1. --rounds K runs
// the variants of each case K times in turn, one line each, so an A/B shares one process.
// Times are the median of 7 runs of ≥ 50 ms each.
#include <cblas.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <ctime>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "common/dtype.h"
#include "common/thread_pool.h"
#include "quant/quant_matmul.h"

extern "C" void openblas_set_num_threads(int num_threads);

namespace kvp::quant {
namespace {

using Clock = std::chrono::steady_clock;

// Seconds on the wall clock, or (thread_cpu) the calling thread's CPU time: on a shared machine
// a one-thread compute-bound call's CPU time does not count the time another process held its
// core.
double now_seconds(bool thread_cpu) {
  if (!thread_cpu) return std::chrono::duration<double>(Clock::now().time_since_epoch()).count();
  timespec ts;
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return double(ts.tv_sec) + 1e-9 * double(ts.tv_nsec);
}

// Median seconds per call of fn over 7 runs, each repeating fn for at least 50 ms.
template <typename Fn>
double time_per_call(Fn&& fn, bool thread_cpu = false) {
  fn();
  std::vector<double> runs;
  for (int run = 0; run < 7; ++run) {
    int64_t calls = 0;
    const double start = now_seconds(thread_cpu);
    double elapsed = 0;
    do {
      fn();
      ++calls;
      elapsed = now_seconds(thread_cpu) - start;
    } while (elapsed < 0.05);
    runs.push_back(elapsed / static_cast<double>(calls));
  }
  std::sort(runs.begin(), runs.end());
  return runs[runs.size() / 2];
}

// GB/s of memcpy of 256 MiB split over the pool's threads (bytes copied ÷ time).
double copy_bandwidth(ThreadPool* pool) {
  const size_t bytes = size_t{256} << 20;
  std::vector<char> src(bytes, 1), dst(bytes, 0);
  const int threads = pool ? pool->num_threads() : 1;
  const double t = time_per_call([&] {
    parallel_for(pool, threads, [&](int64_t i, int) {
      const size_t chunk = bytes / threads;
      std::memcpy(dst.data() + i * chunk, src.data() + i * chunk, chunk);
    });
  });
  return double(bytes) / t / 1e9;
}

std::vector<uint8_t> random_matrix(GgmlType t, int64_t rows, int64_t cols, std::mt19937& rng) {
  const GgmlTypeInfo& info = ggml_type_info(t);
  const size_t bytes = ggml_row_size_bytes(t, static_cast<size_t>(cols)) * rows;
  std::vector<uint8_t> data(bytes);
  std::uniform_int_distribution<uint32_t> word;
  for (size_t i = 0; i + 4 <= bytes; i += 4) {
    const uint32_t v = word(rng);
    std::memcpy(data.data() + i, &v, 4);
  }
  // Sane scales: every 16-bit word that is a scale field gets a small f16; simplest is to
  // rewrite the f16 fields of every block (and every element of F16/BF16/F32) with one value
  // range. The kernels' speed does not depend on the values.
  const uint16_t f16 = f32_to_f16(0.01f).bits;
  const uint16_t bf16 = f32_to_bf16(0.01f).bits;
  if (t == GgmlType::F32) {
    const float v = 0.01f;
    for (size_t i = 0; i + 4 <= bytes; i += 4) std::memcpy(data.data() + i, &v, 4);
  } else if (t == GgmlType::F16 || t == GgmlType::BF16) {
    for (size_t i = 0; i + 2 <= bytes; i += 2) {
      std::memcpy(data.data() + i, t == GgmlType::F16 ? &f16 : &bf16, 2);
    }
  } else {
    size_t offsets[2] = {0, 2};
    if (t == GgmlType::Q2_K) offsets[0] = 80, offsets[1] = 82;
    if (t == GgmlType::Q3_K) offsets[0] = offsets[1] = 108;
    if (t == GgmlType::Q6_K) offsets[0] = offsets[1] = 208;
    for (size_t b = 0; b < bytes / info.type_size; ++b) {
      for (size_t off : offsets) std::memcpy(data.data() + b * info.type_size + off, &f16, 2);
    }
  }
  return data;
}

struct ShapeCase {
  int64_t rows, cols;
  const char* what;
};

constexpr ShapeCase kShapes[] = {{576, 576, "SmolLM2 q/o"},       {1536, 576, "SmolLM2 gate/up"},
                                 {576, 1536, "SmolLM2 down"},     {49152, 576, "SmolLM2 lm-head"},
                                 {2048, 640, "Gemma3 gate/up"},   {640, 2048, "Gemma3 down"},
                                 {262144, 640, "Gemma3 lm-head"}, {14336, 4096, "Llama8B gate/up"},
                                 {4096, 14336, "Llama8B down"}};

int run(int argc, char** argv) {
  std::vector<GgmlType> types;
  FILE* csv = nullptr;
  std::vector<int64_t> row_counts;
  std::vector<std::string> shape_filters;
  bool hot = false;
  bool thread_cpu = false;
  std::vector<int> variants;
  int rounds = 1;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    if (arg == "--variant" && i + 1 < argc) {
      variants.push_back(std::stoi(argv[++i]));
      if (variants.back() < 1 || variants.back() > 2) {
        std::fprintf(stderr, "--variant: 1 (file layout) or 2 (decode groups)\n");
        return 2;
      }
    } else if (arg == "--rounds" && i + 1 < argc) {
      rounds = std::max(1, std::stoi(argv[++i]));
    } else if (arg == "--hot") {
      hot = true;
    } else if (arg == "--cpu-time") {
      thread_cpu = true;
    } else if (arg == "--rows" && i + 1 < argc) {
      row_counts.push_back(std::stoll(argv[++i]));
    } else if (arg == "--shape" && i + 1 < argc) {
      shape_filters.emplace_back(argv[++i]);
    } else if (arg == "--csv" && i + 1 < argc) {
      csv = std::fopen(argv[++i], "w");
    } else if (arg == "all") {
      for (GgmlType t :
           {GgmlType::F32, GgmlType::F16, GgmlType::BF16, GgmlType::Q4_0, GgmlType::Q4_1,
            GgmlType::Q5_0, GgmlType::Q5_1, GgmlType::Q8_0, GgmlType::Q2_K, GgmlType::Q3_K,
            GgmlType::Q4_K, GgmlType::Q5_K, GgmlType::Q6_K, GgmlType::IQ4_NL, GgmlType::IQ4_XS}) {
        types.push_back(t);
      }
    } else {
      bool found = false;
      for (uint32_t raw = 0; raw < 64; ++raw) {
        const GgmlTypeInfo* info = ggml_type_info(raw);
        if (info != nullptr && info->name == arg && matmul_supports(info->type)) {
          types.push_back(info->type);
          found = true;
        }
      }
      if (!found) {
        std::fprintf(stderr, "unknown or unsupported type %s\n", arg.c_str());
        return 2;
      }
    }
  }
  if (types.empty()) {
    types = {GgmlType::Q4_1, GgmlType::Q8_0, GgmlType::Q5_0,
             GgmlType::Q4_K, GgmlType::Q6_K, GgmlType::F16};
  }
  if (row_counts.empty()) row_counts = {1, 8, 512};
  if (variants.empty()) variants = {1};
  ThreadPool pool2(2);
  ThreadPool* pools[2] = {nullptr, &pool2};
  double copy_gbs[2] = {copy_bandwidth(nullptr), copy_bandwidth(&pool2)};
  std::printf("memcpy GB/s: 1 thread %.1f, 2 threads %.1f\n", copy_gbs[0], copy_gbs[1]);
  if (csv)
    std::fprintf(
        csv, "type,rows,cols,num_rows,threads,path,ms,weight_gbs,copy_gbs,gflops,sgemm_gflops\n");
  std::printf("%-6s %7s %5s %4s %2s %-4s %9s %9s %6s %5s %8s %8s\n", "type", "rows", "cols", "n",
              "th", "path", "ms", "weightGB/s", "copy", "frac", "GFLOP/s", "sgemm");
  std::mt19937 rng(1);
  constexpr size_t kColdBytes = size_t{96} << 20;  // > 2x the 32 MiB L3
  for (GgmlType type : types) {
    for (const ShapeCase& shape : kShapes) {
      const bool wanted =
          shape_filters.empty() ||
          std::any_of(shape_filters.begin(), shape_filters.end(), [&](const std::string& f) {
            return std::string(shape.what).find(f) != std::string::npos;
          });
      if (!wanted) continue;
      if (type != GgmlType::Q8_0 && shape.rows == 262144) continue;  // Gemma's Q8_0 lm-head
      // K-quants need cols % 256 == 0 (llama.cpp stores such tensors in a 32-block format).
      if (shape.cols % ggml_type_info(type).block_size != 0) continue;
      const std::vector<uint8_t> data = random_matrix(type, shape.rows, shape.cols, rng);
      const QuantMatrix w = make_matrix(type, data.data(), shape.rows, shape.cols);
      // Copies of the matrix to rotate over so decode reads come from memory.
      const size_t copies = std::max<size_t>(1, (kColdBytes + w.size_bytes() - 1) / w.size_bytes());
      std::vector<std::vector<uint8_t>> cold(copies - 1, data);
      std::vector<QuantMatrix> ws{w};
      for (auto& c : cold) ws.push_back(make_matrix(type, c.data(), shape.rows, shape.cols));
      // Variant 2: the same copies in the decode layout.
      const bool has_v2 = type == GgmlType::Q4_1 &&
                          std::find(variants.begin(), variants.end(), 2) != variants.end();
      std::vector<std::vector<std::byte>> grouped(has_v2 ? ws.size() : 0);
      std::vector<QuantMatrix> ws2;
      for (size_t c = 0; c < grouped.size(); ++c) {
        grouped[c].resize(w.size_bytes());
        ws2.push_back(repack_for_decode(ws[c], grouped[c].data()));
      }
      std::vector<float> f32;  // dequantised, for sgemm
      for (int64_t num_rows : row_counts) {
        if (num_rows >= 32 && shape.rows * shape.cols > 30000000) continue;  // lm-heads, 8B
        std::vector<float> x(static_cast<size_t>(num_rows * shape.cols));
        std::uniform_real_distribution<float> u(-1.0f, 1.0f);
        for (float& v : x) v = u(rng);
        std::vector<float> y(static_cast<size_t>(num_rows * shape.rows));
        if (num_rows >= 32 && f32.empty()) {
          f32.resize(static_cast<size_t>(shape.rows * shape.cols));
          for (int64_t r = 0; r < shape.rows; ++r)
            dequantize_row(w, r, f32.data() + r * shape.cols);
        }
        // Prefill rows: both paths (quant_matmul.h's ActPrecision), f32 panels first.
        std::vector<ActPrecision> paths = {ActPrecision::kInt8};
        if (num_rows >= kPrefillMinRows && type != GgmlType::F32 && type != GgmlType::F16 &&
            type != GgmlType::BF16) {
          paths = {ActPrecision::kF32, ActPrecision::kInt8All};
        }
        // (path, variant) pairs: the variants at decode sizes, K rounds in turn.
        std::vector<std::pair<ActPrecision, int>> runs;
        for (ActPrecision path : paths) {
          if (num_rows >= kPrefillMinRows) {
            runs.emplace_back(path, 1);
            continue;
          }
          for (int k = 0; k < rounds; ++k) {
            for (int v : variants) {
              if (v == 1 || !ws2.empty()) runs.emplace_back(path, v);
            }
          }
        }
        for (int th = 1; th <= (thread_cpu ? 1 : 2); ++th) {
          for (const auto& run_case : runs) {
            const ActPrecision path = run_case.first;
            const int variant = run_case.second;
            size_t next = 0;
            const bool rotate = num_rows < 32 && !hot;
            const std::vector<QuantMatrix>& mats = variant == 2 ? ws2 : ws;
            const auto call = [&] {
              const QuantMatrix& m = rotate ? mats[next++ % mats.size()] : mats[0];
              matmul(m, x.data(), num_rows, shape.cols, y.data(), shape.rows, pools[th - 1], path);
            };
            const double t = time_per_call(call, thread_cpu);
            const char* path_name = num_rows < kPrefillMinRows
                                        ? (variants.size() > 1 ? (variant == 2 ? "v2" : "v1")
                                           : variant == 2      ? "int8g"
                                                               : "int8")
                                    : path == ActPrecision::kF32     ? "f32"
                                    : path == ActPrecision::kInt8All ? "int8"
                                                                     : "auto";
            const double gbs = double(w.size_bytes()) / t / 1e9;
            const double gflops = 2.0 * shape.rows * shape.cols * num_rows / t / 1e9;
            double sgemm = 0;
            if (num_rows >= 32) {
              openblas_set_num_threads(th);
              const double ts = time_per_call([&] {
                cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, num_rows, shape.rows,
                            shape.cols, 1.0f, x.data(), shape.cols, f32.data(), shape.cols, 0.0f,
                            y.data(), shape.rows);
              });
              sgemm = 2.0 * shape.rows * shape.cols * num_rows / ts / 1e9;
            }
            std::printf("%-6s %7lld %5lld %4lld %2d %-4s %9.3f %9.1f %6.1f %5.2f %8.1f %8.1f  %s\n",
                        std::string(ggml_type_name(type)).c_str(), (long long)shape.rows,
                        (long long)shape.cols, (long long)num_rows, th, path_name, t * 1e3, gbs,
                        copy_gbs[th - 1], gbs / copy_gbs[th - 1], gflops, sgemm, shape.what);
            std::fflush(stdout);
            if (csv) {
              std::fprintf(csv, "%s,%lld,%lld,%lld,%d,%s,%.4f,%.2f,%.2f,%.2f,%.2f\n",
                           std::string(ggml_type_name(type)).c_str(), (long long)shape.rows,
                           (long long)shape.cols, (long long)num_rows, th, path_name, t * 1e3, gbs,
                           copy_gbs[th - 1], gflops, sgemm);
            }
          }
        }
      }
    }
  }
  if (csv) std::fclose(csv);
  return 0;
}

}  // namespace
}  // namespace kvp::quant

int main(int argc, char** argv) { return kvp::quant::run(argc, argv); }
