// The options that generate, bench, serve, chat and perplexity share, declared and validated
// here once: which model on which device, the KV pool (dtype, block size, size), the engine's
// scheduling and session tiers, and the threads.
//
//   add_engine_options(cmd, &o)      CLI11 declarations (per-option range checks, finite numbers)
//   check_engine_options(o)          what CLI11 cannot check: devices, dtypes, sizes, folders
//   load_model(o, ...)               thread pool + tokenizer + backend, errors naming the option
//   make_engine_config(o, backend)   the EngineConfig: blocks from --kv-memory or --blocks
#pragma once

#include <CLI/CLI.hpp>

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>

#include "common/dtype.h"
#include "common/status.h"
#include "common/thread_pool.h"
#include "engine/engine.h"
#include "model/forward_backend.h"
#include "tokenizer/tokenizer.h"

namespace kvp::app {

// Largest thread count the commands accept (a pool of more only thrashes; creating 100000
// threads fails with an exception).
constexpr int32_t kMaxThreads = 1024;

struct EngineOptions {
  std::string model;               // GGUF file or Hugging Face directory
  std::string random_model;        // or a named shape with random weights (random_model.h)
  std::string tokenizer;           // with random_model: a GGUF file or directory's tokenizer
  std::string device = "cpu";      // cpu, cuda or cuda:N (model_loader.h's parse_device)
  std::string kv_dtype = "auto";   // f32, bf16, f16, int8, fp8; auto: bf16 (cpu and cuda)
  int32_t block_size = 16;         // tokens per KV block, a power of two in [1, 1024]
  std::string kv_memory = "1GiB";  // the KV pool, all cache groups together
  int32_t blocks = 0;              // > 0: blocks per cache group (instead of kv_memory)
  int32_t max_seqs = 64;           // sequences in one step
  int32_t step_tokens = 512;       // tokens in one step
  bool prefix_caching = true;
  bool device_sampling = true;      // EngineConfig::device_sampling
  std::string host_tier = "0";      // bytes of host memory for idle sessions' KV (0: none)
  double tier_watermark = 0.1;      // EngineConfig::tier_watermark
  bool restore_joins_step = false;  // EngineConfig::restore_joins_step
  // EngineConfig::restore_overlap: off, alone, copy-bound, always
  std::string restore_overlap = "copy-bound";
  bool copy_out_overlap = true;      // EngineConfig::copy_out_overlap
  bool keep_restored_copies = true;  // EngineConfig::keep_restored_copies
  std::string preemption = "auto";   // EngineConfig::preemption: auto, swap, recompute
  std::string disk_dir;              // folder for idle sessions' cache files (empty: none)
  std::string disk_tier = "0";       // bytes of cache files (> 0 with disk_dir; default 16GiB)
  int32_t threads = 0;               // CPU threads (0: all cores)
  int32_t tensor_parallel = 1;       // GPUs one model is split over (cpu: threads emulating them)
};

// A CLI11 validator for floating-point options: a finite number in [min, max] (CLI11's Range
// lets NaN through).
CLI::Validator finite_range(double min, double max);

// Which model options a command takes: --model alone, or also --random-model NAME (bench,
// serve) with --tokenizer PATH (serve: its random ids must decode to text).
enum class ModelChoice { kFile, kFileOrRandom };

// Declares the options on cmd. kFileOrRandom: one of --model and --random-model (checked by
// check_engine_options). The defaults are the values *o holds.
void add_engine_options(CLI::App* cmd, EngineOptions* o, ModelChoice choice = ModelChoice::kFile);

// Everything CLI11 cannot check alone; invalid_argument naming the option and the reason.
Status check_engine_options(const EngineOptions& o);

// "512MiB", "4GiB", "1.5G", "2TiB", "1000000" → bytes; invalid_argument naming `option` and
// saying why (not a number, an unknown unit, not positive, over 1 PiB). allow_zero: "0" is 0.
Result<int64_t> parse_size(const std::string& text, const std::string& option,
                           bool allow_zero = false);

// --kv-dtype: "f32", "bf16", "f16" (or their long names), "int8", "fp8"; "auto": bf16 on every
// device (the CUDA backend holds no f32 KV; on the CPU bf16 halves the bytes decode attention
// reads, docs/perf/model.md "KV dtype on the CPU"). invalid_argument naming the option otherwise.
Result<DType> parse_kv_dtype(const std::string& text);

// The CPU threads the options ask for (all cores for 0).
int32_t resolved_threads(const EngineOptions& o);

// A loaded model: the threads, the tokenizer and the backend (which uses the threads).
struct LoadedModel {
  std::unique_ptr<ThreadPool> pool;
  std::optional<Tokenizer> tokenizer;
  std::unique_ptr<ForwardBackend> backend;
  double load_seconds = 0;
};
// Checks the options, loads the tokenizer (when need_tokenizer: the model's, or --tokenizer's
// for a random model, whose vocabulary it must not exceed) and the backend (random weights of
// seed 0 for --random-model). Errors name the model path and the reason.
Result<LoadedModel> load_model(const EngineOptions& o, bool need_tokenizer,
                               const std::function<void(int32_t, int32_t)>& progress = {});

// The engine's configuration from the options for this backend: num_blocks from --blocks, or as
// many as --kv-memory holds; tiers; checked against the backend (Engine::check_config).
Result<EngineConfig> make_engine_config(const EngineOptions& o, const ForwardBackend& backend);

// "weights 91.5 MB resident (Q4_1 63.1 MB, Q8_0 28.3 MB), a decode step reads 91.5 MB + KV",
// or "" when the backend does not report its weights.
std::string describe_weights(const ForwardBackend& backend);

}  // namespace kvp::app
