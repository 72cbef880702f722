// Engine equivalence (issue "Engine"): on the tiny transformers-made models, a request's greedy
// output is the same alone, batched with 31 others, after a prefix-cache hit, after preemption
// and recompute, and when continued through a session that was evicted meanwhile; prefill
// counts show the skipped work; pressure leaves no block leaked; bad requests are refused.
#include "engine/engine.h"
#include "engine/engine_front.h"

#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <random>
#include <sstream>
#include <thread>

#include "engine/engine_test_util.h"
#include "model/model_loader.h"
#include "support/temp_dir.h"

using namespace kvp::engine_test;  // NOLINT(google-build-using-namespace)

namespace kvp {
namespace {

class EngineGoldenTest : public ::testing::TestWithParam<const char*> {};

TEST_P(EngineGoldenTest, AloneMatchesTransformersGreedy) {
  auto runner = load(GetParam());
  for (int p = 0; p < 4; ++p) {
    CpuForwardBackend backend(runner);
    Engine engine(&backend, small_config(64));
    auto prompt = golden_ids(GetParam(), "prompt_" + std::to_string(p));
    auto id = engine.submit(greedy_request(prompt, 32));
    ASSERT_TRUE(id.is_ok()) << id.status().to_string();
    auto out = run_all(engine);
    EXPECT_EQ(out[id->value].tokens, golden_ids(GetParam(), "greedy_" + std::to_string(p)))
        << GetParam() << " prompt " << p;
    EXPECT_EQ(out[id->value].reason, FinishReason::kLength);
    EXPECT_EQ(out[id->value].usage.prefilled_tokens, static_cast<int32_t>(prompt.size()));
  }
}

TEST_P(EngineGoldenTest, BatchedWith31OthersOfMixedLengthsMatchesAlone) {
  auto runner = load(GetParam());
  CpuForwardBackend backend(runner);
  Engine engine(&backend, small_config(1024));
  std::mt19937 rng(11);
  std::map<int64_t, int> golden_of;  // request id -> golden prompt index
  std::vector<int64_t> others;
  for (int i = 0; i < 32; ++i) {
    if (i % 8 == 3) {
      const int p = i / 8;
      auto id =
          engine.submit(greedy_request(golden_ids(GetParam(), "prompt_" + std::to_string(p)), 32));
      ASSERT_TRUE(id.is_ok());
      golden_of[id->value] = p;
    } else {
      std::vector<int32_t> prompt(1 + rng() % 60);
      for (int32_t& t : prompt) t = 3 + rng() % 250;
      auto id = engine.submit(greedy_request(prompt, 1 + rng() % 40));
      ASSERT_TRUE(id.is_ok());
      others.push_back(id->value);
    }
  }
  auto out = run_all(engine);
  ASSERT_EQ(out.size(), 32u);
  for (const auto& [id, p] : golden_of) {
    EXPECT_EQ(out[id].tokens, golden_ids(GetParam(), "greedy_" + std::to_string(p))) << p;
  }
}

TEST_P(EngineGoldenTest, PreemptedRequestsRecomputeToTheSameOutput) {
  auto runner = load(GetParam());
  // 24 blocks of 4 tokens: the four golden requests (up to 45 + 32 tokens each) cannot all fit
  CpuForwardBackend backend(runner);
  Engine engine(&backend, small_config(24));
  std::map<int64_t, int> golden_of;
  for (int p = 0; p < 4; ++p) {
    auto id =
        engine.submit(greedy_request(golden_ids(GetParam(), "prompt_" + std::to_string(p)), 32));
    ASSERT_TRUE(id.is_ok()) << id.status().to_string();
    golden_of[id->value] = p;
  }
  auto out = run_all(engine);
  EXPECT_GT(engine.stats().num_preemptions, 0);
  int preempted = 0;
  for (const auto& [id, p] : golden_of) {
    EXPECT_EQ(out[id].tokens, golden_ids(GetParam(), "greedy_" + std::to_string(p))) << p;
    preempted += out[id].usage.num_preemptions;
  }
  EXPECT_GT(preempted, 0);
}

INSTANTIATE_TEST_SUITE_P(Models, EngineGoldenTest,
                         ::testing::Values("llama", "gemma3", "qwen3", "qwen3_moe", "qwen2_moe",
                                           "gpt_oss"));

TEST(Engine, PrefixCacheHitSkipsPrefillAndKeepsOutput) {
  for (const char* model : {"llama", "qwen3", "qwen3_moe", "qwen2_moe", "gpt_oss"}) {
    SCOPED_TRACE(model);
    auto runner = load(model);
    CpuForwardBackend backend(runner);
    Engine engine(&backend, small_config(256));
    auto prompt = golden_ids(model, "prompt_3");  // 45 tokens: 11 full blocks of 4
    auto first = engine.submit(greedy_request(prompt, 32));
    auto out1 = run_all(engine);
    auto second = engine.submit(greedy_request(prompt, 32));
    auto out2 = run_all(engine);
    const auto golden = golden_ids(model, "greedy_3");
    EXPECT_EQ(out1[first->value].tokens, golden);
    EXPECT_EQ(out2[second->value].tokens, golden);
    EXPECT_EQ(out1[first->value].usage.prefilled_tokens, 45);
    EXPECT_EQ(out2[second->value].usage.cached_tokens, 44);  // 11 blocks; the last token runs
    EXPECT_EQ(out2[second->value].usage.prefilled_tokens, 1);
  }
}

// Gemma 3 has a global and a sliding-window cache group: a hit needs every global block of the
// prefix and the window group's blocks inside the window of the first new token.
TEST(Engine, PrefixCacheHitAcrossGlobalAndWindowGroupsKeepsOutput) {
  auto runner = load("gemma3");
  ASSERT_EQ(runner->num_cache_groups(), 2);
  const EngineConfig config = small_config(256);
  const auto prompt = golden_ids("gemma3", "prompt_3");  // 45 tokens
  const auto golden = golden_ids("gemma3", "greedy_3");
  // the first request shares the first 42 tokens, then goes elsewhere
  const int32_t shared = 42;
  std::vector<int32_t> other(prompt.begin(), prompt.begin() + shared);
  for (int32_t t : golden_ids("gemma3", "prompt_2")) other.push_back(t);
  ASSERT_NE(other[shared], prompt[shared]);

  CpuForwardBackend backend(runner);
  Engine engine(&backend, config);
  auto first = engine.submit(greedy_request(other, 8));
  ASSERT_TRUE(first.is_ok());
  auto out1 = run_all(engine);
  const int64_t prefilled_before = engine.stats().num_prefill_tokens;
  auto second = engine.submit(greedy_request(prompt, 32));
  ASSERT_TRUE(second.is_ok());
  auto out2 = run_all(engine);

  // whole blocks of the shared part are reused
  const int32_t expected_hit = shared / config.block_size * config.block_size;
  const Usage& usage = out2[second->value].usage;
  EXPECT_EQ(usage.cached_tokens, expected_hit);
  EXPECT_EQ(usage.prefilled_tokens, static_cast<int32_t>(prompt.size()) - expected_hit);
  EXPECT_EQ(engine.stats().num_prefill_tokens - prefilled_before,
            static_cast<int64_t>(prompt.size()) - expected_hit);
  EXPECT_EQ(out2[second->value].tokens, golden);

  // the first prompt again: served from the cache (the last token runs), same output
  auto third = engine.submit(greedy_request(other, 8));
  ASSERT_TRUE(third.is_ok());
  auto out3 = run_all(engine);
  EXPECT_EQ(out3[third->value].tokens, out1[first->value].tokens);
  EXPECT_EQ(out3[third->value].usage.cached_tokens,
            (static_cast<int32_t>(other.size()) - 1) / config.block_size * config.block_size);
  engine.check_integrity();
}

TEST(Engine, ParallelSamplesForkAndAreReproducible) {
  auto runner = load("llama");
  auto run = [&](uint64_t seed) {
    CpuForwardBackend backend(runner);
    Engine engine(&backend, small_config(256));
    Request r;
    r.prompt_tokens = golden_ids("llama", "prompt_2");
    r.sampling.temperature = 1.0f;
    r.sampling.seed = seed;
    r.max_tokens = 12;
    r.n = 4;
    r.ignore_eos = true;
    auto id = engine.submit(r);
    KVP_CHECK(id.is_ok(), "{}", id.status().to_string());
    std::map<int, std::vector<int32_t>> samples;
    Usage usage;
    while (engine.has_unfinished()) {
      for (const EngineEvent& e : engine.step()) {
        if (e.kind == EngineEvent::Kind::kToken) samples[e.sample_index].push_back(e.token_id);
        if (e.kind == EngineEvent::Kind::kFinished && e.sample_index == 3) usage = e.usage;
      }
      engine.check_integrity();
    }
    EXPECT_EQ(engine.stats().num_blocks_used, 0);  // only cached (evictable) blocks remain
    return std::make_pair(samples, usage);
  };
  auto [a, usage] = run(7);
  auto [b, usage_b] = run(7);
  ASSERT_EQ(a.size(), 4u);
  EXPECT_EQ(a, b);
  EXPECT_EQ(usage.prefilled_tokens, 29);  // the prompt ran once for all four samples
  EXPECT_EQ(usage.completion_tokens, 48);
  int distinct = 0;
  for (int i = 1; i < 4; ++i) distinct += a[i] != a[0];
  EXPECT_GT(distinct, 0);
}

// Rows are sampled in parallel; each sequence has its own generator, so sampled outputs of a
// mixed batch (temperature, top-k, top-p, min-p, penalties, logprobs) do not depend on how many
// threads drew them.
TEST(Engine, SampledOutputsDoNotDependOnSamplerThreads) {
  auto runner = load("llama");
  auto run = [&](int32_t threads) {
    CpuForwardBackend backend(runner);
    EngineConfig config = small_config(512);
    config.sampler_threads = threads;
    Engine engine(&backend, config);
    for (int i = 0; i < 12; ++i) {
      Request r;
      r.prompt_tokens = golden_ids("llama", i % 2 == 0 ? "prompt_1" : "prompt_2");
      r.sampling.temperature = 0.7f + 0.1f * float(i % 4);
      r.sampling.top_k = i % 3 == 0 ? 20 : 0;
      r.sampling.top_p = i % 4 == 1 ? 0.9f : 1.0f;
      r.sampling.min_p = i % 5 == 2 ? 0.05f : 0.0f;
      r.sampling.repetition_penalty = i % 6 == 3 ? 1.2f : 1.0f;
      r.sampling.num_logprobs = i % 2;
      r.sampling.seed = 100 + i;
      r.max_tokens = 10;
      r.ignore_eos = true;
      KVP_CHECK(engine.submit(r).is_ok(), "submit");
    }
    std::map<int64_t, std::vector<std::pair<int32_t, float>>> out;  // by request id
    while (engine.has_unfinished()) {
      for (const EngineEvent& e : engine.step()) {
        if (e.kind == EngineEvent::Kind::kToken)
          out[e.request_id.value].emplace_back(e.token_id, e.logprob);
      }
    }
    return out;
  };
  const auto one = run(1);
  const auto four = run(4);
  ASSERT_EQ(one.size(), 12u);
  EXPECT_EQ(one, four);
}

// A session's second turn equals one request holding the whole conversation, and prefills
// only the new tokens (plus the last output, whose KV did not exist yet) while resident.
TEST(Engine, SessionResumesWithoutReencodingAndMatchesFullPrompt) {
  for (bool evict_between : {false, true}) {
    auto runner = load("llama");
    CpuForwardBackend backend(runner);
    Engine engine(&backend, small_config(128));
    const auto turn1 = golden_ids("llama", "prompt_1");
    const auto turn2 = golden_ids("llama", "prompt_2");
    Request r1 = greedy_request(turn1, 8);
    r1.session = "agent";
    auto id1 = engine.submit(r1);
    ASSERT_TRUE(id1.is_ok());
    auto out1 = run_all(engine);
    if (evict_between) {
      // fill the pool with other work so the idle session is evicted
      for (int i = 0; i < 3; ++i) {
        std::vector<int32_t> filler(150, 10 + i);
        ASSERT_TRUE(engine.submit(greedy_request(filler, 20)).is_ok());
      }
      run_all(engine);
      ASSERT_EQ(engine.sessions()[0].num_resident_tokens, 0) << "session was not evicted";
      EXPECT_EQ(engine.sessions()[0].num_evictions, 1);
    }
    Request r2 = greedy_request(turn2, 16);
    r2.session = "agent";
    auto id2 = engine.submit(r2);
    ASSERT_TRUE(id2.is_ok());
    auto out2 = run_all(engine);

    std::vector<int32_t> whole = turn1;
    whole.insert(whole.end(), out1[id1->value].tokens.begin(), out1[id1->value].tokens.end());
    whole.insert(whole.end(), turn2.begin(), turn2.end());
    CpuForwardBackend reference_backend(runner);
    Engine reference(&reference_backend, small_config(128));
    auto ref_id = reference.submit(greedy_request(whole, 16));
    auto ref_out = run_all(reference);
    EXPECT_EQ(out2[id2->value].tokens, ref_out[ref_id->value].tokens) << evict_between;
    // every token of the conversation was either reused or run, never both
    const Usage& usage = out2[id2->value].usage;
    EXPECT_EQ(usage.prefilled_tokens + usage.cached_tokens, static_cast<int32_t>(whole.size()));
    if (!evict_between) {
      EXPECT_EQ(usage.prefilled_tokens, static_cast<int32_t>(turn2.size()) + 1);
    }
    engine.check_integrity();
  }
}

// A server's client resends the whole conversation every turn (prompt_includes_history): the
// session reuses what the prompt repeats, and an edited history keeps only the common prefix;
// the output equals a fresh engine's on the same full prompt either way.
TEST(Engine, SessionWithWholeConversationPromptsReusesTheCommonPrefix) {
  auto runner = load("llama");
  const auto turn1 = golden_ids("llama", "prompt_1");
  const auto turn2 = golden_ids("llama", "prompt_2");
  auto fresh_output = [&](const std::vector<int32_t>& prompt) {
    CpuForwardBackend reference_backend(runner);
    Engine reference(&reference_backend, small_config(128));
    auto id = reference.submit(greedy_request(prompt, 8));
    KVP_CHECK(id.is_ok(), "{}", id.status().to_string());
    return run_all(reference)[id->value].tokens;
  };
  for (bool edit : {false, true}) {
    CpuForwardBackend backend(runner);
    Engine engine(&backend, small_config(128));
    Request r1 = greedy_request(turn1, 8);
    r1.session = "agent";
    r1.prompt_includes_history = true;
    auto id1 = engine.submit(r1);
    ASSERT_TRUE(id1.is_ok());
    auto out1 = run_all(engine);
    std::vector<int32_t> whole = turn1;
    whole.insert(whole.end(), out1[id1->value].tokens.begin(), out1[id1->value].tokens.end());
    int32_t kept = static_cast<int32_t>(whole.size()) - 1;  // the last output has no KV yet
    if (edit) {
      kept = 5;  // the client changed its history from token 5 on
      whole[5] = (whole[5] + 1) % 64;
    }
    whole.insert(whole.end(), turn2.begin(), turn2.end());
    Request r2 = greedy_request(whole, 8);
    r2.session = "agent";
    r2.prompt_includes_history = true;
    auto id2 = engine.submit(r2);
    ASSERT_TRUE(id2.is_ok());
    auto out2 = run_all(engine);
    EXPECT_EQ(out2[id2->value].tokens, fresh_output(whole)) << "edit " << edit;
    const Usage& usage = out2[id2->value].usage;
    EXPECT_EQ(usage.prompt_tokens, static_cast<int32_t>(whole.size()));
    EXPECT_EQ(usage.cached_tokens, kept) << "edit " << edit;
    EXPECT_EQ(usage.prefilled_tokens + usage.cached_tokens, static_cast<int32_t>(whole.size()));
    EXPECT_EQ(engine.sessions()[0].num_tokens, static_cast<int32_t>(whole.size()) + 8);
    engine.check_integrity();
  }
}

TEST(Engine, SessionsNeedingFiveTimesThePoolAllCompleteWithoutLeaks) {
  auto runner = load("gemma3");  // two cache groups, one of them windowed
  CpuForwardBackend backend(runner);
  Engine engine(&backend, small_config(64));  // 256 tokens per group
  std::mt19937 rng(5);
  std::map<std::string, std::vector<int32_t>> expected_history;
  const int kAgents = 10, kTurns = 4;
  for (int turn = 0; turn < kTurns; ++turn) {
    std::map<int64_t, std::string> owner;
    for (int a = 0; a < kAgents; ++a) {
      const std::string name = "agent" + std::to_string(a);
      std::vector<int32_t> prompt(16 + rng() % 13);
      for (int32_t& t : prompt) t = 3 + rng() % 250;
      Request r = greedy_request(prompt, 12);
      r.session = name;
      auto id = engine.submit(r);
      ASSERT_TRUE(id.is_ok()) << id.status().to_string();
      owner[id->value] = name;
      auto& h = expected_history[name];
      h.insert(h.end(), prompt.begin(), prompt.end());
    }
    auto out = run_all(engine);
    for (const auto& [id, name] : owner) {
      ASSERT_EQ(out[id].tokens.size(), 12u) << name;
      auto& h = expected_history[name];
      h.insert(h.end(), out[id].tokens.begin(), out[id].tokens.end());
    }
  }
  int64_t total_tokens = 0;
  for (const EngineSessionInfo& s : engine.sessions()) {
    EXPECT_EQ(s.num_tokens, static_cast<int32_t>(expected_history[s.name].size())) << s.name;
    EXPECT_EQ(s.num_turns, kTurns);
    total_tokens += s.num_tokens;
  }
  EXPECT_GT(total_tokens, 5 * 256);  // the sessions' histories need 5x the pool
  EXPECT_GT(engine.stats().num_session_evictions, 0);
  engine.check_integrity();
  for (int a = 0; a < kAgents; ++a) {
    ASSERT_TRUE(engine.delete_session("agent" + std::to_string(a)).is_ok());
  }
  engine.check_integrity();
  EXPECT_EQ(engine.stats().num_blocks_used, 0);
}

TEST(Engine, BadRequestsAreRefusedAndTheEngineKeepsServing) {
  auto runner = load("llama");
  CpuForwardBackend backend(runner);
  Engine engine(&backend, small_config(16));
  auto expect_error = [&](Request r, const char* needle) {
    auto id = engine.submit(r);
    ASSERT_FALSE(id.is_ok()) << needle;
    EXPECT_NE(id.status().message().find(needle), std::string::npos) << id.status().to_string();
  };
  expect_error(greedy_request({}, 4), "empty prompt");
  expect_error(greedy_request({5}, 0), "max_tokens");
  expect_error(greedy_request({5, 999}, 4), "token id 999");
  Request bad_sampling = greedy_request({5}, 4);
  bad_sampling.sampling.top_p = 2.0f;
  expect_error(bad_sampling, "top_p");
  expect_error(greedy_request(std::vector<int32_t>(70, 5), 4), "the pool has 16");
  EXPECT_EQ(engine.delete_session("nobody").code(), StatusCode::kNotFound);
  // still serving
  auto id = engine.submit(greedy_request(golden_ids("llama", "prompt_0"), 8));
  ASSERT_TRUE(id.is_ok());
  auto out = run_all(engine);
  auto golden = golden_ids("llama", "greedy_0");
  EXPECT_EQ(out[id->value].tokens, std::vector<int32_t>(golden.begin(), golden.begin() + 8));
}

// The tiny models' context is 1024 tokens: history + prompt + max_tokens must fit in it.
TEST(Engine, RequestsPastTheModelsContextAreRefusedNamingEachNumber) {
  auto runner = load("llama");
  ASSERT_EQ(runner->spec().context_length, 1024);
  CpuForwardBackend backend(runner);
  Engine engine(&backend, small_config(512));
  auto refused = engine.submit(greedy_request(std::vector<int32_t>(1009, 5), 16));
  ASSERT_FALSE(refused.is_ok());
  EXPECT_EQ(refused.status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(refused.status().message(),
            "request: prompt of 1009 tokens + max_tokens 16 = 1025 exceeds the model's context of "
            "1024 tokens");
  // exactly the context fits
  auto fits = engine.submit(greedy_request(std::vector<int32_t>(1008, 5), 16));
  ASSERT_TRUE(fits.is_ok()) << fits.status().to_string();
  // a session's history counts
  Request first = greedy_request(std::vector<int32_t>(500, 6), 4);
  first.session = "agent";
  ASSERT_TRUE(engine.submit(first).is_ok());
  run_all(engine);
  Request second = greedy_request(std::vector<int32_t>(500, 7), 30);
  second.session = "agent";
  refused = engine.submit(second);
  ASSERT_FALSE(refused.is_ok());
  EXPECT_EQ(refused.status().message(),
            "request: session history of 504 tokens + prompt of 500 tokens + max_tokens 30 = 1034 "
            "exceeds the model's context of 1024 tokens");
  engine.check_integrity();
}

TEST(Engine, CancelFinishesARunningRequest) {
  auto runner = load("llama");
  CpuForwardBackend backend(runner);
  Engine engine(&backend, small_config(64));
  auto id = engine.submit(greedy_request(golden_ids("llama", "prompt_2"), 32));
  engine.step();
  engine.step();
  std::vector<EngineEvent> events;
  EXPECT_TRUE(engine.cancel(*id, &events));
  ASSERT_EQ(events.size(), 1u);
  EXPECT_EQ(events[0].finish_reason, FinishReason::kCancelled);
  EXPECT_FALSE(engine.has_unfinished());
  EXPECT_FALSE(engine.cancel(*id, &events));
  engine.check_integrity();
  EXPECT_EQ(engine.stats().num_blocks_used, 0);
}

// Stop strings on the real default model: transformers' greedy continuation of "The capital of
// France is" (tests/model/fixtures/real) is " Paris.\n\nThe answer is: ..."; with the stop
// string "\n\n" the sample ends at the token that completes it, and the text it gave up to
// there is the golden text up to and including the stop string.
TEST(Engine, StopStringEndsTheSampleAtTheTokenThatCompletesIt) {
  const std::string path = "models/SmolLM2-135M-Instruct.Q4_1.gguf";
  if (!std::filesystem::exists(path)) GTEST_SKIP() << path << " not found (scripts/setup.sh)";
  std::ifstream in("tests/model/fixtures/real/smollm2_goldens.json");
  const auto golden = nlohmann::json::parse(in).at("cases").at(0);
  const std::string golden_text = golden.at("text").get<std::string>();
  auto tokenizer = load_tokenizer(path);
  ASSERT_TRUE(tokenizer.is_ok()) << tokenizer.status().to_string();
  auto loaded = load_model(path, nullptr);
  ASSERT_TRUE(loaded.is_ok()) << loaded.status().to_string();
  std::shared_ptr<ModelRunner> runner = std::move(loaded).value();
  // the golden continuation is transformers' (f32): with int8 activations in the prompt step the
  // model continues "Paris.\n\nThe United" where transformers has "Paris.\n\nThe answer"
  runner->set_prefill_act_precision(quant::ActPrecision::kF32);
  EngineConfig config = small_config(256, 16);
  config.tokenizer = &*tokenizer;
  CpuForwardBackend backend(runner);
  Engine engine(&backend, config);

  for (const std::string stop : {"\n\n", "answer", "Paris."}) {
    SCOPED_TRACE(stop);
    Request r = greedy_request(golden.at("prompt_ids").get<std::vector<int32_t>>(), 32);
    r.min_tokens = 0;
    r.stop_strings = {"never appears in this text", stop};
    ASSERT_TRUE(engine.submit(r).is_ok());
    auto out = run_all(engine);
    ASSERT_EQ(out.size(), 1u);
    const Outcome& o = out.begin()->second;
    EXPECT_EQ(o.reason, FinishReason::kStop);
    const auto greedy = golden.at("greedy").get<std::vector<int32_t>>();
    ASSERT_LE(o.tokens.size(), greedy.size());
    EXPECT_TRUE(std::equal(o.tokens.begin(), o.tokens.end(), greedy.begin()));
    auto text = tokenizer->decode(o.tokens);
    ASSERT_TRUE(text.is_ok());
    const size_t at = golden_text.find(stop);
    ASSERT_NE(at, std::string::npos);
    // the last token completes the stop string: the text ends within that token's piece
    EXPECT_GE(text->size(), at + stop.size());
    EXPECT_EQ(text->substr(0, at + stop.size()), golden_text.substr(0, at + stop.size()));
    auto shorter = tokenizer->decode(std::span(o.tokens).first(o.tokens.size() - 1));
    ASSERT_TRUE(shorter.is_ok());
    EXPECT_EQ(shorter->find(stop), std::string::npos) << "it should have stopped a token earlier";
  }
  engine.check_integrity();

  // no tokenizer, or an empty stop string: refused
  CpuForwardBackend bare_backend(runner);
  Engine bare(&bare_backend, small_config(64, 16));
  Request r = greedy_request(golden.at("prompt_ids").get<std::vector<int32_t>>(), 4);
  r.stop_strings = {"x"};
  EXPECT_EQ(bare.submit(r).status().code(), StatusCode::kInvalidArgument);
  r.stop_strings = {""};
  EXPECT_EQ(engine.submit(r).status().code(), StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace kvp

namespace kvp {
namespace {

TEST(EngineFront, StreamsEventsToManyCallerThreads) {
  auto runner = load("llama");
  CpuForwardBackend backend(runner);
  EngineFront front(std::make_unique<Engine>(&backend, small_config(256)));
  std::vector<std::thread> callers;
  std::vector<std::vector<int32_t>> outputs(4);
  for (int p = 0; p < 4; ++p) {
    callers.emplace_back([&, p] {
      auto stream =
          front.submit(greedy_request(golden_ids("llama", "prompt_" + std::to_string(p)), 32));
      ASSERT_TRUE(stream.is_ok());
      while (auto e = (*stream)->next()) {
        if (e->kind == EngineEvent::Kind::kToken) outputs[p].push_back(e->token_id);
      }
    });
  }
  for (auto& t : callers) t.join();
  for (int p = 0; p < 4; ++p) {
    EXPECT_EQ(outputs[p], golden_ids("llama", "greedy_" + std::to_string(p))) << p;
  }
  auto bad = front.submit(greedy_request({}, 4));
  EXPECT_FALSE(bad.is_ok());
  EXPECT_EQ(front.stats().num_running, 0);
}

TEST(EngineFront, CancelEndsTheStream) {
  auto runner = load("llama");
  CpuForwardBackend backend(runner);
  EngineFront front(std::make_unique<Engine>(&backend, small_config(256)));
  Request r = greedy_request(golden_ids("llama", "prompt_3"), 30);
  r.n = 3;
  r.sampling.temperature = 0.8f;
  auto stream = front.submit(r);
  ASSERT_TRUE(stream.is_ok());
  front.cancel((*stream)->id());
  int finished = 0;
  while (auto e = (*stream)->next()) finished += e->kind == EngineEvent::Kind::kFinished;
  EXPECT_GE(finished, 1);
}

}  // namespace
}  // namespace kvp

#include "engine/bench.h"

namespace kvp {
namespace {

// The bench driver's bookkeeping: every request is accounted for, sessions skip the history's
// prefill that re-sending pays (the speed itself is for `kvpool bench`, never asserted here).
TEST(Bench, AgentsWithSessionsPrefillOnlyNewTokens) {
  auto runner = load("llama");
  BenchConfig config;
  config.workload = BenchConfig::Workload::kAgents;
  config.num_agents = 3;
  config.num_turns = 3;
  config.system_prompt_tokens = 40;
  config.turn_tokens = 10;
  config.reply_tokens = 6;
  int64_t prefilled[2] = {0, 0};
  for (bool sessions : {true, false}) {
    config.sessions = sessions;
    CpuForwardBackend backend(runner);
    Engine engine(&backend, small_config(512));
    auto report = run_bench(engine, runner->spec().vocab_size, config);
    ASSERT_TRUE(report.is_ok()) << report.status().to_string();
    EXPECT_EQ(report->num_requests, 9);
    EXPECT_EQ(report->output_tokens, 9 * 6);
    prefilled[sessions] = report->prefilled_tokens;
    for (const RequestTiming& r : report->requests) {
      // with sessions, a later turn runs its user tokens and the last reply token only
      if (sessions && r.turn > 0) {
        EXPECT_EQ(r.prefilled_tokens, 11) << "turn " << r.turn;
      }
      // without, it resends the whole history: 40 + 16 per earlier turn + 10
      if (!sessions) {
        EXPECT_EQ(r.prompt_tokens, 50 + 16 * r.turn);
      }
    }
    engine.check_integrity();
  }
  EXPECT_LT(prefilled[1], prefilled[0]);
}

// A long first turn (a document the later turns ask about): the first turn's prompt has
// first_turn_tokens user tokens, the later ones turn_tokens; first and later turns are timed
// apart.
TEST(Bench, AgentsFirstTurnCarriesItsOwnLength) {
  auto runner = load("llama");
  BenchConfig config;
  config.workload = BenchConfig::Workload::kAgents;
  config.num_agents = 2;
  config.num_turns = 3;
  config.system_prompt_tokens = 8;
  config.first_turn_tokens = 60;
  config.turn_tokens = 5;
  config.reply_tokens = 4;
  CpuForwardBackend backend(runner);
  Engine engine(&backend, small_config(512));
  auto report = run_bench(engine, runner->spec().vocab_size, config);
  ASSERT_TRUE(report.is_ok()) << report.status().to_string();
  ASSERT_EQ(report->num_requests, 6);
  EXPECT_EQ(report->num_later_turns, 4);
  for (const RequestTiming& r : report->requests) {
    EXPECT_EQ(r.prompt_tokens, r.turn == 0 ? 8 + 60 : 5) << "turn " << r.turn;
  }
  EXPECT_GT(report->ttft_first_turn_s.p50, 0.0);
  EXPECT_GT(report->ttft_later_turns_s.p50, 0.0);
  EXPECT_NE(report->to_text().find("of 4 later turns"), std::string::npos) << report->to_text();
  engine.check_integrity();

  config.first_turn_tokens = -1;
  EXPECT_FALSE(run_bench(engine, runner->spec().vocab_size, config).is_ok());
}

// Agents whose sessions leave the pool between turns (a host tier, a pool of about two
// histories): the CSV traces each request's stages, and a restored turn shows its KV copy
// between its admission and its first step.
TEST(Bench, CsvTracesEachRequestsStagesAndRestoresShowTheirCopy) {
  auto runner = load("llama");
  BenchConfig config;
  config.workload = BenchConfig::Workload::kAgents;
  config.num_agents = 4;
  config.num_turns = 3;
  config.system_prompt_tokens = 4;
  config.first_turn_tokens = 40;
  config.turn_tokens = 3;
  config.reply_tokens = 3;
  CpuForwardBackend backend(runner);
  EngineConfig engine_config = small_config(40);  // 160 tokens: two agents' histories
  engine_config.host_tier_bytes = 64 << 20;
  Engine engine(&backend, engine_config);
  auto report = run_bench(engine, runner->spec().vocab_size, config);
  ASSERT_TRUE(report.is_ok()) << report.status().to_string();
  ASSERT_GT(report->num_restored_requests, 0) << report->to_text();
  test::TempDir dir("bench-csv");
  const std::string path = (dir.path() / "requests.csv").string();
  ASSERT_TRUE(report->write_csv(path).is_ok());

  std::ifstream in(path);
  std::string line;
  ASSERT_TRUE(std::getline(in, line));
  const auto split = [](const std::string& row) {
    std::vector<std::string> cells;
    std::string cell;
    std::istringstream stream(row);
    while (std::getline(stream, cell, ',')) cells.push_back(cell);
    if (!row.empty() && row.back() == ',') cells.emplace_back();
    return cells;
  };
  const std::vector<std::string> header = split(line);
  std::map<std::string, size_t> column;
  for (size_t i = 0; i < header.size(); ++i) column[header[i]] = i;
  for (const char* name : {"ttft_s", "restored_tokens", "admitted_after_s", "kv_copy_start_after_s",
                           "kv_copy_done_after_s", "first_step_after_s"}) {
    ASSERT_EQ(column.count(name), 1u) << name << " missing from " << line;
  }
  int restored_rows = 0, rows = 0;
  while (std::getline(in, line)) {
    const std::vector<std::string> cells = split(line);
    ASSERT_EQ(cells.size(), header.size()) << line;
    ++rows;
    const auto at = [&](const char* name) { return cells[column.at(name)]; };
    const double ttft = std::stod(at("ttft_s"));
    const double admitted = std::stod(at("admitted_after_s"));
    const double first_step = std::stod(at("first_step_after_s"));
    EXPECT_GE(admitted, 0.0) << line;
    EXPECT_LE(admitted, first_step) << line;
    EXPECT_LE(first_step, ttft) << line;
    if (std::stoi(at("restored_tokens")) == 0) {
      EXPECT_EQ(at("kv_copy_start_after_s"), "") << line;
      continue;
    }
    ++restored_rows;
    const double copy_start = std::stod(at("kv_copy_start_after_s"));
    const double copy_done = std::stod(at("kv_copy_done_after_s"));
    EXPECT_LE(admitted, copy_start) << line;
    EXPECT_LE(copy_start, copy_done) << line;
    EXPECT_LE(copy_done, first_step) << line;
  }
  EXPECT_EQ(rows, report->num_requests);
  EXPECT_EQ(restored_rows, report->num_restored_requests);
  engine.check_integrity();
}

TEST(Bench, ClosedLoopReachesItsTokenTarget) {
  auto runner = load("qwen2");
  BenchConfig config;
  config.workload = BenchConfig::Workload::kClosed;
  config.concurrency = 4;
  config.target_output_tokens = 100;
  config.prompt_tokens_min = 5;
  config.prompt_tokens_max = 30;
  config.output_tokens_min = 5;
  config.output_tokens_max = 20;
  CpuForwardBackend backend(runner);
  Engine engine(&backend, small_config(512));
  auto report = run_bench(engine, runner->spec().vocab_size, config);
  ASSERT_TRUE(report.is_ok());
  EXPECT_GE(report->output_tokens, 100);
  EXPECT_GT(report->ttft_s.p50, 0.0);
  EXPECT_FALSE(parse_workload("bogus").is_ok());
}

}  // namespace
}  // namespace kvp
