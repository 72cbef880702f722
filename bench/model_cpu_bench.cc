// The model runner on this CPU: prompt (prefill) and decode speed of a real model file, and the
// decode step's floor measured in the same run.
//
//   model_cpu_bench --model FILE|DIR [--threads N] [--prompt 512] [--decode 64] [--batch 1,8]
//                   [--kv-dtype f32|bf16|f16|int8|fp8]
//
// Floor of one decode step = (weight bytes read + KV bytes read) / copy bandwidth, where the copy
// bandwidth is memcpy between two 1 GiB buffers (bytes read + bytes written, best of 5) and the
// weights are the matrices as the runner keeps them (the file's block formats: every layer
// matrix and the lm-head once per step; ModelWeights::decode_read_bytes) and the KV bytes are
// every head vector of the context in the KV dtype (kv_vector_bytes: 8-bit KV with its scale).
// Prefill is one forward pass over `prompt` tokens of each sequence of the batch.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <optional>
#include <random>
#include <string>
#include <vector>

#include "cache/kv_quant.h"
#include "common/dtype.h"
#include "model/model_loader.h"

namespace kvp {
namespace {

using Clock = std::chrono::steady_clock;
double since(Clock::time_point t) {
  return std::chrono::duration<double>(Clock::now() - t).count();
}

double copy_bandwidth_gbs() {
  const size_t n = size_t{1} << 30;
  std::vector<char> a(n, 1), b(n, 2);
  double best = 0;
  for (int r = 0; r < 5; ++r) {
    const auto t = Clock::now();
    std::memcpy(b.data(), a.data(), n);
    best = std::max(best, 2.0 * n / since(t) / 1e9);
    a[r] = b[n - 1 - r];  // keep the copies observable
  }
  return best;
}

struct Options {
  std::string model;
  int threads = 1;
  int prompt = 512;
  int decode = 64;
  std::vector<int> batches = {1, 8};
  DType kv_dtype = DType::F32;
};

int run(const Options& o) {
  ThreadPool pool(o.threads);
  auto runner_or = load_model(o.model, &pool);
  if (!runner_or.is_ok()) {
    std::fprintf(stderr, "model_cpu_bench: %s\n", runner_or.status().to_string().c_str());
    return 2;
  }
  ModelRunner& runner = **runner_or;
  const ModelSpec& spec = runner.spec();
  const double bw = copy_bandwidth_gbs();
  std::printf("model %s: %s, %d layers, hidden %d, vocab %d; threads %d; kv %s\n", o.model.c_str(),
              architecture_name(spec.architecture), spec.num_layers, spec.hidden_size,
              spec.vocab_size, o.threads, std::string(dtype_name(o.kv_dtype)).c_str());
  std::printf("copy bandwidth (memcpy 1 GiB, read+write, best of 5): %.1f GB/s\n", bw);
  const double weight_bytes = static_cast<double>(runner.weights().decode_read_bytes());
  std::printf("resident matrix bytes: %.1f MB (", runner.weights().matrix_bytes() / 1e6);
  for (const auto& [format, bytes] : runner.weights().matrix_bytes_by_format()) {
    std::printf(" %s %.1f MB", format.c_str(), bytes / 1e6);
  }
  std::printf(" )\nweight bytes read per decode step: %.1f MB\n", weight_bytes / 1e6);
  std::printf("%-8s %6s %8s %10s %12s %12s %8s\n", "phase", "batch", "context", "ms/step", "tok/s",
              "floor ms", "floor/x");

  const int32_t block = 16;
  for (int batch : o.batches) {
    const int32_t max_tokens = o.prompt + o.decode + 1;
    const int32_t blocks_per_seq = (max_tokens + block - 1) / block;
    const int32_t num_blocks = batch * blocks_per_seq;
    std::vector<HostKvSlab> slabs(runner.num_cache_groups());
    for (int32_t g = 0; g < runner.num_cache_groups(); ++g) {
      slabs[g].layout = runner.group_layout(g, num_blocks, block, o.kv_dtype);
      slabs[g].bytes.assign(slabs[g].layout.size_bytes(), std::byte{0});
    }
    std::vector<int32_t> tables(static_cast<size_t>(num_blocks));
    for (int32_t i = 0; i < num_blocks; ++i) tables[i] = i;
    std::mt19937 rng(7);
    auto step = [&](int32_t q_len, int32_t kv_before, std::vector<float>* logits) {
      std::vector<int32_t> tokens, query_start = {0}, kv_lens, rows;
      std::vector<int64_t> slots;
      for (int s = 0; s < batch; ++s) {
        for (int32_t t = 0; t < q_len; ++t) {
          tokens.push_back(static_cast<int32_t>(rng() % spec.vocab_size));
          const int32_t pos = kv_before + t;
          slots.push_back(int64_t{tables[s * blocks_per_seq + pos / block]} * block + pos % block);
        }
        query_start.push_back(static_cast<int32_t>(tokens.size()));
        kv_lens.push_back(kv_before + q_len);
        rows.push_back(static_cast<int32_t>(tokens.size()) - 1);
      }
      ForwardBatch b;
      b.token_ids = tokens;
      b.query_start = query_start;
      b.kv_lens = kv_lens;
      for (size_t g = 0; g < slabs.size(); ++g) {
        b.groups.push_back({slots, tables, blocks_per_seq});
      }
      b.logit_rows = rows;
      logits->resize(rows.size() * static_cast<size_t>(spec.vocab_size));
      Status st = runner.forward(b, slabs, *logits);
      if (!st.is_ok()) {
        std::fprintf(stderr, "model_cpu_bench: %s\n", st.to_string().c_str());
        std::exit(1);
      }
    };
    std::vector<float> logits;
    const auto t0 = Clock::now();
    step(o.prompt, 0, &logits);
    const double prefill_s = since(t0);
    std::printf("%-8s %6d %8d %10.1f %12.1f %12s %8s\n", "prefill", batch, o.prompt,
                prefill_s * 1e3, batch * o.prompt / prefill_s, "-", "-");
    std::vector<double> times;
    for (int i = 0; i < o.decode; ++i) {
      const auto t = Clock::now();
      step(1, o.prompt + i, &logits);
      times.push_back(since(t));
    }
    std::sort(times.begin(), times.end());
    const double median = times[times.size() / 2];
    const int32_t ctx = o.prompt + o.decode / 2;
    const double kv_bytes = 2.0 * static_cast<double>(kv_vector_bytes(o.kv_dtype, spec.head_dim)) *
                            spec.num_layers * spec.num_kv_heads * static_cast<double>(ctx) * batch;
    const double floor_s = (weight_bytes + kv_bytes) / (bw * 1e9);
    std::printf("%-8s %6d %8d %10.2f %12.1f %12.2f %8.2f\n", "decode", batch, ctx, median * 1e3,
                batch / median, floor_s * 1e3, floor_s / median);
  }
  return 0;
}

}  // namespace
}  // namespace kvp

