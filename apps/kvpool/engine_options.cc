#include "engine_options.h"

#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <filesystem>
#include <thread>

#include "model/model_loader.h"
#include "model/tensor_parallel.h"

namespace kvp::app {
namespace {

namespace fs = std::filesystem;

// Bytes of one block of every cache group together, with `dtype` KV.
int64_t bytes_per_block(const ForwardBackend& backend, int32_t block_size, DType dtype) {
  int64_t bytes = 0;
  for (int32_t g = 0; g < backend.num_cache_groups(); ++g) {
    bytes += static_cast<int64_t>(backend.group_layout(g, 1, block_size, dtype).block_size_bytes());
  }
  return bytes;
}

constexpr double kMaxSizeBytes = 1125899906842624.0;  // 1 PiB

}  // namespace

CLI::Validator finite_range(double min, double max) {
  return CLI::Validator(
      [min, max](std::string& text) -> std::string {
        double value = 0;
        size_t used = 0;
        try {
          value = std::stod(text, &used);
        } catch (...) {
          return fmt::format("'{}' is not a number", text);
        }
        if (used != text.size()) return fmt::format("'{}' is not a number", text);
        if (!std::isfinite(value)) return fmt::format("{} is not a finite number", text);
        if (value < min || value > max) {
          return fmt::format("{} is not in [{}, {}]", text, min, max);
        }
        return "";
      },
      fmt::format("NUMBER in [{}, {}]", min, max));
}

void add_engine_options(CLI::App* cmd, EngineOptions* o, ModelChoice choice) {
  CLI::Option* model =
      cmd->add_option("--model,-m", o->model, "GGUF file or Hugging Face model directory");
  if (choice == ModelChoice::kFile) {
    model->required();
  } else {
    cmd->add_option("--random-model", o->random_model,
                    "instead of --model: a model shape with random weights (llama3-8b, "
                    "smollm2-135m; on cpu smollm2-135m only)");
    cmd->add_option("--tokenizer", o->tokenizer,
                    "with --random-model: the tokenizer (a GGUF file or a folder with "
                    "tokenizer.json) whose ids the random model's outputs decode to");
  }
  cmd->add_option("--device", o->device, "cpu, cuda or cuda:N (a build with CUDA: make cuda)")
      ->capture_default_str();
  cmd->add_option("--kv-dtype", o->kv_dtype,
                  "KV cache dtype: auto (bf16), f32, bf16, f16, int8, fp8 (e4m3)")
      ->capture_default_str();
  cmd->add_option("--block-size", o->block_size, "tokens per KV block (a power of two)")
      ->check(CLI::Range(1, 1024))
      ->capture_default_str();
  CLI::Option* kv_memory =
      cmd->add_option("--kv-memory", o->kv_memory,
                      "KV pool size, all cache groups together, e.g. 512MiB, 2GiB")
          ->capture_default_str();
  CLI::Option* blocks =
      cmd->add_option("--blocks", o->blocks, "KV blocks per cache group (instead of --kv-memory)")
          ->check(CLI::Range(0, 1 << 24))
          ->capture_default_str();
  // given, --kv-memory sizes the pool, over a command's default --blocks (bench's 1024)
  kv_memory->excludes(blocks)->each([o](const std::string&) { o->blocks = 0; });
  cmd->add_option("--max-seqs", o->max_seqs, "engine: sequences in one step")
      ->check(CLI::Range(1, 1 << 16))
      ->capture_default_str();
  cmd->add_option("--step-tokens", o->step_tokens, "engine: tokens in one step")
      ->check(CLI::Range(1, 1 << 20))
      ->capture_default_str();
  cmd->add_flag("--prefix-caching,!--no-prefix-caching", o->prefix_caching,
                "engine: prefix cache (default: on)");
  cmd->add_flag("--device-sampling,!--cpu-sampling", o->device_sampling,
                "engine: sample on the GPU where the backend can (--cpu-sampling: every sampled "
                "row comes back to the CPU sampler; default: device)");
  cmd->add_option("--host-tier-bytes", o->host_tier,
                  "host memory for idle sessions' KV, e.g. 4GiB (0: no host tier)")
      ->capture_default_str();
  cmd->add_option("--tier-watermark", o->tier_watermark,
                  "with a host tier: below this share of free pool blocks, idle sessions are "
                  "copied out ahead of need, overlapping the next steps (0: only on demand)")
      ->check(CLI::Range(0.0, 1.0))
      ->capture_default_str();
  cmd->add_flag("--restore-joins-step,!--restore-waits", o->restore_joins_step,
                "a session coming back from a tier runs in the first step its copy is expected "
                "to end within, that step ordered after the copy (--restore-waits: in the first "
                "step after the copy is done; default: waits)");
  cmd->add_flag("--copy-out-overlap,!--copy-out-waits", o->copy_out_overlap,
                "a session or sequence moved to the host tier for room gives its blocks back "
                "as soon as its copy is queued, the next step writing them as each layer is read "
                "out (CUDA; default) (--copy-out-waits: the step starts after the whole copy)");
  cmd->add_flag("--keep-restored-copies,!--drop-restored-copies", o->keep_restored_copies,
                "a session restored from the host tier keeps its copy there while the tier has "
                "room, so its next move down copies only the blocks added since (default; "
                "models without sliding-window layers)");
  cmd->add_option("--restore-overlap", o->restore_overlap,
                  "which sessions coming back from a tier run in a step at once, each layer "
                  "waiting for its own blocks so the step computes while the copy lands (CUDA): "
                  "alone (into a step with no other sequence), copy-bound (also where the copy "
                  "outlasts the session's own prefill), always (the others' step then waits for "
                  "the copy), off")
      ->check(CLI::IsMember({"off", "alone", "copy-bound", "always"}))
      ->capture_default_str();
  cmd->add_option("--preemption", o->preemption,
                  "with a host tier, a running sequence preempted for room is swapped there or "
                  "recomputed: auto (the cheaper by measured copy and prefill rates), swap, "
                  "recompute")
      ->check(CLI::IsMember({"auto", "swap", "recompute"}))
      ->capture_default_str();
  cmd->add_option("--disk-dir", o->disk_dir,
                  "folder for idle sessions' cache files (empty: no disk tier)");
  cmd->add_option("--disk-tier-bytes", o->disk_tier,
                  "bytes of cache files for idle sessions (with --disk-dir; 0: 16GiB)")
      ->capture_default_str();
  cmd->add_option("--threads", o->threads, "CPU threads, the caller included (0: all cores)")
      ->check(CLI::Range(0, kMaxThreads))
      ->capture_default_str();
  cmd->add_option("--tensor-parallel", o->tensor_parallel,
                  "split the model over N GPUs (cuda:K to cuda:K+N-1, NCCL); on cpu N threads "
                  "emulate the GPUs (for tests, not speed)")
      ->check(CLI::Range(1, kMaxTensorParallel))
      ->capture_default_str();
}

Result<int64_t> parse_size(const std::string& text, const std::string& option, bool allow_zero) {
  size_t used = 0;
  double value = 0;
  try {
    value = std::stod(text, &used);
  } catch (...) {
    return Status::invalid_argument("{} '{}' is not a size (e.g. 512MiB, 2GiB)", option, text);
  }
  std::string unit = text.substr(used);
  std::transform(unit.begin(), unit.end(), unit.begin(), ::tolower);
  double scale = 1;
  if (unit.empty() || unit == "b") {
    scale = 1;
  } else if (unit == "k" || unit == "kib" || unit == "kb") {
    scale = 1024.0;
  } else if (unit == "m" || unit == "mib" || unit == "mb") {
    scale = 1024.0 * 1024;
  } else if (unit == "g" || unit == "gib" || unit == "gb") {
    scale = 1024.0 * 1024 * 1024;
  } else if (unit == "t" || unit == "tib" || unit == "tb") {
    scale = 1024.0 * 1024 * 1024 * 1024;
  } else {
    return Status::invalid_argument("{} '{}': unknown unit '{}' (B, KiB, MiB, GiB, TiB)", option,
                                    text, text.substr(used));
  }
  const double bytes = value * scale;
  if (!std::isfinite(bytes)) {
    return Status::invalid_argument("{} '{}' is not a finite size", option, text);
  }
  if (allow_zero && bytes == 0) return int64_t{0};
  if (!(bytes >= 1)) {
    return Status::invalid_argument("{} '{}' must be at least 1 byte", option, text);
  }
  if (bytes > kMaxSizeBytes) {
    return Status::invalid_argument("{} '{}' is over the limit of 1 PiB", option, text);
  }
  return static_cast<int64_t>(bytes);
}

Result<DType> parse_kv_dtype(const std::string& text) {
  if (text == "auto") return DType::BF16;
  const std::optional<DType> dtype = parse_kv_cache_dtype(text);
  if (!dtype) {
    return Status::invalid_argument(
        "--kv-dtype '{}': not a KV dtype (auto, f32, bf16, f16, int8, fp8)", text);
  }
  return *dtype;
}

Status check_engine_options(const EngineOptions& o) {
  if (o.model.empty() == o.random_model.empty()) {
    return Status::invalid_argument("give one of --model PATH and --random-model NAME{}",
                                    o.model.empty() ? "" : ", not both");
  }
  if (!o.tokenizer.empty() && o.random_model.empty()) {
    return Status::invalid_argument(
        "--tokenizer goes with --random-model (a --model brings its own)");
  }
  if (Result<Device> device = parse_device(o.device); !device.is_ok()) {
    return Status::invalid_argument("--device: {}", device.status().message());
  }
  KVP_RETURN_IF_ERROR(parse_kv_dtype(o.kv_dtype).status());
  if (o.block_size < 1 || o.block_size > 1024 || (o.block_size & (o.block_size - 1)) != 0) {
    return Status::invalid_argument("--block-size {}: not a power of two in [1, 1024]",
                                    o.block_size);
  }
  if (o.blocks == 0) KVP_RETURN_IF_ERROR(parse_size(o.kv_memory, "--kv-memory").status());
  KVP_RETURN_IF_ERROR(parse_size(o.host_tier, "--host-tier-bytes", true).status());
  KVP_RETURN_IF_ERROR(parse_size(o.disk_tier, "--disk-tier-bytes", true).status());
  if (!o.disk_dir.empty()) {
    std::error_code ec;
    if (fs::exists(o.disk_dir, ec) && !fs::is_directory(o.disk_dir, ec)) {
      return Status::invalid_argument("--disk-dir {}: exists and is not a folder", o.disk_dir);
    }
  }
  if (o.threads < 0 || o.threads > kMaxThreads) {
    return Status::invalid_argument("--threads {}: not in [0, {}]", o.threads, kMaxThreads);
  }
  if (o.tensor_parallel < 1 || o.tensor_parallel > kMaxTensorParallel) {
    return Status::invalid_argument("--tensor-parallel {}: not in [1, {}]", o.tensor_parallel,
                                    kMaxTensorParallel);
  }
  return Status::ok();
}

int32_t resolved_threads(const EngineOptions& o) {
  if (o.threads > 0) return o.threads;
  return static_cast<int32_t>(
      std::clamp<unsigned>(std::thread::hardware_concurrency(), 1u, unsigned{kMaxThreads}));
}

Result<LoadedModel> load_model(const EngineOptions& o, bool need_tokenizer,
                               const std::function<void(int32_t, int32_t)>& progress) {
  KVP_RETURN_IF_ERROR(check_engine_options(o));
  const bool random = !o.random_model.empty();
  if (random && need_tokenizer && o.tokenizer.empty()) {
    return Status::invalid_argument(
        "--random-model {} needs --tokenizer PATH here (its output "
        "ids are decoded to text)",
        o.random_model);
  }
  LoadedModel loaded;
  if (need_tokenizer) {
    Result<Tokenizer> tokenizer = load_tokenizer(random ? o.tokenizer : o.model);
    if (!tokenizer.is_ok()) return tokenizer.status();
    loaded.tokenizer.emplace(std::move(tokenizer).value());
  }
  loaded.pool = std::make_unique<ThreadPool>(resolved_threads(o));
  const auto start = std::chrono::steady_clock::now();
  LoadProgress on_progress;
  if (progress) on_progress = progress;
  Result<std::unique_ptr<ForwardBackend>> backend =
      random ? make_random_backend(o.random_model, o.device, /*seed=*/0, loaded.pool.get(),
                                   o.tensor_parallel)
             : load_backend(o.model, o.device, loaded.pool.get(), on_progress, o.tensor_parallel);
  if (!backend.is_ok()) return backend.status();
  loaded.backend = std::move(backend).value();
  if (random && loaded.tokenizer &&
      static_cast<int64_t>(loaded.tokenizer->num_tokens()) < loaded.backend->spec().vocab_size) {
    return Status::invalid_argument(
        "--tokenizer {}: {} tokens, fewer than random model {}'s vocabulary of {} (an output id "
        "would not decode)",
        o.tokenizer, loaded.tokenizer->num_tokens(), o.random_model,
        loaded.backend->spec().vocab_size);
  }
  loaded.load_seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  return loaded;
}

Result<EngineConfig> make_engine_config(const EngineOptions& o, const ForwardBackend& backend) {
  KVP_RETURN_IF_ERROR(check_engine_options(o));
  EngineConfig config;
  config.block_size = o.block_size;
  KVP_ASSIGN_OR_RETURN(config.kv_dtype, parse_kv_dtype(o.kv_dtype));
  config.max_num_seqs = o.max_seqs;
  config.max_step_tokens = o.step_tokens;
  config.prefix_caching = o.prefix_caching;
  config.device_sampling = o.device_sampling;
  if (o.blocks > 0) {
    config.num_blocks = o.blocks;
  } else {
    KVP_ASSIGN_OR_RETURN(const int64_t kv_bytes, parse_size(o.kv_memory, "--kv-memory"));
    const int64_t block_bytes = bytes_per_block(backend, o.block_size, config.kv_dtype);
    config.num_blocks = static_cast<int32_t>(std::min<int64_t>(kv_bytes / block_bytes, 1 << 24));
    if (config.num_blocks < 1) {
      return Status::invalid_argument(
          "--kv-memory {} holds no block of {} bytes (block size {}, KV {})", o.kv_memory,
          block_bytes, o.block_size, dtype_name(config.kv_dtype));
    }
  }
  KVP_ASSIGN_OR_RETURN(const int64_t host_bytes,
                       parse_size(o.host_tier, "--host-tier-bytes", true));
  config.host_tier_bytes = static_cast<uint64_t>(host_bytes);
  config.tier_watermark = o.tier_watermark;
  config.restore_joins_step = o.restore_joins_step;
  config.copy_out_overlap = o.copy_out_overlap;
  config.keep_restored_copies = o.keep_restored_copies;
  config.restore_overlap = o.restore_overlap == "always"       ? RestoreOverlap::kAlways
                           : o.restore_overlap == "copy-bound" ? RestoreOverlap::kCopyBound
                           : o.restore_overlap == "off"        ? RestoreOverlap::kOff
                           : o.restore_overlap == "alone"      ? RestoreOverlap::kAlone
                                                               : RestoreOverlap::kCopyBound;
  config.preemption = o.preemption == "swap"        ? Preemption::kSwap
                      : o.preemption == "recompute" ? Preemption::kRecompute
                                                    : Preemption::kAuto;
  config.disk_dir = o.disk_dir;
  if (!o.disk_dir.empty()) {
    KVP_ASSIGN_OR_RETURN(const int64_t disk_bytes,
                         parse_size(o.disk_tier, "--disk-tier-bytes", true));
    config.disk_tier_bytes =
        disk_bytes > 0 ? static_cast<uint64_t>(disk_bytes) : uint64_t{16} << 30;
  }
  if (Status s = Engine::check_config(backend, config); !s.is_ok()) {
    return Status::invalid_argument(
        "engine options (--block-size, --blocks/--kv-memory, "
        "--max-seqs, --step-tokens, tiers): {}",
        s.message());
  }
  return config;
}

std::string describe_weights(const ForwardBackend& backend) {
  const WeightFootprint w = backend.weight_footprint();
  if (w.resident_bytes == 0) return "";
  std::string formats;
  for (const auto& [name, bytes] : w.by_format) {
    formats += fmt::format("{}{} {:.1f} MB", formats.empty() ? "" : ", ", name, bytes / 1e6);
  }
  return fmt::format("weights {:.1f} MB resident ({}), a decode step reads {:.1f} MB + KV",
                     w.resident_bytes / 1e6, formats, w.decode_read_bytes / 1e6);
}

}  // namespace kvp::app
