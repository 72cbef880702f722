// What a caller submits to the Engine and what it gets back (issue "Engine": API).
#pragma once

#include <chrono>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "common/ids.h"
#include "engine/sampler.h"

namespace kvp {

struct Request {
  std::vector<int32_t> prompt_tokens;  // must not be empty (unless it continues a session)
  SamplingParams sampling;
  int32_t max_tokens = 16;              // generated tokens per sample, > 0
  std::vector<int32_t> stop_token_ids;  // besides the model's end-of-sequence tokens
  // Generation stops once the sample's text contains one of these (the token completing it is
  // the last one sent). Needs an engine with a tokenizer (EngineConfig::tokenizer).
  std::vector<std::string> stop_strings;
  bool ignore_eos = false;
  int32_t min_tokens = 0;  // end-of-sequence and stop tokens are not sampled before
                           // this many outputs (their logits are masked)
  int32_t n = 1;           // parallel samples (forks sharing the prompt's blocks)
  // An agent's session: the prompt appends to the session's sequence (its earlier prompts and
  // outputs), and only the new tokens are prefilled. Created on first use.
  std::optional<std::string> session;
  // With a session: prompt_tokens is the whole conversation, not what follows the session's
  // history. The session keeps the longest common prefix of its history and the prompt (KV past
  // it is dropped: the client edited its history) and only the rest is prefilled; at least the
  // last prompt token always runs, to give logits.
  bool prompt_includes_history = false;
};

// kAborted: the request could not be served (its next chunk can never fit the pool).
enum class FinishReason { kStop, kLength, kCancelled, kAborted };
const char* finish_reason_name(FinishReason reason);

struct Usage {
  int32_t prompt_tokens = 0;      // tokens of this request's prompt (as submitted)
  int32_t prefilled_tokens = 0;   // tokens this request actually ran through the model
                                  // before its first output (prompt minus cache hits and
                                  // session history, plus recomputation after preemption)
  int32_t cached_tokens = 0;      // prompt tokens served from the prefix cache or session
  int32_t restored_tokens = 0;    // of them, those whose session KV came back from host or disk
  int32_t completion_tokens = 0;  // over all samples
  int32_t num_preemptions = 0;
};

// When a request passed each stage on its way to its first token (the engine's steady clock),
// in its finished event: what `kvpool bench --csv` traces. Unset: the stage did not happen
// (kv_copy_*: its session's KV did not come back from the host or disk tier).
struct RequestTimes {
  using TimePoint = std::chrono::steady_clock::time_point;
  std::optional<TimePoint> admitted;       // first given blocks in the pool
  std::optional<TimePoint> kv_copy_start;  // its session's KV started coming back into the pool
  std::optional<TimePoint> kv_copy_done;   // that copy found complete (settled; for a restore
                                           // whose step was ordered after it: after that step)
  std::optional<TimePoint> first_step;     // the first forward pass that ran its tokens began
};

struct EngineEvent {
  enum class Kind { kToken, kFinished };
  Kind kind = Kind::kToken;
  RequestId request_id;
  int32_t sample_index = 0;                          // 0 .. n-1
  int32_t token_id = -1;                             // kToken
  float logprob = 0.0f;                              // kToken
  std::vector<TokenLogprob> top_logprobs;            // kToken, when asked for
  FinishReason finish_reason = FinishReason::kStop;  // kFinished
  bool request_finished = false;  // kFinished: the request's last event (all samples done)
  Usage usage;                    // with request_finished: the request's totals
  RequestTimes times;             // with request_finished
};

}  // namespace kvp
