#include "generate.h"

#include <fmt/format.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <thread>

#include "cache/kv_layout.h"
#include "cache/kv_quant.h"
#include "engine/engine.h"
#include "model/gguf_model.h"
#include "model/model_config.h"
#include "model/model_loader.h"
#include "server/chat_template.h"
#include "tokenizer/detokenizer.h"

namespace kvp::app {
namespace {

using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point t) {
  return std::chrono::duration<double>(Clock::now() - t).count();
}

// A one-line progress bar on stderr while a model loads (only when stderr is a terminal).
class ProgressBar {
 public:
  explicit ProgressBar(std::string label) : label_(std::move(label)), tty_(isatty(2) != 0) {}
  void update(int32_t done, int32_t total) {
    if (!tty_ || total <= 0) return;
    constexpr int kWidth = 30;
    const int filled = static_cast<int>(int64_t{kWidth} * done / total);
    std::fprintf(stderr, "\r%s [%s%s] %d/%d layers", label_.c_str(),
                 std::string(filled, '#').c_str(), std::string(kWidth - filled, '.').c_str(), done,
                 total);
    if (done == total) std::fputc('\n', stderr);
    std::fflush(stderr);
  }

 private:
  std::string label_;
  bool tty_;
};

// The generated text printed so far and what is held back within a step: the token that
// completes a stop string may carry text past it, which is not printed.
class StopAwareOutput {
 public:
  explicit StopAwareOutput(const std::vector<std::string>& stop) : stop_(stop) {}
  void add(const std::string& piece) { pending_ += piece; }
  // Prints what is pending; when `stopped_by_string`, only up to the end of the first stop
  // string in the text, and remembers which one it was.
  void flush(bool stopped_by_string) {
    if (stopped_by_string) {
      const std::string text = printed_ + pending_;
      size_t end = std::string::npos;
      for (const std::string& s : stop_) {
        const size_t at = text.find(s);
        if (at != std::string::npos && (end == std::string::npos || at + s.size() < end)) {
          end = at + s.size();
          matched_ = s;
        }
      }
      if (end != std::string::npos)
        pending_.resize(end > printed_.size() ? end - printed_.size() : 0);
    }
    std::fwrite(pending_.data(), 1, pending_.size(), stdout);
    std::fflush(stdout);
    printed_ += pending_;
    pending_.clear();
  }
  // The stop string that ended the text, if one did.
  const std::optional<std::string>& matched() const { return matched_; }

 private:
  const std::vector<std::string>& stop_;
  std::string printed_, pending_;
  std::optional<std::string> matched_;
};

// Why generation ended, for the stats line.
std::string stop_cause(FinishReason reason, bool eos, const std::optional<std::string>& stop_string,
                       int32_t max_tokens) {
  switch (reason) {
    case FinishReason::kStop:
      if (stop_string) return fmt::format("stopped by --stop \"{}\"", *stop_string);
      return eos ? "stopped by end-of-sequence token" : "stopped by a stop token";
    case FinishReason::kLength:
      return fmt::format("stopped at --max-tokens {}", max_tokens);
    case FinishReason::kCancelled:
      return "cancelled";
    case FinishReason::kAborted:
      return "aborted: the KV pool cannot hold the request (raise --kv-memory)";
  }
  return "?";
}

}  // namespace

CLI::App* add_generate_command(CLI::App& app, GenerateOptions* o) {
  CLI::App* cmd = app.add_subcommand("generate", "Generate text from a model, streaming it");
  add_engine_options(cmd, &o->engine);
  cmd->add_option("--prompt,-p", o->prompt, "Prompt text (a user message, unless --raw)")
      ->required();
  cmd->add_option("--system", o->system, "A system message (default: the template's own)");
  cmd->add_option("--max-tokens,-n", o->max_tokens, "Tokens to generate at most")
      ->check(CLI::Range(1, 1 << 20));
  cmd->add_option("--temperature", o->temperature, "0: greedy")->check(finite_range(0.0, 100.0));
  cmd->add_option("--top-p", o->top_p, "Nucleus sampling mass, (0, 1]")
      ->check(finite_range(0.0, 1.0));
  cmd->add_option("--top-k", o->top_k, "Keep the k most likely tokens (0: off)")
      ->check(CLI::Range(0, 1 << 24));
  cmd->add_option("--seed", o->seed, "Sampling seed (same seed, same text)");
  cmd->add_option("--stop", o->stop,
                  "End generation when the text contains TEXT (repeatable; the text ends there)");
  cmd->add_option("--chat-template", o->chat_template,
                  "A Jinja chat template file instead of the model's own");
  cmd->add_flag("--raw", o->raw, "Send the prompt as-is (no chat template)");
  cmd->add_flag("--no-stats", o->quiet_stats, "Do not print the stats line");
  return cmd;
}

