// Tool calls in model output: models write calls as text, the server turns them into OpenAI
// `tool_calls`. One parser per reply (ToolCallStream) takes detokenized text as it arrives and
// splits it into content and calls; parse_tool_calls() is that same parser fed the whole reply,
// so a stream and a whole-text parse of one reply always agree.
//
// Formats (the text a model writes):
//   kHermes      <tool_call>\n{"name": "f", "arguments": {...}}\n</tool_call>   (Hermes,
//   Qwen 2.5/3) kLlama3Json  [<|python_tag|>]{"name": "f", "parameters": {...}}[; {...}]   (the
//   whole reply) kMistral     [TOOL_CALLS][{"name": "f", "arguments": {...}}, ...]          (v0.3)
//                [TOOL_CALLS]f[ARGS]{...}                                      (v11 tokenizers)
//
// Promises:
// - Text that looks like a call but is not one (invalid JSON, no name, unterminated) stays in
//   the content verbatim, markers included: nothing is lost and nothing throws.
// - A call's `arguments` is the compact JSON text of an object, keys in the model's order.
// - Whitespace next to a call is dropped: the run just before a call, and the run after the last
//   call when the reply ends there. "Sure.\n\n<tool_call>...</tool_call>\n" has content "Sure.".
// - Streaming holds back only what may still be part of a call: a possible marker prefix, a
//   call until its JSON is complete, and a trailing whitespace run.
#pragma once

#include <cstdint>
#include <mutex>
#include <optional>
#include <random>
#include <string>
#include <string_view>
#include <vector>

#include "common/status.h"

namespace kvp {

enum class ToolCallFormat { kNone, kHermes, kLlama3Json, kMistral };

// "none", "hermes", "llama3_json", "mistral"; invalid_argument naming the choices otherwise.
Result<ToolCallFormat> parse_tool_call_format(const std::string& name);
const char* tool_call_format_name(ToolCallFormat format);

// The format a chat template renders tool calls in, from the markers in its source text
// ("[TOOL_CALLS]", "<tool_call>", "<|python_tag|>" or Llama 3's `"parameters"` instruction);
// kNone when it has none.
ToolCallFormat detect_tool_call_format(const std::string& chat_template_source);

// Where tool-call ids come from: "call_" + 24 random alphanumerics. Thread-safe. A fixed seed
// gives a fixed sequence (tests).
class IdSource {
 public:
  IdSource();  // seeded from std::random_device
  explicit IdSource(uint64_t seed);

  std::string next_tool_call_id();

 private:
  std::mutex mu_;
  std::mt19937_64 rng_;  // guarded by mu_
};

struct ToolCall {
  std::string id;         // "call_..."
  std::string name;       // the function's name
  std::string arguments;  // compact JSON text of an object
};

struct ParsedReply {
  std::string content;  // the text outside calls ("" when there is none)
  std::vector<ToolCall> tool_calls;
};

// Splits a whole reply (non-streaming). kNone returns the text as content.
ParsedReply parse_tool_calls(ToolCallFormat format, std::string_view text, IdSource& ids);

// One call's part of a streamed chunk, OpenAI-shaped. A call is sent whole in one delta once its
// JSON is complete (id, name and the full arguments text): the arguments are re-serialised
// compact JSON, which cannot be known before the object closes. The server writes
// `"type": "function"` with every delta that carries an id.
struct ToolCallDelta {
  int32_t index = 0;  // position of the call in the reply's tool_calls
  std::optional<std::string> id;
  std::optional<std::string> name;
  std::string arguments;  // a fragment; the fragments of one index concatenate to the arguments
};

struct StreamDelta {
  std::string content;
  std::vector<ToolCallDelta> tool_calls;

  bool empty() const { return content.empty() && tool_calls.empty(); }
};

// The streaming parser of one reply: text deltas in (any chunking, even mid-UTF-8), deltas out.
class ToolCallStream {
 public:
  // `ids` must outlive the stream.
  ToolCallStream(ToolCallFormat format, IdSource* ids);

  // Takes the next piece of text; returns what can be sent now.
  StreamDelta push(std::string_view text);
  // The reply has ended: returns everything still held (an unfinished call as content).
  // requires: called once, after the last push
  StreamDelta finish();

  // Whether any call was decided so far (finish_reason "tool_calls").
  bool saw_tool_call() const { return num_tool_calls_ > 0; }
  int32_t num_tool_calls() const { return num_tool_calls_; }

 private:
  enum class State {
    kText,         // content; looking for a call's start marker
    kCall,         // buffer_ holds a call from its marker; waiting for its end
    kLlamaStart,   // Llama 3: before the first non-whitespace text of the reply
    kLlamaAfter,   // Llama 3: after a call; a separator and another call may follow
    kPassThrough,  // Llama 3: the rest of the reply is content
  };

  // Consumes what can be decided from buffer_ into `out`; `at_end` decides the rest.
  void drain(bool at_end, StreamDelta& out);
  // One step per state; false when more text is needed.
  bool step_text(bool at_end, StreamDelta& out);
  bool step_call(bool at_end, StreamDelta& out);
  // Llama 3: what follows whitespace (`rest`, not empty) starts a call, may still, or is content.
  bool llama_next(std::string_view rest, bool at_end);
  bool step_llama_start(bool at_end, StreamDelta& out);
  bool step_llama_after(bool at_end, StreamDelta& out);

  // The end of the call at the front of buffer_ (one past it), or nullopt while it is incomplete.
  // `*valid` is false when it ended but is not a call; `calls` gets the calls when it is.
  std::optional<size_t> find_call_end(bool at_end, bool* valid, std::vector<ToolCall>* calls);
  // Text known to be content; whitespace at its end is held until the next text decides it.
  void emit_content(std::string_view text, StreamDelta& out);
  void emit_call(ToolCall call, StreamDelta& out);
  // Takes the first `num_bytes` of buffer_.
  std::string take(size_t num_bytes);

  ToolCallFormat format_;
  IdSource* ids_;
  State state_;
  std::string buffer_;           // text not decided yet
  std::string held_whitespace_;  // trailing whitespace of the content, not sent yet
  bool last_was_call_ = false;   // nothing but whitespace since the last call
  int32_t num_tool_calls_ = 0;
  // An incremental scan of the JSON value in buffer_ (Mistral, Llama 3): where it starts and
  // how far it got, so each push scans only the new bytes.
  size_t json_begin_ = 0;
  size_t json_scanned_ = 0;
  int32_t json_depth_ = 0;
  bool json_in_string_ = false;
  bool json_escaped_ = false;
  bool finished_ = false;
};

}  // namespace kvp