int main(int argc, char** argv) {
  kvp::Options o;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    auto next = [&]() -> std::string {
      if (i + 1 >= argc) {
        std::fprintf(stderr, "model_cpu_bench: %s needs a value\n", a.c_str());
        std::exit(2);
      }
      return argv[++i];
    };
    try {
      if (a == "--model") {
        o.model = next();
      } else if (a == "--threads") {
        o.threads = std::stoi(next());
      } else if (a == "--prompt") {
        o.prompt = std::stoi(next());
      } else if (a == "--decode") {
        o.decode = std::stoi(next());
      } else if (a == "--kv-dtype") {
        const std::string name = next();
        const std::optional<kvp::DType> dtype = kvp::parse_kv_cache_dtype(name);
        if (!dtype) {
          std::fprintf(stderr, "model_cpu_bench: --kv-dtype '%s': not a KV dtype\n", name.c_str());
          return 2;
        }
        o.kv_dtype = *dtype;
      } else if (a == "--batch") {
        o.batches.clear();
        std::string list = next();
        for (size_t p = 0; p < list.size();) {
          const size_t c = list.find(',', p);
          o.batches.push_back(std::stoi(list.substr(p, c - p)));
          p = c == std::string::npos ? list.size() : c + 1;
        }
      } else {
        std::fprintf(stderr, "model_cpu_bench: unknown option '%s'\n", a.c_str());
        return 2;
      }
    } catch (const std::exception&) {
      std::fprintf(stderr, "model_cpu_bench: %s: not a number\n", a.c_str());
      return 2;
    }
  }
  if (o.model.empty() || o.threads < 1 || o.prompt < 1 || o.decode < 1 || o.batches.empty()) {
    std::fprintf(stderr,
                 "usage: model_cpu_bench --model FILE|DIR [--threads N] [--prompt 512] "
                 "[--decode 64] [--batch 1,8] [--kv-dtype f32|bf16|f16|int8|fp8]\n");
    return 2;
  }
  return kvp::run(o);
}
