// `kvpool plan`: recomputes ADR-002's memory table from real config.json files. Per model: KV
// bytes per token, per block (block sizes 16 and 256 by default), per agent at the target context
// (a windowed group holds at most ceil(W / block) + 1 blocks), and how many agents fit the pool
// (CacheSpec::plan_pool: the budget is split between cache groups in proportion to what one
// agent needs in each). Notes say where ADR-002's figures differ. Then the pool simulation:
// agents taking turns on that pool (device, then host, then disk), per model and block size.
#include "plan.h"

#include <fmt/format.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <limits>
#include <optional>
#include <variant>

#include "cache/cache_spec.h"
#include "cache/pool_simulator.h"

namespace kvp::app {
namespace {

namespace fs = std::filesystem;

constexpr double kGiB = 1024.0 * 1024.0 * 1024.0;
constexpr double kMiB = 1024.0 * 1024.0;

// What ADR-002 (seeds/000_*.txt) says about a model; 0 / nullptr where it says nothing.
struct AdrFigures {
  int32_t num_layers = 0;
  int32_t head_dim = 0;             // its per-block arithmetic (Gemma 3: 240)
  int32_t num_windowed_layers = 0;  // layers it counts as sliding window
  double agent_mb_at_8k = 0;        // "per agent" at 8K, fp16, 256-token blocks
  int32_t agents_8bit_in_4gb = 0;   // "4 GB cache pool budget: ~N agents @ 8K (8-bit)"
  double window_waste_kb = 0;       // GPT-OSS "waste … ~600KB per agent"
};

struct Fixture {
  const char* file;
  const char* name;
  AdrFigures adr;
};

constexpr Fixture kFixtures[] = {
    {"llama-3.1-8b.json", "Llama 3.1 8B", {.num_layers = 32}},
    {"qwen2.5-7b.json", "Qwen 2.5 7B", {.num_layers = 48}},
    {"gemma-3-12b.json",
     "Gemma 3 12B",
     {.num_layers = 48,
      .head_dim = 240,
      .num_windowed_layers = 40,
      .agent_mb_at_8k = 360,
      .agents_8bit_in_4gb = 22}},
    {"gemma-3-270m.json", "Gemma 3 270M", {}},
    {"qwen1.5-moe-a2.7b.json", "Qwen1.5-MoE-A2.7B", {.num_layers = 24}},
    {"gpt-oss-20b.json", "GPT-OSS-20B", {.num_windowed_layers = 40, .window_waste_kb = 600}},
};

struct PlannedModel {
  std::string name;
  std::string source;  // the config file
  CacheSpec spec;
  std::optional<AdrFigures> adr;
};

// "912 MiB", "1.875 MiB", "128 KiB", "48 B".
std::string format_bytes(double bytes) {
  if (bytes < 1024) return fmt::format("{:.4g} B", bytes);
  if (bytes < kMiB) return fmt::format("{:.4g} KiB", bytes / 1024);
  if (bytes < kGiB) return fmt::format("{:.4g} MiB", bytes / kMiB);
  return fmt::format("{:.4g} GiB", bytes / kGiB);
}

std::string describe_layers(const CacheSpec& spec) {
  std::string out;
  for (const CacheGroup& g : spec.groups()) {
    if (!out.empty()) out += " + ";
    out += g.attention.is_windowed()
               ? fmt::format("{} win{}", g.layers.size(), g.attention.window_tokens)
               : fmt::format("{} global", g.layers.size());
  }
  return out;
}

int32_t num_windowed_layers(const CacheSpec& spec) {
  int32_t n = 0;
  for (const LayerAttention& a : spec.layer_attention()) n += a.is_windowed();
  return n;
}

std::optional<fs::path> find_fixture_dir() {
  std::vector<fs::path> candidates = {fs::path("tests/cache/fixtures")};
  std::error_code ec;
  const fs::path exe = fs::read_symlink("/proc/self/exe", ec);
  // build/<preset>/apps/kvpool -> the repository root is three levels up.
  if (!ec) candidates.push_back(exe.parent_path() / "../../../tests/cache/fixtures");
  for (const fs::path& dir : candidates) {
    if (fs::is_directory(dir, ec)) return dir;
  }
  return std::nullopt;
}

std::string name_for(const fs::path& path) {
  if (path.filename() == "config.json" && path.has_parent_path()) {
    return fs::absolute(path).parent_path().filename().string();
  }
  return path.stem().string();
}

// Loads the models: the configs named, or the fixtures. Prints an error and returns nullopt on
// the first bad file.
std::optional<std::vector<PlannedModel>> load_models(const PlanOptions& options) {
  std::vector<PlannedModel> models;
  auto load = [&](const fs::path& path, std::string name, std::optional<AdrFigures> adr) {
    Result<CacheSpec> spec = CacheSpec::from_hf_config_file(path);
    if (!spec.is_ok()) {
      fmt::print(stderr, "kvpool plan: {}\n", spec.status().to_string());
      return false;
    }
    models.push_back({std::move(name), path.string(), std::move(spec).value(), adr});
    return true;
  };
  if (!options.config_paths.empty()) {
    for (const std::string& path : options.config_paths) {
      if (!load(path, name_for(path), std::nullopt)) return std::nullopt;
    }
    return models;
  }
  const std::optional<fs::path> dir = find_fixture_dir();
  if (!dir) {
    fmt::print(stderr,
               "kvpool plan: cannot find the model configs (tests/cache/fixtures); run from the "
               "repository root or name configs with --config\n");
    return std::nullopt;
  }
  for (const Fixture& f : kFixtures) {
    if (!load(*dir / f.file, f.name, f.adr)) return std::nullopt;
  }
  return models;
}

// Prints rows as columns: the first num_left columns left-aligned, the rest right-aligned. A row
// shorter than the first (the header) is a note: its first cell is aligned, the rest follows as
// it is and does not widen the columns.
void print_aligned(const std::vector<std::vector<std::string>>& rows, size_t num_left) {
  if (rows.empty()) return;
  const size_t num_columns = rows[0].size();
  std::vector<size_t> widths(num_columns, 0);
  for (const auto& row : rows) {
    const size_t counted = row.size() < num_columns ? std::min<size_t>(1, row.size()) : row.size();
    for (size_t i = 0; i < counted && i < num_columns; ++i) {
      widths[i] = std::max(widths[i], row[i].size());
    }
  }
  for (const auto& row : rows) {
    std::string line;
    for (size_t i = 0; i < row.size(); ++i) {
      const bool aligned = i < num_columns && (row.size() >= num_columns || i == 0);
      if (!aligned) {
        line += row[i] + "  ";
      } else if (i < num_left) {
        line += fmt::format("{:<{}}  ", row[i], widths[i]);
      } else {
        line += fmt::format("{:>{}}  ", row[i], widths[i]);
      }
    }
    while (!line.empty() && line.back() == ' ') line.pop_back();
    fmt::print("{}\n", line);
  }
}

void print_table(const std::vector<PlannedModel>& models, const PlanOptions& options,
                 uint64_t budget_bytes) {
  std::vector<std::string> header = {"model", "layers", "KV heads x dim", "KV/token"};
  for (int32_t b : options.block_sizes) header.push_back(fmt::format("block {}", b));
  for (int32_t b : options.block_sizes) header.push_back(fmt::format("agent (b{})", b));
  for (int32_t b : options.block_sizes) header.push_back(fmt::format("agents (b{})", b));
  for (int32_t b : options.block_sizes) header.push_back(fmt::format("8-bit (b{})", b));

  std::vector<std::vector<std::string>> rows = {header};
  for (const PlannedModel& m : models) {
    std::vector<std::string> row = {
        m.name, describe_layers(m.spec),
        fmt::format("{} x {} {}", m.spec.num_kv_heads(), m.spec.head_dim(),
                    dtype_name(m.spec.dtype())),
        fmt::format("{} ({})", format_bytes(static_cast<double>(m.spec.kv_bytes_per_token())),
                    m.spec.kv_bytes_per_token())};
    for (int32_t b : options.block_sizes) {
      row.push_back(format_bytes(static_cast<double>(m.spec.kv_bytes_per_token()) * b));
    }
    for (int32_t b : options.block_sizes) {
      row.push_back(format_bytes(
          static_cast<double>(m.spec.with_block_size(b).seq_bytes(options.context_tokens))));
    }
    for (int32_t b : options.block_sizes) {
      row.push_back(fmt::format(
          "{}",
          m.spec.with_block_size(b).plan_pool(budget_bytes, options.context_tokens).num_seqs));
    }
    for (int32_t b : options.block_sizes) {
      // int8 and fp8 take the same bytes
      const CacheSpec kv8 = m.spec.with_dtype(DType::I8).with_block_size(b);
      row.push_back(
          fmt::format("{}", kv8.plan_pool(budget_bytes, options.context_tokens).num_seqs));
    }
    rows.push_back(std::move(row));
  }
  print_aligned(rows, 3);
}

// Where ADR-002's figures differ from the real configs, recomputed at its own settings
// (8K context, 256-token blocks, 16-bit elements, 4 GB pool).
void print_adr_notes(const std::vector<PlannedModel>& models) {
  std::vector<std::string> notes;
  for (const PlannedModel& m : models) {
    if (!m.adr) continue;
    const AdrFigures& adr = *m.adr;
    const CacheSpec spec = m.spec.with_block_size(256);
    if (adr.num_layers != 0 && adr.num_layers != spec.num_layers()) {
      notes.push_back(fmt::format("{}: ADR-002 says {} layers; config.json says {}.", m.name,
                                  adr.num_layers, spec.num_layers()));
    }
    if (adr.head_dim != 0 && adr.head_dim != spec.head_dim()) {
      notes.push_back(fmt::format(
          "{}: ADR-002 computes with head_dim {} (hidden / heads); the model's head_dim is {} "
          "(config.json omits it; transformers' default), so a 256-token block of one layer is "
          "{}, not {:.4g} MiB.",
          m.name, adr.head_dim, spec.head_dim(),
          format_bytes(static_cast<double>(spec.layer_token_bytes()) * 256),
          2.0 * spec.num_kv_heads() * adr.head_dim * 2 * 256 / kMiB));
    }
    const int32_t windowed = num_windowed_layers(spec);
    if (adr.num_windowed_layers != 0 && adr.num_windowed_layers != windowed) {
      notes.push_back(
          fmt::format("{}: ADR-002 counts {} sliding-window layers; config.json has {} "
                      "of {}.",
                      m.name, adr.num_windowed_layers, windowed, spec.num_layers()));
    }
    if (adr.agent_mb_at_8k != 0) {
      // ADR-002 caps a window at ceil(W / 256) blocks; kvpool at ceil(W / 256) + 1.
      uint64_t adr_cap_bytes = 0;
      for (int32_t g = 0; g < spec.num_groups(); ++g) {
        const LayerAttention& a = spec.group(g).attention;
        int64_t blocks = (8192 + 255) / 256;
        if (a.is_windowed()) blocks = std::min<int64_t>(blocks, (a.window_tokens + 255) / 256);
        adr_cap_bytes += static_cast<uint64_t>(blocks) * spec.block_bytes(g);
      }
      const uint64_t ours = spec.seq_bytes(8192);
      notes.push_back(fmt::format(
          "{}: ADR-002 says {:.4g} MB per agent at 8K (16-bit, 256-token blocks); recomputed: "
          "{} with its ceil(W/256)-block window cap, {} with the ceil(W/256)+1 cap a window "
          "that straddles block edges needs. (Its sum counts the global layers' blocks once, "
          "not once per global layer.)",
          m.name, adr.agent_mb_at_8k, format_bytes(static_cast<double>(adr_cap_bytes)),
          format_bytes(static_cast<double>(ours))));
      if (adr.agents_8bit_in_4gb != 0) {
        const double pool = 4 * kGiB;
        notes.push_back(fmt::format(
            "{}: ADR-002 fits ~{} agents at 8K with 8-bit KV in a 4 GB pool; at half the 16-bit "
            "bytes that is {} (its cap) or {} (+1 cap); with kvpool's 8-bit KV (--kv-dtype int8 or "
            "fp8, "
            "an f16 scale per head vector included), {}; with 16-bit KV, {}.",
            m.name, adr.agents_8bit_in_4gb,
            static_cast<int64_t>(pool / (static_cast<double>(adr_cap_bytes) / 2)),
            static_cast<int64_t>(pool / (static_cast<double>(ours) / 2)),
            spec.with_dtype(DType::I8).plan_pool(static_cast<uint64_t>(pool), 8192).num_seqs,
            spec.with_dtype(DType::BF16).plan_pool(static_cast<uint64_t>(pool), 8192).num_seqs));
      }
    }
    if (adr.window_waste_kb != 0) {
      for (const CacheGroup& g : spec.groups()) {
        if (!g.attention.is_windowed() || g.attention.window_tokens >= 256) continue;
        const double waste = static_cast<double>(256 - g.attention.window_tokens) *
                             static_cast<double>(g.layers.size()) *
                             static_cast<double>(spec.layer_token_bytes());
        notes.push_back(fmt::format(
            "{}: ADR-002 puts the waste of window {} in 256-token blocks at ~{:.4g} KB per agent; "
            "{} unused token slots in each of {} windowed layers at {} per token per layer "
            "are {}.",
            m.name, g.attention.window_tokens, adr.window_waste_kb, 256 - g.attention.window_tokens,
            g.layers.size(), format_bytes(static_cast<double>(spec.layer_token_bytes())),
            format_bytes(waste)));
      }
    }
  }
  if (notes.empty()) return;
  fmt::print("\nWhere ADR-002 differs:\n");
  for (const std::string& note : notes) fmt::print("  - {}\n", note);
}

// Pools larger than this are not simulated (the allocator's free list would dominate the run).
constexpr int64_t kMaxSimBlocks = int64_t{1} << 22;

struct SimRow {
  int32_t block_size = 0;
  std::optional<PoolSimResult> result;  // nullopt: not simulated, see note
  std::string note;
};

// The simulator's geometry for `spec` at `block_size`: the global group, plus one sliding-window
// group if the model has one. Both pools (device and host) are split between the groups as in
// the table (CacheSpec::plan_pool at the target context). Returns a note instead when the model
// cannot be simulated as it is.
std::variant<PoolSimConfig, std::string> sim_config(const CacheSpec& model_spec,
                                                    const PlanOptions& options,
                                                    uint64_t budget_bytes, int32_t block_size) {
  const CacheSpec spec = model_spec.with_block_size(block_size);
  std::optional<int32_t> global_group;
  std::vector<int32_t> window_groups;
  for (int32_t g = 0; g < spec.num_groups(); ++g) {
    if (spec.group(g).attention.is_windowed()) {
      window_groups.push_back(g);
    } else {
      global_group = g;
    }
  }
  if (!global_group) return std::string("no global-attention layers (the simulator needs them)");
  if (window_groups.size() > 1) {
    return fmt::format("{} sliding-window groups (the simulator takes one)", window_groups.size());
  }
  const PoolPlan device = spec.plan_pool(budget_bytes, options.context_tokens);
  const auto host_budget = static_cast<uint64_t>(options.host_gib * kGiB);
  PoolPlan host;
  if (host_budget > 0) host = spec.plan_pool(host_budget, options.context_tokens);
  auto host_blocks = [&](int32_t g) { return host_budget > 0 ? host.num_blocks[g] : 0; };

  PoolSimConfig c;
  c.block_size = block_size;
  c.pool_blocks = device.num_blocks[*global_group];
  c.host_blocks = host_blocks(*global_group);
  c.bytes_per_block = static_cast<int64_t>(spec.block_bytes(*global_group));
  if (!window_groups.empty()) {
    const int32_t w = window_groups[0];
    c.window_tokens = spec.group(w).attention.window_tokens;
    c.window_pool_blocks = device.num_blocks[w];
    c.window_host_blocks = host_blocks(w);
    c.window_bytes_per_block = static_cast<int64_t>(spec.block_bytes(w));
  }
  c.agents = options.sim_agents;
  c.turns = options.sim_turns;
  c.concurrency = options.sim_concurrency;
  c.system_prompt_tokens = options.system_prompt_tokens;
  c.user_tokens = options.turn_tokens;
  c.reply_tokens = options.reply_tokens;
  c.seed = options.sim_seed;
  const int64_t largest =
      std::max({c.pool_blocks, c.host_blocks, c.window_pool_blocks, c.window_host_blocks});
  if (largest > kMaxSimBlocks) {
    return fmt::format("{} blocks in one pool (more than {}: lower --pool-gb or --host-gb)",
                       largest, kMaxSimBlocks);
  }
  if (c.pool_blocks < 1 || (c.window_tokens > 0 && c.window_pool_blocks < 1)) {
    return std::string("the pool holds no block of this size");
  }
  return c;
}

std::string percent(double fraction) { return fmt::format("{:.1f}%", fraction * 100); }

// The simulation (src/cache/pool_simulator.h): N agents take turns on the pool planned above, in
// batches of `concurrency`, sharing a system prompt; their histories stay as sessions and move
// down to host memory and disk when the device pool runs short. One table per model, one row per
// block size. Returns false (after printing the error) if the simulator refuses a config.
bool print_simulation(const std::vector<PlannedModel>& models, const PlanOptions& options,
                      uint64_t budget_bytes) {
  fmt::print(
      "\nSimulation: {} agents x {} turns, {} at a time; a shared system prompt of {} tokens; "
      "per turn ~{} user + ~{} reply tokens (+-50%, seed {}).\nPools: device {:.4g} GiB, host "
      "{:.4g} GiB (then disk), split between cache groups as in the table above.\n",
      options.sim_agents, options.sim_turns, options.sim_concurrency, options.system_prompt_tokens,
      options.turn_tokens, options.reply_tokens, options.sim_seed, options.pool_gib,
      options.host_gib);
  fmt::print(
      "blocks: device pool blocks (global group + window group).\n"
      "util: used blocks over pool blocks after each batch, mean / peak; win util: the window "
      "group's mean.\n"
      "waste: allocated but unfilled slots over allocated slots (global group, mean).\n"
      "prefix hit: prompt tokens served by the prefix cache (the shared system prompt).\n"
      "reuse: context not recomputed (sessions + prefix cache) over what a stateless server "
      "would recompute.\n"
      "evicted: cached blocks reclaimed. offload / disk: sessions moved to host / to disk. "
      "failed: turns that found no room.\n");
  for (const PlannedModel& m : models) {
    fmt::print("\n{} ({}):\n", m.name, describe_layers(m.spec));
    std::vector<std::vector<std::string>> rows = {{"block", "blocks", "util", "win util", "waste",
                                                   "prefix hit", "reuse", "evicted", "offload",
                                                   "disk", "failed"}};
    for (int32_t block_size : options.sim_block_sizes) {
      auto config = sim_config(m.spec, options, budget_bytes, block_size);
      if (const auto* note = std::get_if<std::string>(&config)) {
        rows.push_back({fmt::format("{}", block_size), fmt::format("not simulated: {}", *note)});
        continue;
      }
      const PoolSimConfig& c = std::get<PoolSimConfig>(config);
      Result<PoolSimResult> result = simulate_pool(c);
      if (!result.is_ok()) {
        fmt::print(stderr, "kvpool plan: simulation of {} at block size {}: {}\n", m.name,
                   block_size, result.status().to_string());
        return false;
      }
      const PoolSimResult& r = *result;
      rows.push_back({
          fmt::format("{}", block_size),
          c.window_tokens > 0 ? fmt::format("{} + {}", c.pool_blocks, c.window_pool_blocks)
                              : fmt::format("{}", c.pool_blocks),
          fmt::format("{} / {}", percent(r.utilisation_mean), percent(r.utilisation_peak)),
          c.window_tokens > 0 ? percent(r.window_utilisation_mean) : "-",
          percent(r.slot_waste_mean),
          percent(r.prefix_hit_rate),
          percent(r.context_reuse_rate),
          fmt::format("{}", r.evictions),
          fmt::format("{}", r.offloads),
          fmt::format("{}", r.saves_to_disk),
          fmt::format("{}", r.failed_turns),
      });
    }
    print_aligned(rows, 0);
  }
  return true;
}

}  // namespace

CLI::App* add_plan_command(CLI::App& app, PlanOptions* options) {
  CLI::App* plan = app.add_subcommand(
      "plan",
      "KV memory per model and agents per pool, from config.json files (ADR-002's table "
      "recomputed), then the pool simulation");
  plan->add_option("--config", options->config_paths,
                   "Hugging Face config.json files (default: the six fixture models in "
                   "tests/cache/fixtures)");
  plan->add_option("--pool-gb", options->pool_gib, "KV pool budget in GiB")
      ->check(CLI::Range(0.001, 1048576.0))
      ->capture_default_str();
  plan->add_option("--context", options->context_tokens, "tokens of context per agent")
      ->check(CLI::Range(int64_t{1}, int64_t{1} << 31))
      ->capture_default_str();
  plan->add_option("--block-size", options->block_sizes,
                   "block sizes to compare (powers of two, 1..1024)")
      ->check(CLI::Range(1, 1024))
      ->capture_default_str();
  plan->add_option("--host-gb", options->host_gib,
                   "simulation: host (offload) pool in GiB; 0 sends idle sessions to disk")
      ->check(CLI::Range(0.0, 1048576.0))
      ->capture_default_str();
  plan->add_option("--agents", options->sim_agents, "simulation: agents")
      ->check(CLI::Range(1, 100000))
      ->capture_default_str();
  plan->add_option("--turns", options->sim_turns, "simulation: turns per agent")
      ->check(CLI::Range(1, 100000))
      ->capture_default_str();
  plan->add_option("--concurrency", options->sim_concurrency,
                   "simulation: agents taking their turn at once")
      ->check(CLI::Range(1, 100000))
      ->capture_default_str();
  plan->add_option("--system-prompt-tokens", options->system_prompt_tokens,
                   "simulation: tokens of the system prompt all agents share")
      ->check(CLI::Range(0, 1 << 20))
      ->capture_default_str();
  plan->add_option("--turn-tokens", options->turn_tokens,
                   "simulation: user tokens per turn (mean; lengths vary +-50%)")
      ->check(CLI::Range(1, 1 << 20))
      ->capture_default_str();
  plan->add_option("--reply-tokens", options->reply_tokens,
                   "simulation: generated tokens per turn (mean; lengths vary +-50%)")
      ->check(CLI::Range(0, 1 << 20))
      ->capture_default_str();
  plan->add_option("--seed", options->sim_seed,
                   "simulation: seed of the turn lengths and token ids")
      ->capture_default_str();
  plan->add_option("--sim-block-size", options->sim_block_sizes,
                   "simulation: block sizes to simulate (powers of two, 1..1024)")
      ->check(CLI::Range(1, 1024))
      ->capture_default_str();
  return plan;
}

int run_plan(const PlanOptions& options) {
  for (int32_t b : options.block_sizes) {
    if ((b & (b - 1)) != 0) {
      fmt::print(stderr, "kvpool plan: --block-size {}: not a power of two\n", b);
      return 2;
    }
  }
  for (int32_t b : options.sim_block_sizes) {
    if ((b & (b - 1)) != 0) {
      fmt::print(stderr, "kvpool plan: --sim-block-size {}: not a power of two\n", b);
      return 2;
    }
  }
  const int64_t agent_tokens =
      options.system_prompt_tokens +
      int64_t{options.sim_turns} * (options.turn_tokens + options.reply_tokens) * 3 / 2;
  if (agent_tokens > std::numeric_limits<int32_t>::max()) {
    fmt::print(stderr,
               "kvpool plan: --system-prompt-tokens, --turns, --turn-tokens, --reply-tokens: one "
               "agent's history ({} tokens at most) does not fit 32-bit token counts\n",
               agent_tokens);
    return 2;
  }
  const double budget = options.pool_gib * kGiB;
  if (!(budget >= 1.0) || budget > 1e18) {
    fmt::print(stderr, "kvpool plan: --pool-gb {}: out of range\n", options.pool_gib);
    return 2;
  }
  const uint64_t budget_bytes = static_cast<uint64_t>(budget);
  const std::optional<std::vector<PlannedModel>> models = load_models(options);
  if (!models) return 2;

  fmt::print("kvpool plan: pool {:.4g} GiB ({} bytes), {} tokens of context per agent\n",
             options.pool_gib, budget_bytes, options.context_tokens);
  fmt::print(
      "KV/token: K and V of one token in every layer (in bytes in parentheses). block N: one block "
      "of N tokens in every "
      "layer.\nagent (bN): one agent's blocks at that context (a window of W tokens holds at "
      "most ceil(W/N)+1 blocks).\nagents (bN): agents that fit the pool, split between cache "
      "groups in proportion to one agent's need.\n8-bit (bN): the same with --kv-dtype int8 or fp8 "
      "(8-bit KV, an f16 scale per head vector: 0.508x of bf16 at head dim 128).\nSizes in B, KiB, "
      "MiB, "
      "GiB (powers of "
      "1024).\n\n");
  print_table(*models, options, budget_bytes);
  fmt::print("\nConfigs: ");
  for (size_t i = 0; i < models->size(); ++i) {
    fmt::print("{}{}", i ? ", " : "", (*models)[i].source);
  }
  fmt::print("\n");
  print_adr_notes(*models);
  if (!print_simulation(*models, options, budget_bytes)) return 1;
  return 0;
}

}  // namespace kvp::app
