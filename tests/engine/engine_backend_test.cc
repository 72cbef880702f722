// The engine on the ForwardBackend interface (model/forward_backend.h): config errors that
// depend on the backend, and an engine on a backend that stores blocks elsewhere than the CPU
// backend does behaving exactly as on the CPU backend — outputs, copy-on-write, session tiers
// and cache files (which hold the logical layout, so they move between backends).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <map>

#include <unistd.h>

#include "engine/cpu_backend_wrapper.h"
#include "engine/engine.h"
#include "engine/engine_test_util.h"

using namespace kvp::engine_test;  // NOLINT(google-build-using-namespace)

namespace kvp {
namespace {

// A CPU backend whose block b lives in physical block (b * 5 + 3) mod num_blocks: a device whose
// placement differs from the logical ids. It counts what the engine asks of it.
class PermutingBackend final : public CpuBackendWrapper {
 public:
  using CpuBackendWrapper::CpuBackendWrapper;
  std::string device_name() const override { return "permuting test device"; }
  Status check_kv_dtype(DType dtype) const override {
    if (dtype == DType::F16) {
      return Status::invalid_argument("KV dtype f16 is not one the {} holds", device_name());
    }
    return inner_.check_kv_dtype(dtype);
  }
  Status allocate_kv(std::span<const KvLayout> layouts) override {
    if (refuse_allocation) return Status::resource_exhausted("{}: out of memory", device_name());
    KVP_CHECK(layouts[0].num_blocks % 5 != 0, "the permutation needs blocks coprime to 5");
    return inner_.allocate_kv(layouts);
  }

  Status forward(const ForwardBatch& batch, std::span<float> logits) override {
    ++num_forwards;
    ForwardBatch physical = batch;
    std::vector<std::vector<int64_t>> slots(batch.groups.size());
    std::vector<std::vector<int32_t>> tables(batch.groups.size());
    for (size_t g = 0; g < batch.groups.size(); ++g) {
      const int32_t block_size = kv_layout(static_cast<int32_t>(g)).block_size;
      for (int64_t slot : batch.groups[g].slot_mapping) {
        slots[g].push_back(int64_t{place(BlockId(static_cast<int32_t>(slot / block_size))).value} *
                               block_size +
                           slot % block_size);
      }
      for (int32_t b : batch.groups[g].block_tables) tables[g].push_back(place(BlockId(b)).value);
      physical.groups[g].slot_mapping = slots[g];
      physical.groups[g].block_tables = tables[g];
    }
    return inner_.forward(physical, logits);
  }
  // With `summarize` on, it reduces rows itself, as the CUDA backend does: a plain reference
  // (first maximum, log-sum-exp in double), and copies only the rows asked for.
  bool summarizes_logits() const override { return summarize; }
  Status forward_summarized(const ForwardBatch& batch, std::span<const int32_t> full_rows,
                            std::span<float> logits,
                            std::span<LogitRowSummary> summaries) override {
    const size_t vocab = static_cast<size_t>(spec().vocab_size);
    std::vector<float> all(batch.logit_rows.size() * vocab);
    KVP_RETURN_IF_ERROR(forward(batch, all));
    for (size_t r = 0; r < batch.logit_rows.size(); ++r) {
      const float* row = all.data() + r * vocab;
      const size_t best = std::max_element(row, row + vocab) - row;
      double sum = 0.0;
      for (size_t i = 0; i < vocab; ++i) sum += std::exp(double(row[i]) - row[best]);
      summaries[r] = {static_cast<int32_t>(best), row[best],
                      static_cast<float>(row[best] + std::log(sum))};
    }
    for (size_t i = 0; i < full_rows.size(); ++i) {
      std::copy_n(all.data() + size_t(full_rows[i]) * vocab, vocab, logits.data() + i * vocab);
    }
    num_summarized_rows += static_cast<int64_t>(batch.logit_rows.size());
    num_full_rows += static_cast<int64_t>(full_rows.size());
    return Status::ok();
  }
  Status copy_blocks(int32_t group, std::span<const BlockCopy> ops) override {
    std::vector<BlockCopy> physical;
    for (const BlockCopy& op : ops) physical.push_back({place(op.src), place(op.dst), op.group});
    num_copied_blocks += static_cast<int64_t>(ops.size());
    return inner_.copy_blocks(group, physical);
  }
  Status read_blocks(int32_t group, std::span<const BlockId> blocks,
                     std::span<std::byte> image) const override {
    num_read_blocks += static_cast<int64_t>(blocks.size());
    return inner_.read_blocks(group, places(blocks), image);
  }
  Status write_blocks(int32_t group, std::span<const BlockId> blocks,
                      std::span<const std::byte> image) override {
    num_written_blocks += static_cast<int64_t>(blocks.size());
    return inner_.write_blocks(group, places(blocks), image);
  }

