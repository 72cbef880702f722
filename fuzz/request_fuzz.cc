// Fuzz target: what the server reads from outside, on arbitrary bytes, with the server's
// default RequestLimits. The first byte picks what the rest is:
//
//   'c'  a /v1/chat/completions body: parse_request_body, parse_generation_request, then the
//        prompt it makes (SmolLM2's chat template from models/, rendered and tokenized)
//   'p'  a /v1/completions body, the same way (the prompt text or ids, tokenized)
//   'd'  a /detokenize body: parse_detokenize_request, decode, and the reply's JSON text
//   't'  model output with tool calls: parse_tool_calls in every format, and ToolCallStream fed
//        the same text in pieces (the piece sizes from the text's own bytes); the stream and
//        the whole-text parse must agree, as tool_calls.h promises
//   else a body of either endpoint (odd: chat), as /tokenize reads it
//
// A request's error is an ApiError value; anything else escaping (an exception, a crash, a
// sanitizer report) is a bug. Models come from $KVP_FUZZ_MODELS (default models/).
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <nlohmann/json.hpp>
#include <string>
#include <string_view>
#include <variant>
#include <vector>

#include "model/model_loader.h"
#include "server/chat_template.h"
#include "server/generation.h"
#include "server/openai_api.h"
#include "server/tool_calls.h"

namespace {

using kvp::server::ApiError;
using kvp::server::GenerationRequest;

struct Model {
  kvp::Tokenizer tokenizer;
  kvp::ChatTemplate chat_template;
  kvp::server::ServerContext context;
};

template <typename T>
T or_exit(kvp::Result<T> result) {
  if (!result.is_ok()) {
    std::fprintf(stderr, "request_fuzz: %s (run scripts/setup.sh)\n",
                 result.status().to_string().c_str());
    std::exit(1);
  }
  return std::move(result).value();
}

Model& model() {
  static Model* loaded = [] {
    const char* dir = std::getenv("KVP_FUZZ_MODELS");
    const std::string path =
        std::string(dir != nullptr ? dir : "models") + "/SmolLM2-135M-Instruct.Q4_1.gguf";
    kvp::Tokenizer tokenizer = or_exit(kvp::load_tokenizer(path));
    kvp::ChatTemplate chat_template = or_exit(kvp::load_chat_template(path, tokenizer, ""));
    auto* m = new Model{std::move(tokenizer), std::move(chat_template), {}};
    m->context.tokenizer = &m->tokenizer;
    m->context.chat_template = &m->chat_template;
    m->context.model_name = "SmolLM2-135M-Instruct";
    return m;
  }();
  return *loaded;
}

void generation_body(std::string_view text, bool chat) {
  const kvp::server::RequestLimits limits;
  auto body = kvp::server::parse_request_body(text, limits);
  if (std::holds_alternative<ApiError>(body)) return;
  auto request =
      kvp::server::parse_generation_request(std::get<nlohmann::json>(body), chat, limits);
  if (std::holds_alternative<ApiError>(request)) return;
  (void)kvp::server::prompt_token_ids(model().context, std::get<GenerationRequest>(request));
}

void detokenize_body(std::string_view text) {
  auto body = kvp::server::parse_request_body(text, kvp::server::RequestLimits{});
  if (std::holds_alternative<ApiError>(body)) return;
  const kvp::Tokenizer& tokenizer = model().tokenizer;
  auto ids = kvp::server::parse_detokenize_request(std::get<nlohmann::json>(body),
                                                   static_cast<int64_t>(tokenizer.num_tokens()));
  if (std::holds_alternative<ApiError>(ids)) return;
  auto decoded = tokenizer.decode(std::get<std::vector<int32_t>>(ids));
  if (decoded.is_ok()) (void)nlohmann::json{{"prompt", *decoded}}.dump();  // the server's reply
}

void model_output(std::string_view text) {
  using kvp::ToolCallFormat;
  for (ToolCallFormat format : {ToolCallFormat::kNone, ToolCallFormat::kHermes,
                                ToolCallFormat::kLlama3Json, ToolCallFormat::kMistral}) {
    kvp::IdSource whole_ids(7);
    const kvp::ParsedReply whole = kvp::parse_tool_calls(format, text, whole_ids);

    kvp::IdSource stream_ids(7);
    kvp::ToolCallStream stream(format, &stream_ids);
    kvp::ParsedReply streamed;
    auto absorb = [&](const kvp::StreamDelta& delta) {
      streamed.content += delta.content;
      for (const kvp::ToolCallDelta& call : delta.tool_calls) {
        if (call.index == static_cast<int32_t>(streamed.tool_calls.size())) {
          streamed.tool_calls.push_back({call.id.value_or(""), call.name.value_or(""), ""});
        }
        if (call.index < 0 || call.index >= static_cast<int32_t>(streamed.tool_calls.size())) {
          std::abort();  // a delta for a call that was never started
        }
        streamed.tool_calls[call.index].arguments += call.arguments;
      }
    };
    size_t pos = 0;
    while (pos < text.size()) {
      const size_t piece = 1 + static_cast<unsigned char>(text[pos]) % 7;
      absorb(stream.push(text.substr(pos, piece)));
      pos += piece;
    }
    absorb(stream.finish());

    bool same =
        whole.content == streamed.content && whole.tool_calls.size() == streamed.tool_calls.size();
    for (size_t i = 0; same && i < whole.tool_calls.size(); ++i) {
      same = whole.tool_calls[i].id == streamed.tool_calls[i].id &&
             whole.tool_calls[i].name == streamed.tool_calls[i].name &&
             whole.tool_calls[i].arguments == streamed.tool_calls[i].arguments;
    }
    if (!same) {
      std::fprintf(stderr, "request_fuzz: format %s: the stream and the whole-text parse differ\n",
                   kvp::tool_call_format_name(format));
      std::fprintf(stderr, "  whole:    content '%s', %zu calls\n", whole.content.c_str(),
                   whole.tool_calls.size());
      std::fprintf(stderr, "  streamed: content '%s', %zu calls\n", streamed.content.c_str(),
                   streamed.tool_calls.size());
      std::abort();
    }
  }
}

}  // namespace

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  model();
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  const char mode = static_cast<char>(data[0]);
  const std::string_view rest(reinterpret_cast<const char*>(data) + 1, size - 1);
  switch (mode) {
    case 'c':
      generation_body(rest, /*chat=*/true);
      break;
    case 'p':
      generation_body(rest, /*chat=*/false);
      break;
    case 'd':
      detokenize_body(rest);
      break;
    case 't':
      model_output(rest);
      break;
    default:
      generation_body(rest, /*chat=*/(mode & 1) != 0);
      break;
  }
  return 0;
}