int run_generate(const GenerateOptions& o) {
  for (const std::string& stop : o.stop) {
    if (stop.empty()) {
      std::fprintf(stderr, "kvpool generate: --stop: an empty stop string\n");
      return 2;
    }
  }
  if (Status s = check_engine_options(o.engine); !s.is_ok()) {
    std::fprintf(stderr, "kvpool generate: %s\n", s.message().c_str());
    return 2;
  }
  ProgressBar bar("loading " + o.engine.model);
  Result<LoadedModel> loaded =
      load_model(o.engine, /*need_tokenizer=*/true,
                 [&](int32_t done, int32_t total) { bar.update(done, total); });
  if (!loaded.is_ok()) {
    std::fprintf(stderr, "kvpool generate: %s\n", loaded.status().to_string().c_str());
    return 2;
  }
  const Tokenizer& tokenizer = *loaded->tokenizer;
  ForwardBackend& backend = *loaded->backend;
  const ModelSpec& spec = backend.spec();

  std::string text = o.prompt;
  if (!o.raw) {
    Result<ChatTemplate> chat_template =
        load_chat_template(o.engine.model, tokenizer, o.chat_template);
    if (!chat_template.is_ok()) {
      std::fprintf(stderr, "kvpool generate: %s (--raw sends the prompt as-is)\n",
                   chat_template.status().to_string().c_str());
      return 2;
    }
    ChatTemplateInputs inputs;
    if (!o.system.empty()) {
      inputs.messages.push_back({{"role", "system"}, {"content", o.system}});
    }
    inputs.messages.push_back({{"role", "user"}, {"content", o.prompt}});
    Result<std::string> rendered = chat_template->render(inputs);
    if (!rendered.is_ok()) {
      std::fprintf(stderr, "kvpool generate: %s\n", rendered.status().to_string().c_str());
      return 2;
    }
    text = std::move(rendered).value();
  }
  EncodeOptions encode;
  encode.add_special_tokens = o.raw;  // a rendered template already holds its special tokens
  auto prompt = tokenizer.encode(text, encode);
  if (!prompt.is_ok()) {
    std::fprintf(stderr, "kvpool generate: the prompt: %s\n", prompt.status().to_string().c_str());
    return 2;
  }
  if (prompt->empty()) {
    std::fprintf(stderr, "kvpool generate: the prompt '%s' has no tokens\n", text.c_str());
    return 2;
  }

  Result<EngineConfig> made = make_engine_config(o.engine, backend);
  if (!made.is_ok()) {
    std::fprintf(stderr, "kvpool generate: %s\n", made.status().message().c_str());
    return 2;
  }
  EngineConfig config = std::move(made).value();
  config.tokenizer = &tokenizer;
  auto engine = Engine::create(&backend, config);
  if (!engine.is_ok()) {
    std::fprintf(stderr, "kvpool generate: %s\n", engine.status().to_string().c_str());
    return 2;
  }

  Request request;
  request.prompt_tokens = *prompt;
  request.max_tokens = o.max_tokens;
  request.sampling.temperature = o.temperature;
  request.sampling.top_p = o.top_p;
  request.sampling.top_k = o.top_k;
  request.sampling.seed = o.seed;
  request.stop_strings = o.stop;
  auto id = (*engine)->submit(request);
  if (!id.is_ok()) {
    std::fprintf(stderr, "kvpool generate: %s\n", id.status().to_string().c_str());
    return 2;
  }

  IncrementalDetokenizer detok(tokenizer, /*skip_special=*/true);
  StopAwareOutput out(o.stop);
  const Clock::time_point start = Clock::now();
  double first_token_s = 0;
  int32_t num_generated = 0;
  int32_t peak_blocks = 0;
  Usage usage;
  FinishReason reason = FinishReason::kStop;
  bool last_was_eos = false;
  while ((*engine)->has_unfinished()) {
    bool finished = false;
    for (const EngineEvent& e : (*engine)->step()) {
      if (e.kind == EngineEvent::Kind::kToken) {
        if (num_generated++ == 0) first_token_s = seconds_since(start);
        last_was_eos = std::find(spec.eos_token_ids.begin(), spec.eos_token_ids.end(),
                                 e.token_id) != spec.eos_token_ids.end();
        if (last_was_eos) continue;
        auto piece = detok.push(e.token_id);
        if (piece.is_ok()) out.add(*piece);
      } else if (e.request_finished) {
        usage = e.usage;
        reason = e.finish_reason;
        finished = true;
      }
    }
    if (finished) out.add(detok.finish());
    out.flush(finished && reason == FinishReason::kStop && !last_was_eos && !o.stop.empty());
    peak_blocks = std::max(peak_blocks, (*engine)->stats().num_blocks_used);
  }
  std::fputc('\n', stdout);
  std::fflush(stdout);
  const double total_s = seconds_since(start);
  if (!o.quiet_stats) {
    const double decode_s = total_s - first_token_s;
    const int32_t decoded = std::max(0, num_generated - 1);
    const std::string cause = stop_cause(reason, last_was_eos, out.matched(), o.max_tokens);
    std::fprintf(stderr,
                 "[kvpool] %s | prompt %d tokens | prefill %.1f tok/s | decode %.1f tok/s (%d "
                 "tokens, %s) | KV %s blocks %d / %d (block %d, peak) | load %.2f s\n",
                 backend.device_name().c_str(), usage.prompt_tokens,
                 first_token_s > 0 ? usage.prefilled_tokens / first_token_s : 0,
                 decode_s > 0 ? decoded / decode_s : 0.0, num_generated, cause.c_str(),
                 std::string(dtype_name(config.kv_dtype)).c_str(), peak_blocks, config.num_blocks,
                 o.engine.block_size, loaded->load_seconds);
    if (const std::string w = describe_weights(backend); !w.empty()) {
      std::fprintf(stderr, "[kvpool] %s\n", w.c_str());
    }
  }
  return 0;
}