  bool refuse_allocation = false;
  bool summarize = false;
  int64_t num_summarized_rows = 0;
  int64_t num_full_rows = 0;
  int64_t num_forwards = 0;
  int64_t num_copied_blocks = 0;
  mutable int64_t num_read_blocks = 0;
  int64_t num_written_blocks = 0;

 private:
  BlockId place(BlockId b) const {
    const int32_t n = inner_.kv_layout(0).num_blocks;
    return b.value < 0 || b.value >= n ? b : BlockId((b.value * 5 + 3) % n);  // bad ids stay bad
  }
  std::vector<BlockId> places(std::span<const BlockId> blocks) const {
    std::vector<BlockId> out;
    for (BlockId b : blocks) out.push_back(place(b));
    return out;
  }
};

std::vector<char> file_bytes(const std::filesystem::path& path) {
  std::ifstream in(path, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

TEST(EngineBackend, CreateRefusesConfigsTheBackendCannotHoldAndSaysWhy) {
  auto runner = load("llama");
  PermutingBackend backend(runner);
  EngineConfig config = small_config(64);
  config.kv_dtype = DType::F16;
  auto engine = Engine::create(&backend, config);
  ASSERT_FALSE(engine.is_ok());
  EXPECT_EQ(engine.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(engine.status().message().find("f16"), std::string::npos)
      << engine.status().to_string();
  EXPECT_NE(engine.status().message().find("permuting test device"), std::string::npos)
      << engine.status().to_string();

  config.kv_dtype = static_cast<DType>(9);
  CpuForwardBackend cpu(runner);
  EXPECT_EQ(Engine::create(&cpu, config).status().code(), StatusCode::kInvalidArgument);
  config.kv_dtype = DType::BF16;
  config.block_size = 6;
  engine = Engine::create(&cpu, config);
  EXPECT_EQ(engine.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(engine.status().message().find("block size 6"), std::string::npos)
      << engine.status().to_string();

  backend.refuse_allocation = true;
  engine = Engine::create(&backend, small_config(64));
  EXPECT_EQ(engine.status().code(), StatusCode::kResourceExhausted);
  EXPECT_NE(engine.status().message().find("64 blocks"), std::string::npos)
      << engine.status().to_string();
  EXPECT_NE(engine.status().message().find("out of memory"), std::string::npos)
      << engine.status().to_string();

  // a good config on the same backends serves
  backend.refuse_allocation = false;
  for (ForwardBackend* b : std::initializer_list<ForwardBackend*>{&backend, &cpu}) {
    engine = Engine::create(b, small_config(64));
    ASSERT_TRUE(engine.is_ok()) << engine.status().to_string();
    auto id = (*engine)->submit(greedy_request(golden_ids("llama", "prompt_1"), 32));
    ASSERT_TRUE(id.is_ok());
    EXPECT_EQ(run_all(**engine)[id->value].tokens, golden_ids("llama", "greedy_1"));
  }
}

// Forks of n samples share the prompt's blocks; the partial last block is copied (copy-on-write
// through the backend). Seeded sampling gives the same samples wherever the blocks live.
TEST(EngineBackend, OutputsAndCopyOnWriteAreTheSameOnABackendThatPlacesBlocksElsewhere) {
  for (const char* model : {"llama", "gemma3"}) {
    SCOPED_TRACE(model);
    auto runner = load(model);
    auto run = [&](ForwardBackend* backend) {
      Engine engine(backend, small_config(127));
      Request greedy = greedy_request(golden_ids(model, "prompt_1"), 32);
      Request sampled = greedy_request(golden_ids(model, "prompt_2"), 12);
      sampled.n = 4;
      sampled.sampling.temperature = 1.0f;
      sampled.sampling.seed = 11;
      const RequestId greedy_id = engine.submit(greedy).value();
      const RequestId sampled_id = engine.submit(sampled).value();
      std::map<int32_t, std::vector<int32_t>> samples;
      std::vector<int32_t> greedy_tokens;
      while (engine.has_unfinished()) {
        for (const EngineEvent& e : engine.step()) {
          if (e.kind != EngineEvent::Kind::kToken) continue;
          if (e.request_id == greedy_id) greedy_tokens.push_back(e.token_id);
          if (e.request_id == sampled_id) samples[e.sample_index].push_back(e.token_id);
        }
        engine.check_integrity();
      }
      EXPECT_EQ(greedy_tokens, golden_ids(model, "greedy_1"));
      return samples;
    };
    CpuForwardBackend cpu(runner);
    PermutingBackend permuting(runner);
    const auto expected = run(&cpu);
    EXPECT_EQ(run(&permuting), expected);
    EXPECT_EQ(expected.size(), 4u);
    EXPECT_GT(permuting.num_copied_blocks, 0) << "no copy-on-write went through the backend";
  }
}

// On a backend that summarizes logits rows, greedy rows come from the summaries (no logits
// copied) and every other row from its full logits: tokens and logprobs as on the CPU backend,
// for a batch that mixes greedy requests with sampled ones, a logprobs list and min_tokens.
TEST(EngineBackend, GreedyRowsFromSummariesMatchFullLogits) {
  auto runner = load("llama");
  auto run = [&](ForwardBackend* backend) {
    Engine engine(backend, small_config(254));
    std::vector<Request> requests;
    for (int i = 0; i < 8; ++i) {
      Request r = greedy_request(golden_ids("llama", i % 2 ? "prompt_1" : "prompt_2"), 10 + i);
      r.min_tokens = 0;
      r.ignore_eos = true;
      if (i == 1) r.sampling.temperature = 0.9f, r.sampling.seed = 5;
      if (i == 3) r.sampling.num_logprobs = 2;
      if (i == 5) r.min_tokens = 4;
      requests.push_back(r);
    }
    std::map<int64_t, std::vector<std::pair<int32_t, float>>> out;
    for (const Request& r : requests) KVP_CHECK(engine.submit(r).is_ok(), "submit");
    while (engine.has_unfinished()) {
      for (const EngineEvent& e : engine.step()) {
        if (e.kind == EngineEvent::Kind::kToken) {
          out[e.request_id.value].emplace_back(e.token_id, e.logprob);
        }
      }
    }
    return out;
  };
  CpuForwardBackend cpu(runner);
  PermutingBackend summarizing(runner);
  summarizing.summarize = true;
  const auto want = run(&cpu);
  const auto got = run(&summarizing);
  ASSERT_EQ(got.size(), want.size());
  for (const auto& [id, tokens] : want) {
    const auto& g = got.at(id);
    ASSERT_EQ(g.size(), tokens.size()) << "request " << id;
    for (size_t i = 0; i < tokens.size(); ++i) {
      EXPECT_EQ(g[i].first, tokens[i].first) << "request " << id << " token " << i;
      EXPECT_NEAR(g[i].second, tokens[i].second, 1e-4) << "request " << id << " token " << i;
    }
  }
  // 3 of the 8 requests need their rows (temperature, logprobs; min_tokens for 4 tokens), the
  // others never
  EXPECT_GT(summarizing.num_full_rows, 0);
  EXPECT_LT(summarizing.num_full_rows, summarizing.num_summarized_rows / 2);
}

// A session moved to the host tier leaves the pool through read_blocks and comes back through
// write_blocks, and continues as if it had stayed.
TEST(EngineBackend, HostTierMovesGoThroughBlockImages) {
  for (const char* model : {"llama", "gemma3"}) {
    SCOPED_TRACE(model);
    auto runner = load(model);
    PermutingBackend backend(runner);
    EngineConfig config = small_config(127);
    config.host_tier_bytes = 64 << 20;
    Engine engine(&backend, config);
    const auto turn1 = golden_ids(model, "prompt_1");
    const auto prompt2 = golden_ids(model, "prompt_2");
    const std::vector<int32_t> turn2(prompt2.begin(), prompt2.begin() + 3);
    Request r1 = greedy_request(turn1, 8);
    r1.session = "agent";
    const RequestId id1 = engine.submit(r1).value();
    const std::vector<int32_t> reply1 = run_all(engine)[id1.value].tokens;
    for (int i = 0; i < 3; ++i) {
      ASSERT_TRUE(engine.submit(greedy_request(std::vector<int32_t>(150, 10 + i), 20)).is_ok());
    }
    run_all(engine);
    ASSERT_EQ(engine.sessions()[0].tier, SessionTier::kHost);
    EXPECT_GT(backend.num_read_blocks, 0);
    const int64_t written_before = backend.num_written_blocks;
    Request r2 = greedy_request(turn2, 16);
    r2.session = "agent";
    const RequestId id2 = engine.submit(r2).value();
    const std::vector<int32_t> reply2 = run_all(engine)[id2.value].tokens;
    EXPECT_GT(backend.num_written_blocks, written_before);
    EXPECT_EQ(engine.sessions()[0].num_restores, 1);

    std::vector<int32_t> whole = turn1;
    whole.insert(whole.end(), reply1.begin(), reply1.end());
    whole.insert(whole.end(), turn2.begin(), turn2.end());
    CpuForwardBackend cpu(runner);
    Engine reference(&cpu, small_config(256));
    const RequestId ref_id = reference.submit(greedy_request(whole, 16)).value();
    EXPECT_EQ(reply2, run_all(reference)[ref_id.value].tokens);
  }
}

// Cache files hold the logical layout: the file one backend's engine writes is byte for byte the
// other's, and it continues identically in an engine on either (of the same KV dtype: files
// carry their dtype, and another is refused as another geometry).
TEST(EngineBackend, CacheFilesMoveBetweenBackends) {
  for (const auto& [model, dtype] :
       {std::pair{"llama", DType::F32}, std::pair{"gemma3", DType::F32},
        std::pair{"llama", DType::BF16}}) {
    SCOPED_TRACE(std::string(model) + " " + std::string(dtype_name(dtype)));
    EngineConfig config = small_config(127);
    config.kv_dtype = dtype;
    auto runner = load(model);
    const std::filesystem::path dir = std::filesystem::temp_directory_path() /
                                      ("kvp-engine-backend-" + std::to_string(::getpid()) + "-" +
                                       model + "-" + std::string(dtype_name(dtype)));
    std::filesystem::create_directories(dir);
    const auto turn1 = golden_ids(model, "prompt_1");
    const auto prompt2 = golden_ids(model, "prompt_2");
    const std::vector<int32_t> turn2(prompt2.begin(), prompt2.begin() + 3);

    CpuForwardBackend cpu(runner);
    PermutingBackend permuting(runner);
    std::vector<ForwardBackend*> backends = {&cpu, &permuting};
    std::vector<std::filesystem::path> files = {dir / "cpu.kvc", dir / "permuting.kvc"};
    for (size_t i = 0; i < backends.size(); ++i) {
      Engine engine(backends[i], config);
      Request r1 = greedy_request(turn1, 8);
      r1.session = "agent";
      ASSERT_TRUE(engine.submit(r1).is_ok());
      run_all(engine);
      ASSERT_TRUE(engine.save_session("agent", files[i]).is_ok());
    }
    EXPECT_EQ(file_bytes(files[0]), file_bytes(files[1])) << "the files depend on the backend";

    std::vector<std::vector<int32_t>> replies;
    for (size_t i = 0; i < backends.size(); ++i) {
      Engine engine(backends[i], config);
      // each backend loads the file the other one wrote
      const Status loaded = engine.load_session("agent", files[1 - i]);
      ASSERT_TRUE(loaded.is_ok()) << loaded.to_string();
      Request r2 = greedy_request(turn2, 16);
      r2.session = "agent";
      const RequestId id = engine.submit(r2).value();
      auto out = run_all(engine);
      EXPECT_EQ(out[id.value].usage.prefilled_tokens, static_cast<int32_t>(turn2.size()));
      replies.push_back(out[id.value].tokens);
    }
    EXPECT_EQ(replies[0], replies[1]);
    std::filesystem::remove_all(dir);
  }
}

}  // namespace
}  // namespace kvp
