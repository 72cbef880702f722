// Micro-benchmarks of the cache bookkeeping (ns per operation), each next to the floor it is
// measured against in the same run:
//   alloc+free                 vs a vector push_back/pop_back pair (the free-list stack alone)
//   append one token           (block size 16; a block allocated every 16th append)
//   fork of a 1K / 8K table    vs copying the same block-id vector
//   prefix match, 8K tokens    (block size 16) vs XXH3 over the same 32 KiB of token ids
//   slot mapping, 256 seqs     (decode: each sequence's newest slot) vs writing 256 int64s
//   pool simulator             block sizes 16..256 at equal pool memory; its outcome (utilisation,
//                              slot waste, prefix-hit rate, tier moves) as counters; once for a
//                              global-attention model, once with a sliding-window group
// Run: ./build/release/bench/cache_bench --benchmark_repetitions=5
//        --benchmark_report_aggregates_only=true   (add --benchmark_format=csv for CSV)
#include <benchmark/benchmark.h>

#include <numeric>
#include <random>
#include <vector>

#define XXH_INLINE_ALL
#include <xxhash.h>

#include "cache/block_allocator.h"
#include "cache/block_table.h"
#include "cache/pool_simulator.h"
#include "cache/prefix_cache.h"

namespace kvp {
namespace {

constexpr int32_t kBlockSize = 16;

void BM_Floor_VectorPushPop(benchmark::State& state) {
  std::vector<int32_t> stack(1024);  // [1024]
  std::iota(stack.begin(), stack.end(), 0);
  for (auto _ : state) {
    int32_t id = stack.back();
    stack.pop_back();
    benchmark::DoNotOptimize(id);
    stack.push_back(id);
  }
}
BENCHMARK(BM_Floor_VectorPushPop);

void BM_AllocFree(benchmark::State& state) {
  BlockAllocator a(1024);
  for (auto _ : state) {
    std::optional<BlockId> b = a.alloc();
    benchmark::DoNotOptimize(b);
    a.release(*b);
  }
}
BENCHMARK(BM_AllocFree);

void BM_AppendOneToken(benchmark::State& state) {
  BlockAllocator a(8192);
  BlockTable t(&a, kBlockSize);
  std::vector<BlockCopy> copies;
  for (auto _ : state) {
    if (!t.append(1, &copies)) [[unlikely]] {
      t.free();  // once per 128K appends
    }
    benchmark::DoNotOptimize(t);
  }
}
BENCHMARK(BM_AppendOneToken);

void BM_Floor_CopyBlockIds(benchmark::State& state) {
  const int32_t num_blocks = static_cast<int32_t>(state.range(0)) / kBlockSize;
  std::vector<BlockId> ids(num_blocks);  // [num_blocks]
  for (auto _ : state) {
    std::vector<BlockId> copy = ids;
    benchmark::DoNotOptimize(copy.data());
  }
}
BENCHMARK(BM_Floor_CopyBlockIds)->Arg(1024)->Arg(8192);

void BM_ForkAndFree(benchmark::State& state) {
  const int32_t num_tokens = static_cast<int32_t>(state.range(0));
  BlockAllocator a(2048);
  BlockTable t(&a, kBlockSize);
  t.append(num_tokens, nullptr);
  for (auto _ : state) {
    BlockTable child = t.fork();
    benchmark::DoNotOptimize(child);
  }  // the child's destructor releases its references
}
BENCHMARK(BM_ForkAndFree)->Arg(1024)->Arg(8192);

std::vector<int32_t> prompt_tokens(int32_t count) {
  std::mt19937 rng(1);
  std::vector<int32_t> tokens(count);  // [count]
  for (int32_t& t : tokens) t = static_cast<int32_t>(rng() % 150000);
  return tokens;
}

void BM_Floor_Xxh3Prompt8K(benchmark::State& state) {
  std::vector<int32_t> tokens = prompt_tokens(8192);
  for (auto _ : state) {
    uint64_t h = 0;
    for (size_t i = 0; i < tokens.size(); i += kBlockSize) {
      h = XXH3_64bits_withSeed(&tokens[i], kBlockSize * sizeof(int32_t), h);
    }
    benchmark::DoNotOptimize(h);
  }
}
BENCHMARK(BM_Floor_Xxh3Prompt8K);

void BM_PrefixMatch8K(benchmark::State& state) {
  const int32_t num_tokens = 8192;
  BlockAllocator a(4096);
  PrefixCache cache(&a, kBlockSize, 42);
  std::vector<int32_t> tokens = prompt_tokens(num_tokens);
  // Fill the cache with other prompts too, so the table is not trivially small.
  std::vector<BlockTable> others;
  for (int i = 0; i < 6; ++i) {
    std::vector<int32_t> other = prompt_tokens(num_tokens);
    for (int32_t& x : other) x += 1000 * (i + 1);
    others.emplace_back(&a, kBlockSize);
    others.back().append(num_tokens, nullptr);
    cache.register_blocks(other, others.back().blocks());
  }
  BlockTable t(&a, kBlockSize);
  t.append(num_tokens, nullptr);
  cache.register_blocks(tokens, t.blocks());
  int64_t hit_tokens = 0;
  for (auto _ : state) {
    PrefixMatch m = cache.match(tokens);
    hit_tokens = m.num_tokens;
    for (BlockId b : m.blocks) a.release(b);
  }
  state.counters["hit_tokens"] = static_cast<double>(hit_tokens);
}
BENCHMARK(BM_PrefixMatch8K)->Unit(benchmark::kMicrosecond);

void BM_Floor_Write256Slots(benchmark::State& state) {
  std::vector<int64_t> out(256);  // [batch]
  int64_t v = 0;
  for (auto _ : state) {
    for (int64_t& x : out) x = v++;
    benchmark::DoNotOptimize(out.data());
  }
}
BENCHMARK(BM_Floor_Write256Slots);

void BM_DecodeSlotMapping256(benchmark::State& state) {
  const int32_t batch = 256;
  BlockAllocator a(batch * 64);
  std::mt19937 rng(3);
  std::vector<BlockTable> tables;
  tables.reserve(batch);
  for (int32_t i = 0; i < batch; ++i) {
    tables.emplace_back(&a, kBlockSize);
    tables.back().append(1 + static_cast<int32_t>(rng() % 1000), nullptr);
  }
  std::vector<const BlockTable*> ptrs;  // [batch]
  for (const BlockTable& t : tables) ptrs.push_back(&t);
  std::vector<int64_t> slots(batch);  // [batch]
  for (auto _ : state) {
    fill_last_slots(ptrs, slots.data());
    benchmark::DoNotOptimize(slots.data());
  }
}
BENCHMARK(BM_DecodeSlotMapping256);

void BM_PrefillSlotMapping8K(benchmark::State& state) {
  BlockAllocator a(1024);
  BlockTable t(&a, kBlockSize);
  t.append(8192, nullptr);
  std::vector<int64_t> slots(8192);  // [num_tokens]
  for (auto _ : state) {
    t.fill_slots(0, 8192, slots.data());
    benchmark::DoNotOptimize(slots.data());
  }
}
BENCHMARK(BM_PrefillSlotMapping8K);

// 32 agents, 8 turns each, 8 at a time, a 1024-token system prompt, ~128 user + ~256 reply tokens
// per turn, on a device pool of 32K tokens and a host pool of 32K tokens whatever the block size
// (12 KiB of KV per token: Qwen2.5-0.5B's 24 layers x 2 KV heads x 64 dims x K,V x bf16).
void BM_PoolSimulator(benchmark::State& state) {
  PoolSimConfig c;
  c.block_size = static_cast<int32_t>(state.range(0));
  c.pool_blocks = 32768 / c.block_size;
  c.host_blocks = 32768 / c.block_size;
  c.bytes_per_block = int64_t{12288} * c.block_size;
  c.agents = 32;
  c.turns = 8;
  c.concurrency = 8;
  c.system_prompt_tokens = 1024;
  c.user_tokens = 128;
  c.reply_tokens = 256;
  PoolSimResult r;
  for (auto _ : state) r = simulate_pool(c).value();
  state.counters["util_mean"] = r.utilisation_mean;
  state.counters["util_peak"] = r.utilisation_peak;
  state.counters["slot_waste"] = r.slot_waste_mean;
  state.counters["prefix_hit"] = r.prefix_hit_rate;
  state.counters["ctx_reuse"] = r.context_reuse_rate;
  state.counters["offloads"] = static_cast<double>(r.offloads);
  state.counters["disk_saves"] = static_cast<double>(r.saves_to_disk);
  state.counters["evictions"] = static_cast<double>(r.evictions);
  state.counters["failed_turns"] = static_cast<double>(r.failed_turns);
}
BENCHMARK(BM_PoolSimulator)
    ->Arg(16)
    ->Arg(32)
    ->Arg(64)
    ->Arg(128)
    ->Arg(256)
    ->Unit(benchmark::kMillisecond);

// The same workload for a Gemma-3-270M-like model: 3 global layers and 15 sliding-window layers
// (window 512), 1 KV head x 256 dims, bf16: 3 KiB of KV per token in the global group, 15 KiB in
// the window group. Global pools of 32K tokens (device and host), window pools of 16K tokens.
void BM_PoolSimulatorWindow(benchmark::State& state) {
  PoolSimConfig c;
  c.block_size = static_cast<int32_t>(state.range(0));
  c.pool_blocks = 32768 / c.block_size;
  c.host_blocks = 32768 / c.block_size;
  c.bytes_per_block = int64_t{3072} * c.block_size;
  c.window_tokens = 512;
  c.window_pool_blocks = 16384 / c.block_size;
  c.window_host_blocks = 16384 / c.block_size;
  c.window_bytes_per_block = int64_t{15360} * c.block_size;
  c.agents = 32;
  c.turns = 8;
  c.concurrency = 8;
  c.system_prompt_tokens = 1024;
  c.user_tokens = 128;
  c.reply_tokens = 256;
  PoolSimResult r;
  for (auto _ : state) r = simulate_pool(c).value();
  state.counters["util_mean"] = r.utilisation_mean;
  state.counters["win_util_mean"] = r.window_utilisation_mean;
  state.counters["win_util_peak"] = r.window_utilisation_peak;
  state.counters["slot_waste"] = r.slot_waste_mean;
  state.counters["prefix_hit"] = r.prefix_hit_rate;
  state.counters["offloads"] = static_cast<double>(r.offloads);
  state.counters["disk_saves"] = static_cast<double>(r.saves_to_disk);
  state.counters["moved_MiB"] =
      static_cast<double>(r.bytes_transferred + r.bytes_saved_to_disk + r.bytes_loaded_from_disk) /
      (1 << 20);
  state.counters["failed_turns"] = static_cast<double>(r.failed_turns);
}
BENCHMARK(BM_PoolSimulatorWindow)
    ->Arg(16)
    ->Arg(32)
    ->Arg(64)
    ->Arg(128)
    ->Arg(256)
    ->Unit(benchmark::kMillisecond);

}  // namespace
}  // namespace kvp

BENCHMARK_MAIN();
