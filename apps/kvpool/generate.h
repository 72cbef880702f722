// `kvpool generate`: text from a model file, streamed as it is sampled, then one stats line.
// `kvpool inspect`: a model file's metadata, tensors and cache geometry.
#pragma once

#include <CLI/CLI.hpp>

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "common/dtype.h"
#include "common/status.h"

namespace kvp::app {

struct GenerateOptions {
  std::string model;
  std::string prompt;
  int32_t max_tokens = 128;
  float temperature = 0.7f;
  float top_p = 0.95f;
  int32_t top_k = 40;
  std::optional<uint64_t> seed;
  std::string device = "cpu";     // cpu, cuda or cuda:N (model_loader.h's parse_device)
  std::string kv_dtype = "auto";  // f32, bf16, f16; auto: f32 on cpu, bf16 on cuda
  std::vector<std::string> stop;  // stop strings (Request::stop_strings)
  int32_t block_size = 16;
  std::string kv_memory = "1GiB";  // the KV pool, all cache groups together
  int32_t threads = 0;             // 0: all cores
  bool raw = false;                // no chat template: the prompt as-is
  bool quiet_stats = false;
};

CLI::App* add_generate_command(CLI::App& app, GenerateOptions* options);
// Exit code: 0, 2 for bad input (model file, options), 1 for a failure of the run.
int run_generate(const GenerateOptions& options);

struct InspectOptions {
  std::string path;
  int32_t max_tensors = 40;
  int32_t block_size = 16;
};
CLI::App* add_inspect_command(CLI::App& app, InspectOptions* options);
int run_inspect(const InspectOptions& options);

// --kv-dtype: "f32", "bf16", "f16" (or their long names); "auto": f32 on cpu, bf16 on cuda (the
// CUDA backend holds no f32 KV). invalid_argument naming the option otherwise.
// requires: device parses (parse_device).
Result<DType> parse_kv_dtype(const std::string& text, const std::string& device);

// "512MiB", "4GiB", "1.5G", "1000000" → bytes; nullopt when malformed or not positive.
std::optional<int64_t> parse_bytes(const std::string& text);

}  // namespace kvp::app
