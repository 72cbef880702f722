// Session tiers (issue "Engine", docs/engine.md): a session spilled to host memory or to disk
// comes back without re-encoding its history and continues exactly as if it had stayed; saved
// sessions load into a fresh engine; files of other models or corrupt ones are refused while
// the engine keeps serving; sessions needing 5x the pool complete with the tiers in use.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <map>
#include <random>
#include <set>

#include "engine/engine.h"
#include "engine/engine_front.h"
#include "engine/engine_test_util.h"
#include "support/temp_dir.h"

using namespace kvp::engine_test;  // NOLINT(google-build-using-namespace)

namespace kvp {
namespace {

using test::TempDir;

EngineSessionInfo session_info(const Engine& engine, const std::string& name) {
  for (const EngineSessionInfo& s : engine.sessions()) {
    if (s.name == name) return s;
  }
  KVP_CHECK(false, "no session {}", name);
  return {};
}

// Output of one request holding the whole conversation, in a fresh engine.
std::vector<int32_t> reference_output(const std::shared_ptr<ModelRunner>& runner,
                                      const std::vector<int32_t>& prompt, int32_t max_tokens) {
  CpuForwardBackend backend(runner);
  Engine reference(&backend, small_config(256));
  auto id = reference.submit(greedy_request(prompt, max_tokens));
  KVP_CHECK(id.is_ok(), "{}", id.status().to_string());
  return run_all(reference)[id->value].tokens;
}

// Fills the pool with other work so that idle sessions must leave it.
void apply_pressure(Engine& engine) {
  for (int i = 0; i < 3; ++i) {
    std::vector<int32_t> filler(150, 10 + i);
    KVP_CHECK(engine.submit(greedy_request(filler, 20)).is_ok(), "filler refused");
  }
  run_all(engine);
}

enum class Tier { kHost, kDisk };

class EngineTierTest : public ::testing::TestWithParam<std::tuple<const char*, Tier>> {};

TEST_P(EngineTierTest, SpilledSessionResumesWithoutReencodingAndMatchesFullPrompt) {
  const auto [model, tier] = GetParam();
  auto runner = load(model);
  TempDir dir(std::string(model) + (tier == Tier::kHost ? "-host" : "-disk"));
  EngineConfig config = small_config(128);
  if (tier == Tier::kHost) {
    config.host_tier_bytes = 64 << 20;
  } else {
    config.disk_dir = dir.path().string();
    config.disk_tier_bytes = 64 << 20;
  }
  CpuForwardBackend backend(runner);
  Engine engine(&backend, config);
  const auto turn1 = golden_ids(model, "prompt_1");
  // a short turn: its last token attends to restored KV in the window layers too
  const auto prompt2 = golden_ids(model, "prompt_2");
  const std::vector<int32_t> turn2(prompt2.begin(), prompt2.begin() + 3);
  Request r1 = greedy_request(turn1, 8);
  r1.session = "agent";
  auto id1 = engine.submit(r1);
  ASSERT_TRUE(id1.is_ok());
  auto out1 = run_all(engine);
  ASSERT_EQ(session_info(engine, "agent").tier, SessionTier::kDevice);

  apply_pressure(engine);
  engine.settle_tier_moves();  // spill files are written on a thread of their own
  const EngineSessionInfo spilled = session_info(engine, "agent");
  const SessionTier expected_tier = tier == Tier::kHost ? SessionTier::kHost : SessionTier::kDisk;
  ASSERT_EQ(spilled.tier, expected_tier) << session_tier_name(spilled.tier);
  EXPECT_EQ(spilled.num_resident_tokens, 0);
  // every token but the last output (whose KV the next turn computes) is kept
  EXPECT_EQ(spilled.num_kv_tokens, static_cast<int32_t>(turn1.size()) + 8 - 1);
  EXPECT_EQ(spilled.num_evictions, 0);
  if (tier == Tier::kHost) {
    EXPECT_GT(spilled.host_bytes, 0u);
    EXPECT_EQ(engine.stats().host_tier_bytes_used, spilled.host_bytes);
  } else {
    EXPECT_EQ(dir.num_files(), 1);
    EXPECT_EQ(engine.stats().disk_tier_bytes_used, spilled.disk_bytes);
  }

  const EngineStats before = engine.stats();
  Request r2 = greedy_request(turn2, 16);
  r2.session = "agent";
  auto id2 = engine.submit(r2);
  ASSERT_TRUE(id2.is_ok());
  auto out2 = run_all(engine);

  std::vector<int32_t> whole = turn1;
  whole.insert(whole.end(), out1[id1->value].tokens.begin(), out1[id1->value].tokens.end());
  whole.insert(whole.end(), turn2.begin(), turn2.end());
  EXPECT_EQ(out2[id2->value].tokens, reference_output(runner, whole, 16));
  // only the new turn runs: its tokens and the last output of turn 1
  const Usage& usage = out2[id2->value].usage;
  EXPECT_EQ(usage.prefilled_tokens, static_cast<int32_t>(turn2.size()) + 1);
  EXPECT_EQ(usage.cached_tokens, spilled.num_kv_tokens);
  const EngineStats after = engine.stats();
  EXPECT_EQ(after.num_prefill_tokens - before.num_prefill_tokens, usage.prefilled_tokens);
  EXPECT_EQ(after.num_session_restores - before.num_session_restores, 1);
  // the restored turn's stages, in order: admitted, its KV copied in, then its first step
  const RequestTimes& t2 = out2[id2->value].times;
  ASSERT_TRUE(t2.admitted && t2.kv_copy_start && t2.kv_copy_done && t2.first_step);
  EXPECT_LE(*t2.admitted, *t2.kv_copy_start);
  EXPECT_LE(*t2.kv_copy_start, *t2.kv_copy_done);
  EXPECT_LE(*t2.kv_copy_done, *t2.first_step);
  // the first turn had nothing to copy in
  const RequestTimes& t1 = out1[id1->value].times;
  EXPECT_TRUE(t1.admitted && t1.first_step);
  EXPECT_FALSE(t1.kv_copy_start || t1.kv_copy_done);
  const EngineSessionInfo resumed = session_info(engine, "agent");
  EXPECT_EQ(resumed.tier, SessionTier::kDevice);
  EXPECT_EQ(resumed.num_restores, 1);
  // restored from the host tier, the session keeps its copy there, charged to the tier
  // (EngineConfig::keep_restored_copies; models of one cache group: not gemma3's two)
  const bool keeps = tier == Tier::kHost && std::string(model) == "llama";
  EXPECT_EQ(after.host_tier_bytes_used, keeps ? spilled.host_bytes : 0u);
  EXPECT_EQ(after.disk_tier_bytes_used, 0u);
  engine.settle_tier_moves();     // files are removed on the writer's thread
  EXPECT_EQ(dir.num_files(), 0);  // the spill file went with the restore
  engine.check_integrity();
}

// A disk-tier session whose request finds the pool full of running work: each step's admission
// finds no room until that work ends, and the spill file, read once (since the request arrived),
// is kept for the next try instead of being read from the disk again at every step.
// A disk tier of 64 MiB (no host tier) over a pool of 128 blocks of 4 tokens.
EngineConfig disk_config(const TempDir& dir) {
  EngineConfig config = small_config(128);
  config.disk_dir = dir.path().string();
  config.disk_tier_bytes = 64 << 20;
  return config;
}

// Runs a session's first turn (the golden prompt_1, 8 tokens); returns the conversation so far.
std::vector<int32_t> first_turn(Engine& engine, const std::string& session) {
  std::vector<int32_t> whole = golden_ids("llama", "prompt_1");
  Request r = greedy_request(whole, 8);
  r.session = session;
  auto id = engine.submit(r);
  KVP_CHECK(id.is_ok(), "{}", id.status().to_string());
  const std::vector<int32_t> out = run_all(engine)[id->value].tokens;
  whole.insert(whole.end(), out.begin(), out.end());
  return whole;
}

TEST(EngineTiers, ARestoreThatFindsNoRoomReadsItsFileOnce) {
  auto runner = load("llama");
  TempDir dir("no-room");
  CpuForwardBackend backend(runner);
  Engine engine(&backend, disk_config(dir));
  std::vector<int32_t> whole = first_turn(engine, "agent");
  apply_pressure(engine);
  engine.settle_tier_moves();
  ASSERT_EQ(session_info(engine, "agent").tier, SessionTier::kDisk);
  const int32_t session_tokens = session_info(engine, "agent").num_kv_tokens;

  // running work that leaves fewer free blocks than the session needs, for several steps
  const int32_t needed = (session_tokens + 3) / 4;
  ASSERT_GE(needed, 2);
  std::vector<int32_t> filler(4 * (128 - needed + 1), 11);
  auto filler_id = engine.submit(greedy_request(filler, 4));
  ASSERT_TRUE(filler_id.is_ok());
  engine.step();
  const EngineStats before = engine.stats();
  Request r2 = greedy_request({5, 6, 7}, 6);
  r2.session = "agent";
  auto id2 = engine.submit(r2);
  ASSERT_TRUE(id2.is_ok());
  auto out2 = run_all(engine);
  const EngineStats after = engine.stats();
  EXPECT_EQ(after.num_session_restores - before.num_session_restores, 1);
  EXPECT_EQ(after.file_reads.count - before.file_reads.count, 1);
  // the session's turn came after the filler's end, restored, not recomputed
  EXPECT_EQ(out2[id2->value].usage.cached_tokens, session_tokens);
  whole.insert(whole.end(), {5, 6, 7});
  EXPECT_EQ(out2[id2->value].tokens, reference_output(runner, whole, 6));
  engine.settle_tier_moves();  // files are removed on the writer's thread
  EXPECT_EQ(dir.num_files(), 0);
  engine.check_integrity();
}

// The names of the files in a directory.
std::set<std::string> file_names(const TempDir& dir) {
  std::set<std::string> names;
  for (const auto& entry : std::filesystem::directory_iterator(dir.path())) {
    names.insert(entry.path().filename().string());
  }
  return names;
}

// Each write of a session's spill file gets a name of its own: a file the engine no longer
// needs is removed on the writer's thread when its write ends (a session restored from the copy
// still being written), and by then the session may have gone down to disk again; under one
// name that removal would take the newer file.
TEST(EngineTiers, EachSpillOfASessionGetsAFileOfItsOwn) {
  auto runner = load("llama");
  TempDir dir("spill-names");
  CpuForwardBackend backend(runner);
  Engine engine(&backend, disk_config(dir));
  first_turn(engine, "agent");
  apply_pressure(engine);
  engine.settle_tier_moves();
  ASSERT_EQ(session_info(engine, "agent").tier, SessionTier::kDisk);
  const std::set<std::string> first = file_names(dir);
  ASSERT_EQ(first.size(), 1u);
  Request r2 = greedy_request({5, 6, 7}, 4);
  r2.session = "agent";
  ASSERT_TRUE(engine.submit(r2).is_ok());
  run_all(engine);
  apply_pressure(engine);
  engine.settle_tier_moves();
  ASSERT_EQ(session_info(engine, "agent").tier, SessionTier::kDisk);
  EXPECT_EQ(session_info(engine, "agent").num_restores, 1);
  const std::set<std::string> second = file_names(dir);
  ASSERT_EQ(second.size(), 1u);  // the first went with the restore
  EXPECT_NE(*second.begin(), *first.begin());
  engine.check_integrity();
}

// A session deleted while its spill file is still being written leaves no file once the tier
// moves settle: the write's removal, queued when the write is reported, is waited for too.
// Repeated, since the write may end before the delete in some rounds.
TEST(EngineTiers, ASessionDeletedWhileItsFileIsWrittenLeavesNoFileOnceMovesSettle) {
  auto runner = load("llama");
  TempDir dir("orphan-write");
  CpuForwardBackend backend(runner);
  Engine engine(&backend, disk_config(dir));
  for (int round = 0; round < 8; ++round) {
    first_turn(engine, "agent");
    for (int i = 0; i < 3; ++i) {  // apply_pressure, stopped once the session has gone to disk
      ASSERT_TRUE(engine.submit(greedy_request(std::vector<int32_t>(150, 10 + i), 20)).is_ok());
    }
    while (session_info(engine, "agent").tier != SessionTier::kDisk) {
      ASSERT_TRUE(engine.has_unfinished()) << round;
      engine.step();
    }
    ASSERT_TRUE(engine.delete_session("agent").is_ok());  // its file is likely being written
    engine.settle_tier_moves();
    EXPECT_EQ(engine.stats().num_file_jobs_queued, 0) << round;  // no removal left to race
    EXPECT_EQ(dir.num_files(), 0) << round;
    run_all(engine);
    EXPECT_EQ(engine.stats().disk_tier_bytes_used, 0u) << round;
    engine.check_integrity();
  }
}

// A request's session that a step moves to disk while the request waits (its blocks given to
// a sequence ahead of it) is read back as soon as its file is written, not when the request is
// admitted: the read runs while others decode, and the restore finds it done.
TEST(EngineTiers, ASessionMovedToDiskWhileItsRequestWaitsIsReadBackAheadOfItsAdmission) {
  auto runner = load("llama");
  TempDir dir("read-ahead");
  CpuForwardBackend backend(runner);
  Engine engine(&backend, disk_config(dir));
  std::vector<int32_t> whole = first_turn(engine, "agent");
  const int32_t session_tokens = session_info(engine, "agent").num_kv_tokens;
  ASSERT_GE(session_tokens, 8);

  // F (200 + 20 tokens) decodes; W behind it (one block more than the pool has free, then 2
  // tokens) and the agent's turn, holding its blocks, wait. W's last chunk needs the agent's
  // blocks: the agent's request gives them back (its session to disk) and waits until F ends.
  auto f = engine.submit(greedy_request(std::vector<int32_t>(200, 9), 20));
  ASSERT_TRUE(f.is_ok());
  std::map<int64_t, Outcome> outputs;
  for (int i = 0; i < 5; ++i) collect(engine.step(), &outputs);  // F's prompt in 64-token chunks
  const int32_t num_free = engine.stats().num_blocks_total - engine.stats().num_blocks_used;
  auto w = engine.submit(greedy_request(std::vector<int32_t>(4 * num_free + 3, 12), 2));
  Request r2 = greedy_request({5, 6, 7}, 6);
  r2.session = "agent";
  auto id2 = engine.submit(r2);
  ASSERT_TRUE(w.is_ok() && id2.is_ok());
  const EngineStats before = engine.stats();
  for (int i = 0; i < 40 && session_info(engine, "agent").tier != SessionTier::kDisk; ++i) {
    collect(engine.step(), &outputs);
  }
  ASSERT_EQ(session_info(engine, "agent").tier, SessionTier::kDisk);
  ASSERT_TRUE(session_info(engine, "agent").busy);
  engine.settle_tier_moves();  // its file written
  EXPECT_TRUE(session_info(engine, "agent").read_ahead);
  run_all(engine, &outputs);
  const EngineStats after = engine.stats();
  EXPECT_EQ(after.num_session_restores - before.num_session_restores, 1);
  EXPECT_EQ(after.file_reads.count - before.file_reads.count, 1);
  EXPECT_EQ(outputs[id2->value].usage.cached_tokens, session_tokens);  // restored, not recomputed
  whole.insert(whole.end(), {5, 6, 7});
  EXPECT_EQ(outputs[id2->value].tokens, reference_output(runner, whole, 6));
  EXPECT_EQ(outputs[w->value].tokens.size(), 2u);
  EXPECT_EQ(outputs[f->value].tokens.size(), 20u);
  engine.check_integrity();
}

// Write-backs ahead of need (EngineConfig::tier_watermark): the step that leaves a session idle
// below the watermark starts its copy to the host tier; a request arriving while the copy is in
// flight keeps the pool's blocks (the copy is dropped, nothing restored); a later step finds the
// copy done and the session leaves the pool with no step needing the room; outputs equal a
// fresh engine's on the whole conversation throughout.
TEST(EngineWriteBacks, IdleSessionsLeaveAheadOfNeedAndARequestMidCopyKeepsThePool) {
  auto runner = load("llama");
  EngineConfig config = small_config(128);
  config.host_tier_bytes = 64 << 20;
  config.tier_watermark = 1.0;  // every idle session is written back
  CpuForwardBackend backend(runner);
  Engine engine(&backend, config);
  std::vector<int32_t> whole = golden_ids("llama", "prompt_1");
  const std::vector<int32_t> turn2 = {7, 19, 23}, turn3 = {31, 5};
  auto run_turn = [&](const std::vector<int32_t>& turn, int32_t max_tokens) {
    Request r = greedy_request(turn, max_tokens);
    r.session = "agent";
    auto id = engine.submit(r);
    KVP_CHECK(id.is_ok(), "{}", id.status().to_string());
    whole.insert(whole.end(), turn.begin(), turn.end());
    const std::vector<int32_t> expected = reference_output(runner, whole, max_tokens);
    auto out = run_all(engine);
    EXPECT_EQ(out[id->value].tokens, expected) << "turn ending at " << whole.size();
    whole.insert(whole.end(), out[id->value].tokens.begin(), out[id->value].tokens.end());
    engine.check_integrity();
    return out[id->value].usage;
  };
  const std::vector<int32_t> turn1 = whole;
  whole.clear();
  run_turn(turn1, 8);
  // the step that finished turn 1 started the copy: still in the pool, its bytes reserved
  EngineSessionInfo info = session_info(engine, "agent");
  EXPECT_EQ(info.tier, SessionTier::kDevice);
  EXPECT_EQ(engine.stats().num_session_moves_to_host, 0);
  EXPECT_GT(engine.stats().host_tier_bytes_used, 0u);

  // a request now: the copy is dropped and the pool's KV serves the turn
  const Usage usage2 = run_turn(turn2, 6);
  EXPECT_EQ(usage2.prefilled_tokens, static_cast<int32_t>(turn2.size()) + 1);
  EXPECT_EQ(engine.stats().num_session_restores, 0);
  EXPECT_EQ(engine.stats().num_session_moves_to_host, 0);

  // an idle step finds the new copy done: the session is on the host tier, nothing evicted
  EXPECT_TRUE(engine.step().empty());
  engine.check_integrity();
  info = session_info(engine, "agent");
  EXPECT_EQ(info.tier, SessionTier::kHost);
  EXPECT_EQ(info.num_resident_tokens, 0);
  EXPECT_EQ(info.num_moves_to_host, 1);
  EXPECT_EQ(engine.stats().host_tier_bytes_used, info.host_bytes);
  EXPECT_EQ(engine.stats().num_session_evictions, 0);
  // both copies were found done by a later step (not timed); the one dropped mid-request moved
  // its bytes too, and counts as a copy the device made
  EXPECT_EQ(engine.stats().to_host.count, 0);
  EXPECT_EQ(engine.stats().to_host.overlapped, 2);
  EXPECT_GT(engine.stats().to_host.overlapped_bytes, info.host_bytes);

  // the next turn comes back from the host tier
  const Usage usage3 = run_turn(turn3, 5);
  EXPECT_EQ(usage3.prefilled_tokens, static_cast<int32_t>(turn3.size()) + 1);
  EXPECT_EQ(engine.stats().num_session_restores, 1);
  EXPECT_EQ(engine.stats().to_pool.count, 1);
}

// An agent's session restored from the host tier keeps its copy there (charged to the tier) while
// it runs, and its next move down for room copies only the blocks its turn added; every turn's
// output is that of one request holding the whole conversation, as it is without kept copies.
// A turn whose prompt rewrites part of the history (prompt_includes_history) drops the kept copy
// it would contradict: the next move copies the whole history again, and the turn after it
// still matches (a stale kept copy would bring back KV of the old tokens).
TEST(EngineTiers, ARestoredSessionKeepsItsHostCopySoItsNextMoveCopiesOnlyItsNewBlocks) {
  auto runner = load("llama");
  struct Run {
    std::vector<uint64_t> copied;  // to_host bytes of each move down
    std::vector<std::vector<int32_t>> outputs;
    std::vector<uint64_t> kept_after_turn;  // host bytes charged while the session is resident
  };
  const auto run = [&](bool keep) {
    EngineConfig config = small_config(128);
    config.host_tier_bytes = 64 << 20;
    config.tier_watermark = 0;  // moves only when the room is needed
    config.keep_restored_copies = keep;
    CpuForwardBackend backend(runner);
    Engine engine(&backend, config);
    Run result;
    std::vector<int32_t> whole;
    const auto turn = [&](std::vector<int32_t> tokens, bool includes_history) {
      Request r = greedy_request(tokens, 6);
      r.session = "agent";
      r.prompt_includes_history = includes_history;
      auto id = engine.submit(r);
      KVP_CHECK(id.is_ok(), "{}", id.status().to_string());
      if (includes_history) whole.clear();
      whole.insert(whole.end(), tokens.begin(), tokens.end());
      const std::vector<int32_t> expected = reference_output(runner, whole, 6);
      auto out = run_all(engine);
      EXPECT_EQ(out[id->value].tokens, expected)
          << "keep " << keep << ", turn ending at " << whole.size();
      whole.insert(whole.end(), out[id->value].tokens.begin(), out[id->value].tokens.end());
      result.outputs.push_back(out[id->value].tokens);
      engine.check_integrity();
      result.kept_after_turn.push_back(engine.stats().host_tier_bytes_used);
      const uint64_t before = engine.stats().to_host.bytes;
      apply_pressure(engine);  // the idle session leaves the pool
      engine.check_integrity();
      EXPECT_EQ(session_info(engine, "agent").tier, SessionTier::kHost);
      result.copied.push_back(engine.stats().to_host.bytes - before);
    };
    turn(golden_ids("llama", "prompt_1"), false);
    turn({7, 19, 23, 41, 5, 9, 11, 13, 17, 29, 31, 37, 43, 47, 53, 59, 61}, false);
    turn({71, 73, 79}, false);
    // the history rewritten from its 5th token on: the kept copy covers more than that
    std::vector<int32_t> rewritten(whole.begin(), whole.begin() + 5);
    for (int i = 0; i < 20; ++i) rewritten.push_back(100 + i);
    turn(rewritten, true);
    turn({83, 89}, false);
    engine.settle_tier_moves();
    engine.check_integrity();
    return result;
  };
  const Run kept = run(true), dropped = run(false);
  EXPECT_EQ(kept.outputs, dropped.outputs);
  ASSERT_EQ(kept.copied.size(), 5u);
  // the first move copies the whole history either way; later ones only what a turn added
  EXPECT_EQ(kept.copied[0], dropped.copied[0]);
  for (size_t t : {1, 2, 4}) {
    EXPECT_GT(kept.copied[t], 0u) << t;
    EXPECT_LT(kept.copied[t], dropped.copied[t]) << "move " << t;
  }
  // a turn of 9 tokens on a history of 40-odd: its 3 blocks (of 4 tokens) of 11
  EXPECT_LT(kept.copied[2] * 3, dropped.copied[2]);
  EXPECT_LT(kept.copied[4] * 3, dropped.copied[4]);
  // after the rewrite the whole (shorter) history is copied: the kept copy was dropped
  EXPECT_EQ(kept.copied[3], dropped.copied[3]);
  // while the session runs, its kept copy is charged to the host tier; without, nothing is
  for (size_t t = 1; t < 5; ++t) {
    EXPECT_EQ(dropped.kept_after_turn[t], 0u) << t;
    if (t != 3) {
      EXPECT_GT(kept.kept_after_turn[t], 0u) << t;
    }
  }
}

INSTANTIATE_TEST_SUITE_P(ModelsAndTiers, EngineTierTest,
                         ::testing::Combine(::testing::Values("llama", "gemma3"),
                                            ::testing::Values(Tier::kHost, Tier::kDisk)));

class EngineSaveLoadTest : public ::testing::TestWithParam<const char*> {};

// save_session runs the last output token through the model first, so the file holds the whole
// history and the loaded session prefills exactly the new turn.
TEST_P(EngineSaveLoadTest, SavedSessionContinuesInAFreshEngineAsIfItHadStayed) {
  const char* model = GetParam();
  auto runner = load(model);
  TempDir dir(std::string("save-") + model);
  const auto turn1 = golden_ids(model, "prompt_1");
  // a short turn: its last token attends to restored KV in the window layers too
  const auto prompt2 = golden_ids(model, "prompt_2");
  const std::vector<int32_t> turn2(prompt2.begin(), prompt2.begin() + 3);
  const std::filesystem::path file = dir.path() / "agent.kvc";
  std::vector<int32_t> reply1;
  {
    CpuForwardBackend backend(runner);
    Engine engine(&backend, small_config(128));
    Request r1 = greedy_request(turn1, 8);
    r1.session = "agent";
    auto id1 = engine.submit(r1);
    ASSERT_TRUE(id1.is_ok());
    reply1 = run_all(engine)[id1->value].tokens;
    ASSERT_TRUE(engine.save_session("agent", file).is_ok());
    engine.check_integrity();
  }
  CpuForwardBackend backend(runner);
  Engine engine(&backend, small_config(128));
  Status loaded = engine.load_session("agent", file);
  ASSERT_TRUE(loaded.is_ok()) << loaded.to_string();
  const int32_t history = static_cast<int32_t>(turn1.size() + reply1.size());
  EXPECT_EQ(session_info(engine, "agent").num_tokens, history);
  EXPECT_EQ(session_info(engine, "agent").num_kv_tokens, history);
  Request r2 = greedy_request(turn2, 16);
  r2.session = "agent";
  auto id2 = engine.submit(r2);
  ASSERT_TRUE(id2.is_ok());
  auto out2 = run_all(engine);

  std::vector<int32_t> whole = turn1;
  whole.insert(whole.end(), reply1.begin(), reply1.end());
  whole.insert(whole.end(), turn2.begin(), turn2.end());
  EXPECT_EQ(out2[id2->value].tokens, reference_output(runner, whole, 16));
  EXPECT_EQ(out2[id2->value].usage.prefilled_tokens, static_cast<int32_t>(turn2.size()));
  EXPECT_EQ(out2[id2->value].usage.cached_tokens, history);
  EXPECT_TRUE(std::filesystem::exists(file));  // a loaded file is the caller's: it stays
  engine.check_integrity();
}

INSTANTIATE_TEST_SUITE_P(Models, EngineSaveLoadTest,
                         ::testing::Values("llama", "gemma3", "qwen3", "qwen3_moe", "qwen2_moe",
                                           "gpt_oss"));

TEST(EngineTiers, FilesOfOtherModelsAndCorruptFilesAreRefusedAndTheEngineKeepsServing) {
  auto llama = load("llama");
  TempDir dir("refuse");
  const std::filesystem::path file = dir.path() / "llama.kvc";
  {
    CpuForwardBackend backend(llama);
    Engine engine(&backend, small_config(64));
    Request r = greedy_request(golden_ids("llama", "prompt_2"), 4);
    r.session = "agent";
    ASSERT_TRUE(engine.submit(r).is_ok());
    run_all(engine);
    ASSERT_TRUE(engine.save_session("agent", file).is_ok());
  }
  for (const char* other : {"gemma3", "qwen2"}) {
    auto runner = load(other);
    CpuForwardBackend backend(runner);
    Engine engine(&backend, small_config(64));
    Status st = engine.load_session("agent", file);
    EXPECT_EQ(st.code(), StatusCode::kMismatch) << st.to_string();
    EXPECT_NE(st.message().find("agent"), std::string::npos) << st.to_string();
    EXPECT_NE(st.message().find(file.string()), std::string::npos) << st.to_string();
    EXPECT_TRUE(engine.sessions().empty());
    // still serving
    auto id = engine.submit(greedy_request(golden_ids(other, "prompt_1"), 32));
    ASSERT_TRUE(id.is_ok());
    EXPECT_EQ(run_all(engine)[id->value].tokens, golden_ids(other, "greedy_1")) << other;
  }

  CpuForwardBackend backend(llama);
  Engine engine(&backend, small_config(64));
  // the same architecture with other weights (the caller's weight hash) is another model
  EngineConfig other_weights = small_config(64);
  other_weights.model_weight_hash = 42;
  CpuForwardBackend other_engine_backend(llama);
  Engine other_engine(&other_engine_backend, other_weights);
  EXPECT_EQ(other_engine.load_session("agent", file).code(), StatusCode::kMismatch);
  // unknown sessions and missing files
  EXPECT_EQ(engine.load_session("agent", dir.path() / "nobody.kvc").code(), StatusCode::kNotFound);
  EXPECT_EQ(engine.save_session("nobody", dir.path() / "x.kvc").code(), StatusCode::kNotFound);
  EXPECT_EQ(engine.load_session("", file).code(), StatusCode::kInvalidArgument);
  // a flipped byte in the KV
  const std::filesystem::path corrupt = dir.path() / "corrupt.kvc";
  std::filesystem::copy_file(file, corrupt);
  {
    std::fstream f(corrupt, std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(static_cast<std::streamoff>(std::filesystem::file_size(corrupt) / 2));
    f.put('\x5a');
  }
  EXPECT_EQ(engine.load_session("agent", corrupt).code(), StatusCode::kCorruption);
  // truncated
  std::filesystem::resize_file(corrupt, std::filesystem::file_size(corrupt) / 3);
  EXPECT_EQ(engine.load_session("agent", corrupt).code(), StatusCode::kCorruption);
  EXPECT_TRUE(engine.sessions().empty());
  // the good file loads, and a second load under the same name is refused
  ASSERT_TRUE(engine.load_session("agent", file).is_ok());
  EXPECT_EQ(engine.load_session("agent", file).code(), StatusCode::kInvalidArgument);
  auto id = engine.submit(greedy_request(golden_ids("llama", "prompt_0"), 32));
  ASSERT_TRUE(id.is_ok());
  EXPECT_EQ(run_all(engine)[id->value].tokens, golden_ids("llama", "greedy_0"));
  engine.check_integrity();
}

// Agents sharing a system prompt: after they all left the pool and came back, the prompt's
// blocks are held once.
TEST(EngineTiers, RestoredSessionsShareTheirSystemPromptBlocks) {
  auto runner = load("llama");
  EngineConfig config = small_config(128);
  config.host_tier_bytes = 64 << 20;
  CpuForwardBackend backend(runner);
  Engine engine(&backend, config);
  std::vector<int32_t> system(40);
  for (int32_t i = 0; i < 40; ++i) system[i] = 20 + i;
  const int kAgents = 3;
  for (int a = 0; a < kAgents; ++a) {
    std::vector<int32_t> prompt = system;
    for (int i = 0; i < 5; ++i) prompt.push_back(100 + 10 * a + i);
    Request r = greedy_request(prompt, 4);
    r.session = "agent" + std::to_string(a);
    ASSERT_TRUE(engine.submit(r).is_ok());
  }
  run_all(engine);
  apply_pressure(engine);
  for (const EngineSessionInfo& s : engine.sessions())
    ASSERT_EQ(s.tier, SessionTier::kHost) << s.name;
  const EngineStats before = engine.stats();
  int32_t kv_tokens = 0;
  for (int a = 0; a < kAgents; ++a) {
    Request r = greedy_request({7, 8, 9}, 1);
    r.session = "agent" + std::to_string(a);
    ASSERT_TRUE(engine.submit(r).is_ok());
    kv_tokens += session_info(engine, r.session.value()).num_kv_tokens;
  }
  run_all(engine);
  const EngineStats after = engine.stats();
  EXPECT_EQ(after.num_session_restores - before.num_session_restores, kAgents);
  // the system prompt's full blocks came from the pool for all but the first agent
  const int32_t shared_blocks = 40 / config.block_size;
  EXPECT_EQ(after.num_restored_tokens - before.num_restored_tokens,
            kv_tokens - (kAgents - 1) * shared_blocks * config.block_size);
  int32_t held_blocks = 0;  // as if nothing were shared
  for (const EngineSessionInfo& s : engine.sessions()) {
    ASSERT_EQ(s.tier, SessionTier::kDevice);
    held_blocks += (s.num_kv_tokens + config.block_size - 1) / config.block_size;
  }
  EXPECT_EQ(after.num_blocks_used, held_blocks - (kAgents - 1) * shared_blocks);
  engine.check_integrity();
}

// 10 agents x 4 turns on Gemma 3 (a global and a window group) in a pool of 64 blocks per
// group: the histories need over 5x the pool. With small host and disk budgets, sessions move
// through every tier (and past disk, drop); every reply equals the one of an engine large
// enough to keep every session resident.
TEST(EngineTiers, SessionsNeedingFiveTimesThePoolMoveThroughEveryTierWithOutputsIntact) {
  auto runner = load("gemma3");
  TempDir dir("pressure");
  const int kAgents = 10, kTurns = 4;
  std::vector<std::unique_ptr<CpuForwardBackend>> backends;  // one per engine, outliving it
  auto run = [&](const EngineConfig& config, std::unique_ptr<Engine>* holder) {
    backends.push_back(std::make_unique<CpuForwardBackend>(runner));
    *holder = std::make_unique<Engine>(backends.back().get(), config);
    Engine& engine = **holder;
    std::mt19937 rng(5);
    std::map<std::string, std::vector<std::vector<int32_t>>> replies;
    for (int turn = 0; turn < kTurns; ++turn) {
      std::map<int64_t, std::string> owner;
      for (int a = 0; a < kAgents; ++a) {
        const std::string name = "agent" + std::to_string(a);
        std::vector<int32_t> prompt(16 + rng() % 13);
        for (int32_t& t : prompt) t = 3 + rng() % 250;
        Request r = greedy_request(prompt, 12);
        r.session = name;
        auto id = engine.submit(r);
        KVP_CHECK(id.is_ok(), "{}", id.status().to_string());
        owner[id->value] = name;
      }
      auto out = run_all(engine);
      for (const auto& [id, name] : owner) replies[name].push_back(out[id].tokens);
    }
    return replies;
  };
  std::unique_ptr<Engine> reference;
  const auto expected = run(small_config(1024), &reference);
  ASSERT_EQ(reference->stats().num_session_evictions, 0);
  std::unique_ptr<Engine> no_tiers;
  const auto replies_no_tiers = run(small_config(64), &no_tiers);  // 256 tokens per group

  EngineConfig tight = small_config(64);
  tight.host_tier_bytes = 150 << 10;
  tight.disk_dir = dir.path().string();
  tight.disk_tier_bytes = 150 << 10;
  std::unique_ptr<Engine> engine;
  const auto replies = run(tight, &engine);
  int64_t total_tokens = 0;
  for (const EngineSessionInfo& s : engine->sessions()) total_tokens += s.num_tokens;
  EXPECT_GT(total_tokens, 5 * 256);
  for (int a = 0; a < kAgents; ++a) {
    const std::string name = "agent" + std::to_string(a);
    EXPECT_EQ(replies.at(name), expected.at(name)) << name;
    EXPECT_EQ(replies_no_tiers.at(name), expected.at(name)) << name;
  }
  const EngineStats stats = engine->stats();
  EXPECT_GT(stats.num_session_moves_to_host, 0);
  EXPECT_GT(stats.num_session_moves_to_disk, 0);
  EXPECT_GT(stats.num_session_restores, 0);
  EXPECT_GT(stats.num_restored_tokens, 0);
  EXPECT_EQ(stats.num_tier_errors, 0);
  EXPECT_LE(stats.host_tier_bytes_used, tight.host_tier_bytes);
  EXPECT_LE(stats.disk_tier_bytes_used, tight.disk_tier_bytes);
  // restores skip prefill that dropping sessions pays
  EXPECT_GT(no_tiers->stats().num_session_evictions, 0);
  EXPECT_LT(stats.num_prefill_tokens, no_tiers->stats().num_prefill_tokens);
  engine->check_integrity();
  for (int a = 0; a < kAgents; ++a) {
    ASSERT_TRUE(engine->delete_session("agent" + std::to_string(a)).is_ok());
  }
  engine->settle_tier_moves();
  engine->check_integrity();
  EXPECT_EQ(engine->stats().num_blocks_used, 0);
  EXPECT_EQ(engine->stats().host_tier_bytes_used, 0u);
  EXPECT_EQ(engine->stats().disk_tier_bytes_used, 0u);
  EXPECT_EQ(dir.num_files(), 0);  // removed on the writer's thread, drained by settle_tier_moves
}

}  // namespace
}  // namespace kvp

namespace kvp {
namespace {

TEST(EngineFrontTiers, SessionsAreSavedDeletedAndLoadedThroughTheFront) {
  auto runner = load("llama");
  TempDir dir("front");
  CpuForwardBackend backend(runner);
  EngineFront front(std::make_unique<Engine>(&backend, small_config(64)));
  Request r = greedy_request(golden_ids("llama", "prompt_1"), 4);
  r.session = "agent";
  auto stream = front.submit(r);
  ASSERT_TRUE(stream.is_ok());
  while ((*stream)->next()) {
  }
  const std::filesystem::path file = dir.path() / "agent.kvc";
  ASSERT_TRUE(front.save_session("agent", file).is_ok());
  ASSERT_TRUE(front.delete_session("agent").is_ok());
  EXPECT_TRUE(front.sessions().empty());
  EXPECT_EQ(front.load_session("agent", dir.path() / "missing.kvc").code(), StatusCode::kNotFound);
  ASSERT_TRUE(front.load_session("agent", file).is_ok());
  auto sessions = front.sessions();
  ASSERT_EQ(sessions.size(), 1u);
  EXPECT_EQ(sessions[0].tier, SessionTier::kDisk);
  EXPECT_EQ(sessions[0].num_tokens,
            static_cast<int32_t>(golden_ids("llama", "prompt_1").size()) + 4);
}

}  // namespace
}  // namespace kvp
