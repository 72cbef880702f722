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
#include "engine_options.h"

namespace kvp::app {

struct GenerateOptions {
  EngineOptions engine;  // model, device, pool, threads (engine_options.h)
  std::string prompt;
  int32_t max_tokens = 128;
  float temperature = 0.7f;
  float top_p = 0.95f;
  int32_t top_k = 40;
  std::optional<uint64_t> seed;
  std::vector<std::string> stop;  // stop strings (Request::stop_strings)
  std::string chat_template;      // a Jinja file instead of the model's own template
  std::string system;             // a system message (none: the template's default)
  bool raw = false;               // no chat template: the prompt as-is
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

}  // namespace kvp::app
