// The engine's tier moves on a backend whose copies complete late, as a GPU's copy stream does:
// a copy started by start_transfers happens only when transfers_done has been asked a few times
// or wait_transfers is called (the most adverse timing the interface allows: a destination read
// early holds stale bytes, a source written or freed early is copied wrong). Sessions restored
// at admission and sequences swapped back in run while their copies are in flight, and their
// outputs are the same as on the CPU backend, whose copies complete at once. A step ordered
// after copies (order_after_transfers) completes them only when its device work runs (its block
// copies or its forward pass), as a GPU stream waiting on the copies' event does.
#include <gtest/gtest.h>

#include <deque>
#include <map>
#include <optional>
#include <random>
#include <set>

#include "engine/cpu_backend_wrapper.h"
#include "engine/engine.h"
#include "engine/engine_test_util.h"
#include "support/temp_dir.h"

using namespace kvp::engine_test;  // NOLINT(google-build-using-namespace)

namespace kvp {
namespace {

using test::TempDir;

class LateCopiesBackend final : public CpuBackendWrapper {
 public:
  using CpuBackendWrapper::CpuBackendWrapper;
  std::string device_name() const override { return "late-copies test device"; }

  Result<uint64_t> start_transfers(int32_t group, std::span<const BlockTransfer> ops,
                                   HostKvStorage& host) override {
    bool to_host = false;
    KVP_RETURN_IF_ERROR(check_transfers(group, ops, host, &to_host));
    if (slabs_made_.count(host.slab(group).data()) > 0) {
      if (to_host) ++num_copies_into_slabs;
    } else if (!to_host) {
      ++num_copies_from_pageable;
    }
    queue_.push_back({++last_ticket_, group, {ops.begin(), ops.end()}, &host, 0, to_host});
    if (to_host) to_host_tickets_.insert(last_ticket_);
    return last_ticket_;
  }
  Result<bool> transfers_done(uint64_t ticket) override {
    // in order, as one stream: the oldest pending copy completes on its kPolls-th question
    while (!queue_.empty() && queue_.front().ticket <= ticket) {
      Pending& p = queue_.front();
      if (++p.polls < kPolls) {
        ++(p.to_host ? num_late_to_host : num_late_to_pool);
        return false;
      }
      KVP_RETURN_IF_ERROR(complete_front());
    }
    return true;
  }
  Status wait_transfers(uint64_t ticket) override {
    while (!queue_.empty() && queue_.front().ticket <= ticket) {
      KVP_RETURN_IF_ERROR(complete_front());
    }
    return Status::ok();
  }
  Status order_after_transfers(uint64_t ticket) override {
    ++(to_host_tickets_.count(ticket) > 0 ? num_orders_out : num_orders);
    ordered_ = std::max(ordered_, ticket);
    return Status::ok();
  }
  bool orders_by_layer() const override { return by_layer; }
  Status copy_blocks(int32_t group, std::span<const BlockCopy> ops) override {
    KVP_RETURN_IF_ERROR(run_ordered());
    return CpuBackendWrapper::copy_blocks(group, ops);
  }
  Status forward(const ForwardBatch& batch, std::span<float> logits) override {
    KVP_RETURN_IF_ERROR(run_ordered());
    return CpuBackendWrapper::forward(batch, logits);
  }

  // As a GPU backend's pinned slabs: host memory the engine may ask for (counted here).
  const HostKvStorage::SlabAllocator* host_slab_allocator() const override {
    return offers_slabs ? &slabs_ : nullptr;
  }

  static constexpr int kPolls = 3;
  int64_t num_late_to_pool = 0;  // answers "not yet" about copies into the pool
  int64_t num_late_to_host = 0;
  int64_t num_orders = 0;      // order_after_transfers calls: after copies into the pool
  int64_t num_orders_out = 0;  // after copies out of it (their blocks given back at once)
  bool offers_slabs = false;
  bool by_layer = false;  // says it orders steps layer by layer (as the CUDA backend does)
  int64_t num_slabs = 0, num_slabs_released = 0;
  int64_t num_copies_into_slabs = 0;     // to the host, into memory of host_slab_allocator
  int64_t num_copies_from_pageable = 0;  // into the pool, out of other host memory