CLI::App* add_inspect_command(CLI::App& app, InspectOptions* o) {
  CLI::App* cmd =
      app.add_subcommand("inspect", "Print a model file's metadata, tensors and KV cache geometry");
  cmd->add_option("path", o->path, "GGUF file, .safetensors file or model directory")->required();
  cmd->add_option("--max-tensors", o->max_tensors, "Tensors to list")
      ->check(CLI::Range(0, 1 << 20));
  cmd->add_option("--block-size", o->block_size, "Tokens per KV block for the geometry")
      ->check(CLI::Range(1, 1024));
  return cmd;
}

int run_inspect(const InspectOptions& o) {
  if ((o.block_size & (o.block_size - 1)) != 0) {
    std::fprintf(stderr, "kvpool inspect: --block-size %d: not a power of two in [1, 1024]\n",
                 o.block_size);
    return 2;
  }
  auto text = inspect_model_file(o.path, static_cast<size_t>(o.max_tensors));
  if (!text.is_ok()) {
    std::fprintf(stderr, "kvpool inspect: %s\n", text.status().to_string().c_str());
    return 2;
  }
  std::fputs(text->c_str(), stdout);
  // The runner's view: architecture and cache geometry.
  Result<ModelSpec> spec = Status::not_found("no spec");
  if (is_gguf_file(o.path)) {
    auto file = GgufFile::open(o.path);
    spec = file.is_ok() ? model_spec_from_gguf(*file) : Result<ModelSpec>(file.status());
  } else {
    spec = load_hf_config(o.path + "/config.json");
  }
  if (!spec.is_ok()) {
    std::printf("\nkvpool runner: cannot run this model: %s\n", spec.status().to_string().c_str());
    return 0;
  }
  const ModelSpec& s = *spec;
  int32_t sliding = 0;
  for (bool b : s.layer_is_sliding) sliding += b ? 1 : 0;
  std::printf("\nkvpool runner: %s, %d layers (%d global, %d sliding-window of %d tokens)\n",
              architecture_name(s.architecture), s.num_layers, s.num_layers - sliding, sliding,
              s.sliding_window);
  for (DType dtype : {DType::F32, DType::BF16, DType::I8, DType::FP8}) {
    // K and V bytes of one token in one layer (8-bit: a scale per head vector included)
    const auto per_layer_token =
        static_cast<int64_t>(2 * s.num_kv_heads * kv_vector_bytes(dtype, s.head_dim));
    std::printf(
        "  KV %-4s: %lld bytes per token (all layers), %lld bytes per block of %d tokens"
        " per layer\n",
        std::string(dtype_name(dtype)).c_str(),
        static_cast<long long>(per_layer_token * s.num_layers),
        static_cast<long long>(per_layer_token * o.block_size), o.block_size);
  }
  // The weights as the CPU runner holds them: the file's block formats in place (mapped), or
  // converted where no kernel reads the format.
  auto runner = kvp::load_model(o.path, nullptr);
  if (!runner.is_ok()) {
    std::printf("  weights: cannot load: %s\n", runner.status().to_string().c_str());
    return 0;
  }
  const ModelWeights& w = (*runner)->weights();
  std::printf("  weights (CPU): %.1f MB resident, a decode step reads %.1f MB + KV\n",
              w.matrix_bytes() / 1e6, w.decode_read_bytes() / 1e6);
  for (const auto& [format, bytes] : w.matrix_bytes_by_format()) {
    std::printf("    %-6s %10.1f MB\n", format.c_str(), bytes / 1e6);
  }
  return 0;
}

}  // namespace kvp::app
