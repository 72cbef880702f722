// `kvpool perplexity` (perplexity_cmd.h). Windows as llama-perplexity makes them: the tokens of
// the whole text are cut into consecutive windows of --ctx tokens (the rest is dropped); each
// window is one forward pass from an empty cache (its first token replaced by BOS when the vocab
// adds one), and tokens ctx/2 + 1 .. ctx - 1 are scored from the logits of the rows before them,
// so every scored token sees at least ctx/2 tokens of context.
//
// --logits-out / --kl-base file (host byte order):
//   header  char magic[8] = "KVPLOGP1" | int32 vocab_size | int32 top_k | int64 num_rows
//   rows    [num_rows] of { int32 ids[top_k]; float log_probs[top_k] }, by decreasing log-prob
// KL(base || this) sums over the base row's top-k tokens plus one bucket for the rest of the
// vocabulary (exact when top_k is the vocabulary, a slight underestimate otherwise).
#include "perplexity_cmd.h"

#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <iterator>
#include <numeric>
#include <span>
#include <vector>

namespace kvp::app {
namespace {

constexpr char kMagic[8] = {'K', 'V', 'P', 'L', 'O', 'G', 'P', '1'};

struct LogitsHeader {
  int32_t vocab_size = 0;
  int32_t top_k = 0;
  int64_t num_rows = 0;
};

Result<std::string> read_text(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return Status::not_found("--text-file {}: cannot open it", path);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

Status write_header(std::ofstream& out, const LogitsHeader& h) {
  out.write(kMagic, sizeof kMagic);
  out.write(reinterpret_cast<const char*>(&h.vocab_size), sizeof h.vocab_size);
  out.write(reinterpret_cast<const char*>(&h.top_k), sizeof h.top_k);
  out.write(reinterpret_cast<const char*>(&h.num_rows), sizeof h.num_rows);
  return out ? Status::ok() : Status::io_error("--logits-out: cannot write the header");
}

Result<LogitsHeader> read_header(std::ifstream& in, const std::string& path) {
  char magic[8];
  LogitsHeader h;
  in.read(magic, sizeof magic);
  in.read(reinterpret_cast<char*>(&h.vocab_size), sizeof h.vocab_size);
  in.read(reinterpret_cast<char*>(&h.top_k), sizeof h.top_k);
  in.read(reinterpret_cast<char*>(&h.num_rows), sizeof h.num_rows);
  if (!in || std::memcmp(magic, kMagic, sizeof magic) != 0 || h.top_k < 1 ||
      h.top_k > h.vocab_size || h.num_rows < 0) {
    return Status::corruption("--kl-base {}: not a kvpool perplexity --logits-out file", path);
  }
  return h;
}

struct Totals {
  int64_t num_scored = 0;
  double nll_sum = 0;
  double kl_sum = 0;
  int64_t top1_same = 0;
};

// What one row needs besides its logits: where its top-k goes and where the base row comes from.
struct RowIo {
  int32_t top_k = 0;              // of --logits-out
  std::ofstream* out = nullptr;   // --logits-out, or null
  int32_t base_k = 0;             // of --kl-base
  std::ifstream* base = nullptr;  // --kl-base, or null
};

// Scores one logits row [vocab_size] predicting `target`; writes its top-k and compares it with
// the base's next row. log_probs and order: [vocab_size] scratch.
Status score_row(std::span<const float> logits, int32_t target, const RowIo& io,
                 std::vector<float>& log_probs, std::vector<int32_t>& order, Totals& totals) {
  const int32_t vocab_size = static_cast<int32_t>(logits.size());
  const auto max_at = std::max_element(logits.begin(), logits.end());
  const int32_t argmax = static_cast<int32_t>(max_at - logits.begin());
  double sum = 0;
  for (const float l : logits) sum += std::exp(static_cast<double>(l - *max_at));
  const float log_z = *max_at + static_cast<float>(std::log(sum));
  for (int32_t i = 0; i < vocab_size; ++i) log_probs[i] = logits[i] - log_z;
  totals.nll_sum -= log_probs[target];
  ++totals.num_scored;
  if (io.out != nullptr) {
    std::iota(order.begin(), order.end(), 0);
    std::partial_sort(
        order.begin(), order.begin() + io.top_k, order.end(), [&](int32_t a, int32_t b) {
          return log_probs[a] > log_probs[b] || (log_probs[a] == log_probs[b] && a < b);
        });
    std::vector<float> top(io.top_k);
    for (int32_t i = 0; i < io.top_k; ++i) top[i] = log_probs[order[i]];
    io.out->write(reinterpret_cast<const char*>(order.data()), io.top_k * sizeof(int32_t));
    io.out->write(reinterpret_cast<const char*>(top.data()), io.top_k * sizeof(float));
    if (!*io.out) return Status::io_error("--logits-out: cannot write a row");
  }
  if (io.base != nullptr) {
    std::vector<int32_t> ids(io.base_k);
    std::vector<float> base_lp(io.base_k);
    io.base->read(reinterpret_cast<char*>(ids.data()), io.base_k * sizeof(int32_t));
    io.base->read(reinterpret_cast<char*>(base_lp.data()), io.base_k * sizeof(float));
    if (!*io.base) return Status::corruption("--kl-base: the file ends early");
    double kl = 0, base_mass = 0, this_mass = 0;
    for (int32_t i = 0; i < io.base_k; ++i) {
      if (ids[i] < 0 || ids[i] >= vocab_size) {
        return Status::corruption("--kl-base: token id {} outside the vocabulary", ids[i]);
      }
      const double p = std::exp(static_cast<double>(base_lp[i]));
      kl += p * (static_cast<double>(base_lp[i]) - log_probs[ids[i]]);
      base_mass += p;
      this_mass += std::exp(static_cast<double>(log_probs[ids[i]]));
    }
    const double base_rest = std::max(0.0, 1.0 - base_mass);
    const double this_rest = std::max(1e-30, 1.0 - this_mass);
    if (base_rest > 0) kl += base_rest * std::log(base_rest / this_rest);
    totals.kl_sum += kl;
    totals.top1_same += ids[0] == argmax ? 1 : 0;
  }
  return Status::ok();
}

Status run(const PerplexityOptions& o, const Tokenizer& tokenizer, ForwardBackend& backend) {
  KVP_ASSIGN_OR_RETURN(const std::string text, read_text(o.text_file));
  EncodeOptions encode;
  encode.add_special_tokens = false;
  KVP_ASSIGN_OR_RETURN(std::vector<TokenId> tokens, tokenizer.encode(text, encode));
  const int32_t ctx = o.ctx;
  const int64_t num_windows = static_cast<int64_t>(tokens.size()) / ctx;
  if (num_windows == 0) {
    return Status::invalid_argument(
        "--text-file {}: {} tokens, fewer than one window of --ctx {} tokens (give a longer text "
        "or a smaller --ctx)",
        o.text_file, tokens.size(), ctx);
  }
  const int32_t first = ctx / 2;  // rows first .. ctx-2 predict tokens first+1 .. ctx-1
  const int32_t rows_per_window = ctx - 1 - first;
  const int32_t vocab_size = backend.spec().vocab_size;
  const int64_t num_rows = num_windows * rows_per_window;

  KVP_ASSIGN_OR_RETURN(const DType dtype, parse_kv_dtype(o.engine.kv_dtype));
  KVP_RETURN_IF_ERROR(backend.check_kv_dtype(dtype));
  const int32_t block_size = o.engine.block_size;
  const int32_t num_blocks = (ctx + block_size - 1) / block_size;
  std::vector<KvLayout> layouts;
  for (int32_t g = 0; g < backend.num_cache_groups(); ++g) {
    layouts.push_back(backend.group_layout(g, num_blocks, block_size, dtype));
  }
  KVP_RETURN_IF_ERROR(backend.allocate_kv(layouts));

  if (!o.logits_out.empty() && o.logits_out == o.kl_base) {
    return Status::invalid_argument("--logits-out {} is also --kl-base: it would be overwritten",
                                    o.logits_out);
  }
  RowIo io;
  std::ofstream out;
  if (!o.logits_out.empty()) {
    out.open(o.logits_out, std::ios::binary | std::ios::trunc);
    if (!out) return Status::io_error("--logits-out {}: cannot create it", o.logits_out);
    io.top_k = std::min(o.top_k, vocab_size);
    io.out = &out;
    KVP_RETURN_IF_ERROR(write_header(out, {vocab_size, io.top_k, num_rows}));
  }
  std::ifstream base;
  if (!o.kl_base.empty()) {
    base.open(o.kl_base, std::ios::binary);
    if (!base) return Status::not_found("--kl-base {}: cannot open it", o.kl_base);
    KVP_ASSIGN_OR_RETURN(const LogitsHeader h, read_header(base, o.kl_base));
    if (h.vocab_size != vocab_size || h.num_rows != num_rows) {
      return Status::mismatch(
          "--kl-base {}: {} rows of vocabulary {}, this run scores {} rows of vocabulary {} (same "
          "model, text and --ctx?)",
          o.kl_base, h.num_rows, h.vocab_size, num_rows, vocab_size);
    }
    io.base_k = h.top_k;
    io.base = &base;
  }

  std::vector<int32_t> window(ctx), query_start = {0, ctx}, kv_lens = {ctx}, logit_rows;
  std::vector<int64_t> slots(ctx);
  std::vector<int32_t> block_table(num_blocks);
  std::iota(slots.begin(), slots.end(), int64_t{0});  // block b holds tokens b*block_size ..
  std::iota(block_table.begin(), block_table.end(), 0);
  for (int32_t r = first; r < ctx - 1; ++r) logit_rows.push_back(r);
  ForwardBatch batch;
  batch.token_ids = window;
  batch.query_start = query_start;
  batch.kv_lens = kv_lens;
  for (int32_t g = 0; g < backend.num_cache_groups(); ++g) {
    batch.groups.push_back({slots, block_table, num_blocks});
  }
  batch.logit_rows = logit_rows;
  std::vector<float> logits(static_cast<size_t>(rows_per_window) * vocab_size);
  std::vector<float> log_probs(vocab_size);
  std::vector<int32_t> order(vocab_size);
  // -1: the vocabulary adds no BOS (a plain int: g++ 12 warns on an optional here)
  const TokenId bos = tokenizer.vocab().add_bos ? tokenizer.vocab().bos_id.value_or(-1) : -1;
  const bool tty = isatty(2) != 0;  // progress only on a terminal
  Totals totals;
  for (int64_t w = 0; w < num_windows; ++w) {
    std::copy_n(tokens.begin() + w * ctx, ctx, window.begin());
    if (bos >= 0) window[0] = bos;
    KVP_RETURN_IF_ERROR(backend.forward(batch, logits));
    for (int32_t i = 0; i < rows_per_window; ++i) {
      const std::span<const float> row(logits.data() + static_cast<size_t>(i) * vocab_size,
                                       vocab_size);
      KVP_RETURN_IF_ERROR(score_row(row, window[first + i + 1], io, log_probs, order, totals));
    }
    if (tty)
      std::fprintf(stderr, "\rwindow %lld/%lld", static_cast<long long>(w + 1),
                   static_cast<long long>(num_windows));
  }
  if (tty) std::fputc('\n', stderr);
  const double mean_nll = totals.nll_sum / totals.num_scored;
  std::printf("%s: %zu tokens, %lld windows of %d (KV %s, block %d)\n", o.text_file.c_str(),
              tokens.size(), static_cast<long long>(num_windows), ctx,
              std::string(dtype_name(dtype)).c_str(), block_size);
  std::printf("tokens scored %lld, mean NLL %.6f, perplexity %.4f\n",
              static_cast<long long>(totals.num_scored), mean_nll, std::exp(mean_nll));
  if (io.out != nullptr) {
    std::printf("wrote %s (top-%d log-probabilities of %lld rows)\n", o.logits_out.c_str(),
                io.top_k, static_cast<long long>(num_rows));
  }
  if (io.base != nullptr) {
    std::printf("KL(base || this) vs %s: mean %.6f, top-1 agreement %.2f %%\n", o.kl_base.c_str(),
                totals.kl_sum / totals.num_scored,
                100.0 * static_cast<double>(totals.top1_same) / totals.num_scored);
  }
  return Status::ok();
}

}  // namespace

CLI::App* add_perplexity_command(CLI::App& app, PerplexityOptions* o) {
  CLI::App* cmd = app.add_subcommand(
      "perplexity", "Perplexity of a model over a text file (and KL against a baseline run)");
  add_engine_options(cmd, &o->engine);
  cmd->add_option("--text-file,-f", o->text_file, "The text to score (UTF-8)")->required();
  cmd->add_option("--ctx,-c", o->ctx, "Tokens per window; the second half of each is scored")
      ->check(CLI::Range(4, 1 << 20));
  cmd->add_option("--logits-out", o->logits_out,
                  "Write the scored rows' top-k log-probabilities to FILE (for --kl-base)");
  cmd->add_option("--logits-top-k", o->top_k, "Log-probabilities per row in --logits-out")
      ->check(CLI::Range(1, 1 << 24));
  cmd->add_option(
      "--kl-base", o->kl_base,
      "A --logits-out FILE of a baseline run: report KL(base || this), top-1 agreement");
  return cmd;
}

int run_perplexity(const PerplexityOptions& o) {
  if (Status s = check_engine_options(o.engine); !s.is_ok()) {
    std::fprintf(stderr, "kvpool perplexity: %s\n", s.message().c_str());
    return 2;
  }
  Result<LoadedModel> loaded = load_model(o.engine, /*need_tokenizer=*/true);
  if (!loaded.is_ok()) {
    std::fprintf(stderr, "kvpool perplexity: %s\n", loaded.status().to_string().c_str());
    return 2;
  }
  const Status s = run(o, *loaded->tokenizer, *loaded->backend);
  if (!s.is_ok()) {
    std::fprintf(stderr, "kvpool perplexity: %s\n", s.message().c_str());
    const StatusCode code = s.code();
    return code == StatusCode::kInternal || code == StatusCode::kResourceExhausted ? 1 : 2;
  }
  return 0;
}

}  // namespace kvp::app
