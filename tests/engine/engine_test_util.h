// Helpers of the engine tests: the tiny transformers-made models, their goldens, a greedy
// request, and a loop that steps an engine to the end checking its integrity. An engine runs
// on a CpuForwardBackend of its own (its own KV pool) over a runner that tests share:
//   auto runner = load("llama");  CpuForwardBackend backend(runner);  Engine engine(&backend, …);
#pragma once

#include <map>
#include <memory>
#include <string>
#include <vector>

#include "engine/engine.h"
#include "model/cpu_forward_backend.h"
#include "model/model_loader.h"
#include "model/safetensors_weights.h"

namespace kvp::engine_test {

inline std::shared_ptr<ModelRunner> load(const std::string& name) {
  auto runner = load_model("tests/model/fixtures/tiny/" + name, nullptr);
  KVP_CHECK(runner.is_ok(), "{}", runner.status().to_string());
  return std::move(runner).value();
}

inline std::vector<int32_t> golden_ids(const std::string& name, const std::string& tensor) {
  auto file = SafetensorsModel::open("tests/model/fixtures/tiny/" + name + "/golden.safetensors");
  KVP_CHECK(file.is_ok(), "{}", file.status().to_string());
  auto ids = read_int_tensor(*file, tensor);
  KVP_CHECK(ids.is_ok(), "{}", ids.status().to_string());
  return std::move(ids).value();
}

inline Request greedy_request(std::vector<int32_t> prompt, int32_t max_tokens) {
  Request r;
  r.prompt_tokens = std::move(prompt);
  r.sampling.temperature = 0.0f;
  r.max_tokens = max_tokens;
  r.min_tokens = max_tokens;  // as the goldens were made: no end-of-sequence
  return r;
}

struct Outcome {
  std::vector<int32_t> tokens;
  Usage usage;
  RequestTimes times;
  FinishReason reason = FinishReason::kStop;
};

// Adds a step's events to `out`: sample 0's tokens, and each request's end.
inline void collect(std::vector<EngineEvent> events, std::map<int64_t, Outcome>* out) {
  for (EngineEvent& e : events) {
    if (e.sample_index != 0) continue;
    Outcome& o = (*out)[e.request_id.value];
    if (e.kind == EngineEvent::Kind::kToken) {
      o.tokens.push_back(e.token_id);
    } else {
      o.usage = e.usage;
      o.times = e.times;
      o.reason = e.finish_reason;
    }
  }
}

// Steps the engine until every request has finished; collects sample 0 of each (into `out`,
// after what it holds).
inline void run_all(Engine& engine, std::map<int64_t, Outcome>* out, bool check_each_step = true) {
  int guard = 0;
  while (engine.has_unfinished()) {
    collect(engine.step(), out);
    if (check_each_step) engine.check_integrity();
    KVP_CHECK(++guard < 100000, "engine made no progress");
  }
}

inline std::map<int64_t, Outcome> run_all(Engine& engine, bool check_each_step = true) {
  std::map<int64_t, Outcome> out;
  run_all(engine, &out, check_each_step);
  return out;
}

inline EngineConfig small_config(int32_t num_blocks, int32_t block_size = 4) {
  EngineConfig c;
  c.num_blocks = num_blocks;
  c.block_size = block_size;
  c.max_step_tokens = 64;
  return c;
}

}  // namespace kvp::engine_test
