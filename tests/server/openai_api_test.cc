// The wire types' reading of request bodies: bodies that are no JSON object, nested past the
// limit, or /detokenize ids outside the vocabulary are 400s naming the field and the limit.
#include "server/openai_api.h"

#include <gtest/gtest.h>

#include <string>
#include <variant>

namespace kvp::server {
namespace {

using json = nlohmann::json;

// A chat body whose chat_template_kwargs nest `depth` arrays.
std::string nested_body(int depth) {
  return R"({"messages": [{"role": "user", "content": "Hi"}], "chat_template_kwargs": {"x": )" +
         std::string(depth, '[') + std::string(depth, ']') + "}}";
}

TEST(RequestBody, NestingPastTheLimitIsRefusedBeforeParsing) {
  const RequestLimits limits;
  // 200,000 levels: serialising such a body (the request keeps its own copy) overflowed the
  // stack of a connection thread.
  auto deep = parse_request_body(nested_body(200000), limits);
  ASSERT_TRUE(std::holds_alternative<ApiError>(deep));
  EXPECT_EQ(std::get<ApiError>(deep).http_status, 400);
  EXPECT_NE(std::get<ApiError>(deep).message.find("limit of 64 levels"), std::string::npos)
      << std::get<ApiError>(deep).message;

  // the body's object, the kwargs object and 62 arrays: 64 levels, accepted
  auto at_limit = parse_request_body(nested_body(62), limits);
  ASSERT_TRUE(std::holds_alternative<json>(at_limit));
  auto request = parse_generation_request(std::get<json>(at_limit), /*chat=*/true, limits);
  EXPECT_TRUE(std::holds_alternative<GenerationRequest>(request));
  EXPECT_TRUE(std::holds_alternative<ApiError>(parse_request_body(nested_body(63), limits)));
}

TEST(RequestBody, ToolCallArgumentsNestedPastTheLimitAreRefused) {
  // the arguments are JSON text in a string: the body's scan does not see their brackets, and
  // they are parsed into the request's messages, which are copied (recursively) to render them
  const std::string args = "{\"x\": " + std::string(200000, '[') + std::string(200000, ']') + "}";
  const json body = {{"messages",
                      {{{"role", "user"}, {"content", "Hi"}},
                       {{"role", "assistant"},
                        {"content", nullptr},
                        {"tool_calls",
                         {{{"id", "call_1"},
                           {"type", "function"},
                           {"function", {{"name", "f"}, {"arguments", args}}}}}}}}}};
  auto parsed = parse_generation_request(body, /*chat=*/true, RequestLimits{});
  ASSERT_TRUE(std::holds_alternative<ApiError>(parsed));
  EXPECT_EQ(std::get<ApiError>(parsed).message,
            "messages[1].tool_calls[0].function.arguments nests arrays and objects deeper than "
            "the limit of 64 levels");
}

TEST(RequestBody, BracketsInsideStringsDoNotCount) {
  const std::string body = R"({"prompt": ")" + std::string(1000, '[') + R"(\"{{{"})";
  auto parsed = parse_request_body(body, RequestLimits{});
  ASSERT_TRUE(std::holds_alternative<json>(parsed));
  EXPECT_EQ(std::get<json>(parsed)["prompt"].get<std::string>().size(), 1004u);
}

TEST(RequestBody, NotJsonOrNotAnObjectIsA400) {
  for (const char* text : {"", "{", "[1, 2]", "\"text\"", "{\"a\": 1} x", "\xff"}) {
    auto parsed = parse_request_body(text, RequestLimits{});
    ASSERT_TRUE(std::holds_alternative<ApiError>(parsed)) << text;
    EXPECT_EQ(std::get<ApiError>(parsed).http_status, 400) << text;
  }
}

TEST(RequestBody, NumbersPastADoubleAreA400NotAnException) {
  // request_fuzz: the second parse (for the error's position) threw out_of_range, which only
  // parse_error was caught for: the server answered 500 "internal error"
  for (const char* text : {R"({"temperature": 1e400})", R"({"a": -77777e77777777})",
                           "{\"eotnks\":77777e77777777\x7f"}) {
    std::variant<json, ApiError> parsed = json();
    ASSERT_NO_THROW(parsed = parse_request_body(text, RequestLimits{})) << text;
    ASSERT_TRUE(std::holds_alternative<ApiError>(parsed)) << text;
    EXPECT_EQ(std::get<ApiError>(parsed).http_status, 400) << text;
    EXPECT_NE(std::get<ApiError>(parsed).message.find("number overflow"), std::string::npos)
        << std::get<ApiError>(parsed).message;
  }
}

TEST(DetokenizeRequest, IdsOutsideTheVocabularyAreRefusedNamingTheId) {
  for (const char* tokens : {"[-1]", "[100]", "[1, 2, 9223372036854775808]",
                             "[18446744073709551615]", "[\"5\"]", "[1.5]", "5", "null"}) {
    auto ids = parse_detokenize_request(json::parse(std::string("{\"tokens\": ") + tokens + "}"),
                                        /*vocab_size=*/100);
    ASSERT_TRUE(std::holds_alternative<ApiError>(ids)) << tokens;
    EXPECT_EQ(std::get<ApiError>(ids).param, "tokens") << tokens;
  }
  auto ids = parse_detokenize_request(json::parse(R"({"tokens": [0, 99, 5]})"), 100);
  ASSERT_TRUE(std::holds_alternative<std::vector<int32_t>>(ids));
  EXPECT_EQ(std::get<std::vector<int32_t>>(ids), (std::vector<int32_t>{0, 99, 5}));
}

}  // namespace
}  // namespace kvp::server
