// `kvpool perplexity`: perplexity of a model over a text file, windows scored as llama-perplexity
// scores them, with the KV of each window held in the paged pool (so --kv-dtype matters); and
// the KL divergence of its next-token distributions against an earlier run's (--kl-base).
#pragma once

#include <CLI/CLI.hpp>

#include <cstdint>
#include <string>

#include "engine_options.h"

namespace kvp::app {

struct PerplexityOptions {
  EngineOptions engine;    // model, device, --kv-dtype, --block-size, threads
  std::string text_file;   // the text to score (UTF-8)
  int32_t ctx = 512;       // tokens per window; the second half of each is scored
  std::string logits_out;  // write the scored rows' top-k log-probabilities here
  int32_t top_k = 1024;    // log-probabilities per row in --logits-out
  std::string kl_base;     // a --logits-out file of a baseline run: report KL(base || this)
};

CLI::App* add_perplexity_command(CLI::App& app, PerplexityOptions* options);
// Exit code: 0, 2 for bad input (files, options, a text shorter than one window), 1 for a
// failure of the run.
int run_perplexity(const PerplexityOptions& options);

}  // namespace kvp::app