 private:
  struct Pending {
    uint64_t ticket;
    int32_t group;
    std::vector<BlockTransfer> ops;
    HostKvStorage* host;
    int polls;
    bool to_host;
  };
  // the device work queued after order_after_transfers: the copies it waits for run first
  Status run_ordered() {
    while (!queue_.empty() && queue_.front().ticket <= ordered_) {
      KVP_RETURN_IF_ERROR(complete_front());
    }
    return Status::ok();
  }
  Status complete_front() {
    Pending p = std::move(queue_.front());
    queue_.pop_front();
    KVP_ASSIGN_OR_RETURN(const uint64_t t, inner_.start_transfers(p.group, p.ops, *p.host));
    return inner_.wait_transfers(t);
  }

  std::deque<Pending> queue_;
  uint64_t ordered_ = 0;  // copies up to this ticket complete before the next device work
  std::set<const void*> slabs_made_;
  std::set<uint64_t> to_host_tickets_;
  HostKvStorage::SlabAllocator slabs_{[](size_t bytes, void* self) -> void* {
                                        auto* backend = static_cast<LateCopiesBackend*>(self);
                                        ++backend->num_slabs;
                                        void* p = std::calloc(1, bytes);
                                        backend->slabs_made_.insert(p);
                                        return p;
                                      },
                                      [](void* p, void* self) {
                                        ++static_cast<LateCopiesBackend*>(self)->num_slabs_released;
                                        std::free(p);
                                      },
                                      this};
};

// 4 agents x 3 turns over a pool that holds about two of them: sessions move down a tier (the
// host tier unless `config` says otherwise) and come back at admission while the others run.
// The engine's integrity is checked after every turn. settle: the tiers' moves are completed
// after every turn too (spill files written, so the next turn reads them back).
std::map<std::pair<int, int>, std::vector<int32_t>> run_agents(
    ForwardBackend& backend, EngineStats* stats, std::optional<EngineConfig> config = std::nullopt,
    bool settle = false) {
  if (!config) {
    config = small_config(48);
    config->host_tier_bytes = 64 << 20;
  }
  Engine engine(&backend, *config);
  std::mt19937 rng(5);
  std::map<std::pair<int, int>, std::vector<int32_t>> out;
  for (int turn = 0; turn < 3; ++turn) {
    std::map<int64_t, int> agent_of;
    for (int a = 0; a < 4; ++a) {
      std::vector<int32_t> prompt(12 + rng() % 10);
      for (int32_t& t : prompt) t = 3 + rng() % 250;
      Request r = greedy_request(prompt, 8);
      r.session = "agent" + std::to_string(a);
      auto id = engine.submit(std::move(r));
      KVP_CHECK(id.is_ok(), "{}", id.status().to_string());
      agent_of[id->value] = a;
    }
    for (auto& [id, outcome] : run_all(engine)) out[{agent_of.at(id), turn}] = outcome.tokens;
    engine.check_integrity();
    if (settle) engine.settle_tier_moves();
  }
  engine.settle_tier_moves();
  engine.check_integrity();
  *stats = engine.stats();
  return out;
}

// Restores that wait for a step after their copy (restore_joins_step false) and restores that
// join a step ordered after it (true: these tiny sessions' copies take microseconds against
// steps of a millisecond or more, so every restore still copying at a step joins it).
TEST(EngineLateCopies, RestoredSessionsRunAfterTheirCopiesWithTheSameOutput) {
  for (const char* model : {"llama", "gemma3"}) {
    for (const bool joins : {false, true}) {
      SCOPED_TRACE(std::string(model) + (joins ? ", restores join steps" : ", restores wait"));
      auto runner = load(model);
      EngineConfig config = small_config(48);
      config.host_tier_bytes = 64 << 20;
      config.restore_joins_step = joins;
      CpuForwardBackend cpu(runner);
      EngineStats cpu_stats, late_stats;
      const auto expected = run_agents(cpu, &cpu_stats, config);
      EXPECT_EQ(cpu_stats.num_restores_joined_steps, 0);  // its copies are done at once
      LateCopiesBackend late(runner);
      const auto got = run_agents(late, &late_stats, config);
      EXPECT_EQ(got, expected);
      EXPECT_GT(late_stats.num_session_restores, 0);
      EXPECT_GT(late.num_late_to_pool, 0);  // some restore was still copying while steps ran
      EXPECT_GT(late_stats.to_pool.overlapped, 0);  // and is counted as such, not timed
      // (how many tokens came back differs: write-backs that complete later change which
      // sessions are on which tier when)
      EXPECT_GT(late_stats.num_restored_tokens, 0);
      if (joins) {
        EXPECT_GT(late_stats.num_restores_joined_steps, 0);
        EXPECT_EQ(late.num_orders, late_stats.num_restores_joined_steps);  // once a restore
      } else {
        EXPECT_EQ(late.num_orders, 0);
      }
    }
  }
}

// An agent's session written to the host tier, then its next turn alone in the engine, on a
// backend that orders steps after copies layer by layer: the restore joins its step at once (the
// step is ordered after the copy, so the copy is found done only after it) and the output is
// the CPU backend's. With restore_overlap off, or a backend that cannot order by layer,
// the turn waits for its copy and runs in a later step, with the same output.
TEST(EngineLateCopies, ALoneRestoreJoinsItsStepWhereTheBackendOrdersByLayer) {
  for (const char* model : {"llama", "gemma3"}) {
    auto runner = load(model);
    const auto turns = [&](ForwardBackend& backend, RestoreOverlap overlap, EngineStats* stats,
                           RequestTimes* times) {
      EngineConfig config = small_config(64);
      config.host_tier_bytes = 64 << 20;
      config.restore_overlap = overlap;
      Engine engine(&backend, config);
      Request turn1 = greedy_request(golden_ids(model, "prompt_1"), 8);
      turn1.session = "agent";
      KVP_CHECK(engine.submit(turn1).is_ok(), "turn 1");
      run_all(engine);
      for (int i = 0; i < 3; ++i) {  // other work pushes the idle session out of the pool
        KVP_CHECK(engine.submit(greedy_request(std::vector<int32_t>(150, 10 + i), 20)).is_ok(),
                  "filler");
      }
      run_all(engine);
      engine.settle_tier_moves();
      const auto prompt2 = golden_ids(model, "prompt_2");
      Request turn2 = greedy_request({prompt2.begin(), prompt2.begin() + 3}, 16);
      turn2.session = "agent";
      auto id = engine.submit(turn2);
      KVP_CHECK(id.is_ok(), "turn 2");
      auto out = run_all(engine);
      engine.check_integrity();
      *stats = engine.stats();
      *times = out[id->value].times;
      return out[id->value].tokens;
    };
    CpuForwardBackend cpu(runner);
    EngineStats cpu_stats;
    RequestTimes cpu_times;
    const std::vector<int32_t> expected =
        turns(cpu, RestoreOverlap::kAlone, &cpu_stats, &cpu_times);
    ASSERT_EQ(cpu_stats.num_session_restores, 1) << model;
    for (const bool by_layer : {true, false}) {
      for (const RestoreOverlap mode :
           {RestoreOverlap::kAlone, RestoreOverlap::kCopyBound, RestoreOverlap::kOff}) {
        const bool overlap = mode != RestoreOverlap::kOff;
        SCOPED_TRACE(std::string(model) + (by_layer ? ", by layer" : ", whole") + ", mode " +
                     std::to_string(int(mode)));
        LateCopiesBackend late(runner);
        late.by_layer = by_layer;
        EngineStats stats;
        RequestTimes times;
        EXPECT_EQ(turns(late, mode, &stats, &times), expected);
        ASSERT_EQ(stats.num_session_restores, 1);
        ASSERT_TRUE(times.kv_copy_done && times.first_step);
        if (by_layer && overlap) {
          // (the fillers' swap-ins, alone in their steps too, may join theirs)
          EXPECT_GE(stats.num_restores_joined_steps, 1);
          EXPECT_EQ(late.num_orders, stats.num_restores_joined_steps);
          EXPECT_LE(*times.first_step, *times.kv_copy_done);  // the step ran under the copy
        } else {
          EXPECT_EQ(late.num_orders, 0);
          EXPECT_EQ(stats.num_restores_joined_steps, 0);
          EXPECT_LE(*times.kv_copy_done, *times.first_step);
        }
      }
    }
  }
}

// Sessions moved down a tier for room, on a backend that orders steps after copies layer by
// layer: the engine gives their blocks back as soon as their copies are
// queued, ordering the next steps after them, and the copies complete only when that device
// work runs (a step that wrote a block before its copy read it out would leave another
// sequence's KV in the host copy, and a wrong restore). The outputs are the CPU backend's, and
// with copy_out_overlap off the copies are waited for instead, with the same outputs.
TEST(EngineLateCopies, CopiesOutWhoseBlocksAreGivenBackAtOnceKeepTheOutputs) {
  for (const char* model : {"llama", "gemma3"}) {
    auto runner = load(model);
    CpuForwardBackend cpu(runner);
    EngineStats cpu_stats;
    EngineConfig config = small_config(48);
    config.host_tier_bytes = 64 << 20;
    const auto expected = run_agents(cpu, &cpu_stats, config);
    for (const bool overlap : {true, false}) {
      SCOPED_TRACE(std::string(model) + (overlap ? ", copies out overlap" : ", copies out wait"));
      config.copy_out_overlap = overlap;
      LateCopiesBackend late(runner);
      late.by_layer = true;
      EngineStats stats;
      EXPECT_EQ(run_agents(late, &stats, config), expected);
      EXPECT_GT(stats.num_session_moves_to_host, 0);
      EXPECT_GT(stats.num_session_restores, 0);
      if (overlap) {
        EXPECT_GT(late.num_orders_out, 0);
        EXPECT_GT(stats.to_host.overlapped, 0);  // counted when found done, not timed
      } else {
        EXPECT_EQ(late.num_orders_out, 0);
      }
    }
  }
}

// Running sequences swapped out for room come back with the golden tokens; on a backend that
// orders steps layer by layer their blocks are given back as soon as the copy out is queued.
TEST(EngineLateCopies, SwappedSequencesRunAfterTheirCopiesWithTheGoldenOutput) {
  for (const char* model : {"llama", "gemma3"}) {
    for (const bool by_layer : {false, true}) {
      SCOPED_TRACE(std::string(model) + (by_layer ? ", by layer" : ", whole"));
      auto runner = load(model);
      LateCopiesBackend late(runner);
      late.by_layer = by_layer;
      EngineConfig config = small_config(24);
      config.host_tier_bytes = 64 << 20;
      config.preemption = Preemption::kSwap;
      Engine engine(&late, config);
      std::map<int64_t, int> golden_of;
      for (int p = 0; p < 4; ++p) {
        auto id =
            engine.submit(greedy_request(golden_ids(model, "prompt_" + std::to_string(p)), 32));
        ASSERT_TRUE(id.is_ok());
        golden_of[id->value] = p;
      }
      auto out = run_all(engine);
      engine.check_integrity();
      EXPECT_GT(engine.stats().num_preemption_swaps, 0);
      EXPECT_GT(late.num_late_to_pool, 0);
      EXPECT_EQ(late.num_orders_out > 0, by_layer);
      for (const auto& [id, p] : golden_of) {
        EXPECT_EQ(out[id].tokens, golden_ids(model, "greedy_" + std::to_string(p))) << p;
      }
      EXPECT_EQ(engine.stats().host_tier_bytes_used, 0u);
    }
  }
}

// A disk tier and no host tier, on a backend with pinned-style slabs: spill copies go through
// the engine's staging slab (a copy the engine did not wait for would leave stale bytes in the
// file; a staging block freed before its file is written would be overwritten by the next
// spill) and the sessions come back from the files, read into the staging slab (a staging block
// handed out again while its restore copy is in flight would be overwritten), with the outputs
// of the CPU backend, which has no slabs and copies through pageable memory.
TEST(EngineLateCopies, SpillCopiesThroughStagingSlabsKeepTheOutputs) {
  for (const char* model : {"llama", "gemma3"}) {
    SCOPED_TRACE(model);
    auto runner = load(model);
    const auto agents = [](ForwardBackend& backend, const TempDir& dir, EngineStats* stats) {
      EngineConfig config = small_config(48);
      config.disk_dir = dir.path().string();
      config.disk_tier_bytes = 64 << 20;
      config.prefix_caching = false;  // a restore copies every block back (none found cached)
      return run_agents(backend, stats, config, /*settle=*/true);
    };
    TempDir pageable_dir("spill-pageable"), staged_dir("spill-staged");
    CpuForwardBackend cpu(runner);
    EngineStats cpu_stats, late_stats;
    const auto expected = agents(cpu, pageable_dir, &cpu_stats);
    LateCopiesBackend late(runner);
    late.offers_slabs = true;
    const auto got = agents(late, staged_dir, &late_stats);
    EXPECT_EQ(got, expected);
    EXPECT_GT(late.num_slabs, 0);                        // the staging slab was made
    EXPECT_EQ(late.num_slabs_released, late.num_slabs);  // and given back with the engine
    EXPECT_GT(late.num_copies_into_slabs, 0);  // spill copies went through the staging slab
    // files were read (not only restored from copies still being written), into the slab; a
    // copy into the pool from pageable memory is a restore from a spill copy that found the slab
    // full (the reads' blocks are taken when the requests arrive), which timing decides
    EXPECT_GT(late_stats.file_reads.count, 0);
    // (read into pageable memory, gemma3's restores here make 4 such copies, llama's 1-2)
    EXPECT_LT(late.num_copies_from_pageable, late_stats.num_session_restores)
        << late_stats.num_session_restores << " restores";
    EXPECT_GT(late_stats.num_session_moves_to_disk, 0);
    EXPECT_GT(late_stats.num_session_restores, 0);
    EXPECT_EQ(late_stats.num_tier_errors, 0);
  }
}

// A request whose session's file would have to be read into pageable memory, the staging tier's
// room held by a spill copy still being written, waits for that room instead: its read starts
// once the copy is written, into staging, and its restore copies from pinned memory. Meanwhile
// the scheduler passes it over. Its output is that of a fresh engine on the whole conversation.
TEST(EngineLateCopies, AReadWaitsForStagingRoomRatherThanLandInPageableMemory) {
  auto runner = load("llama");
  TempDir dir("deferred-read");
  LateCopiesBackend late(runner);
  late.offers_slabs = true;
  EngineConfig config = small_config(64);  // 256 tokens; the staging tier as big
  config.disk_dir = dir.path().string();
  config.disk_tier_bytes = 64 << 20;
  Engine engine(&late, config);
  std::map<int64_t, Outcome> outputs;
  const auto turn = [&](const std::string& session, std::vector<int32_t> prompt) {
    Request r = greedy_request(std::move(prompt), 8);
    r.session = session;
    auto id = engine.submit(std::move(r));
    KVP_CHECK(id.is_ok(), "{}", id.status().to_string());
    return id->value;
  };
  const auto tier_of = [&](const std::string& name) {
    for (const EngineSessionInfo& s : engine.sessions()) {
      if (s.name == name) return s.tier;
    }
    return SessionTier::kNone;
  };
  // B (100 + 8 tokens: 27 blocks) then A (160 + 8: 42 blocks), which sends B to disk
  std::vector<int32_t> b1(100), a1(160);
  for (size_t i = 0; i < b1.size(); ++i) b1[i] = 3 + static_cast<int32_t>(i * 7 % 200);
  for (size_t i = 0; i < a1.size(); ++i) a1[i] = 5 + static_cast<int32_t>(i * 11 % 200);
  const int64_t b1_id = turn("B", b1);
  run_all(engine, &outputs);
  turn("A", a1);
  run_all(engine, &outputs);
  engine.settle_tier_moves();
  ASSERT_EQ(tier_of("B"), SessionTier::kDisk);
  ASSERT_EQ(tier_of("A"), SessionTier::kDevice);
  // F (100 tokens) sends A to disk, its copy in 42 of the staging tier's 64 blocks until written
  const int64_t f_id = engine.submit(greedy_request(std::vector<int32_t>(100, 9), 8))->value;
  for (int i = 0; i < 10 && tier_of("A") != SessionTier::kDisk; ++i) {
    collect(engine.step(), &outputs);
  }
  ASSERT_EQ(tier_of("A"), SessionTier::kDisk);
  const EngineStats before = engine.stats();
  const int64_t b2_id = turn("B", {7, 8, 9});  // B's 27 blocks do not fit the 22 left
  EXPECT_EQ(engine.stats().num_file_reads_deferred - before.num_file_reads_deferred, 1);
  for (const EngineSessionInfo& info : engine.sessions()) {
    if (info.name == "B") {
      EXPECT_FALSE(info.read_ahead);  // put off, not reading
    }
  }
  // A's file written (here at once: were F to end first, B would be admitted alone and read
  // without waiting, into pageable memory); the next step starts B's read, into staging
  engine.settle_tier_moves();
  run_all(engine, &outputs);
  const EngineStats after = engine.stats();
  EXPECT_EQ(after.file_reads.count - before.file_reads.count, 1);
  EXPECT_EQ(after.num_session_restores - before.num_session_restores, 1);
  EXPECT_EQ(after.num_file_reads_pageable, 0);
  EXPECT_EQ(late.num_copies_from_pageable, 0);  // every restore copied from pinned staging
  // restored, not recomputed: 100 + 8 tokens less the last reply token (no KV yet)
  EXPECT_EQ(outputs[b2_id].usage.cached_tokens, 107);
  EXPECT_EQ(outputs[f_id].tokens.size(), 8u);
  std::vector<int32_t> whole = b1;
  whole.insert(whole.end(), outputs[b1_id].tokens.begin(), outputs[b1_id].tokens.end());
  whole.insert(whole.end(), {7, 8, 9});
  CpuForwardBackend cpu(runner);
  Engine fresh(&cpu, small_config(256));
  const int64_t whole_id = fresh.submit(greedy_request(whole, 8))->value;
  EXPECT_EQ(outputs[b2_id].tokens, run_all(fresh)[whole_id].tokens);
  engine.check_integrity();
}

}  // namespace
}  // namespace kvp
