#include "server/tool_calls.h"

#include <gtest/gtest.h>

#include <cctype>
#include <random>
#include <string>
#include <vector>

namespace kvp {
namespace {

constexpr uint64_t kSeed = 7;

ParsedReply parse(ToolCallFormat format, std::string_view text) {
  IdSource ids(kSeed);
  return parse_tool_calls(format, text, ids);
}

// Feeds `text` in pieces that end at `cuts`, and rebuilds a ParsedReply from the deltas the way
// an OpenAI client accumulates a stream, checking the delta shape on the way.
ParsedReply stream_in_pieces(ToolCallFormat format, std::string_view text,
                             const std::vector<size_t>& cuts) {
  IdSource ids(kSeed);
  ToolCallStream stream(format, &ids);
  ParsedReply reply;
  const auto absorb = [&](const StreamDelta& delta) {
    reply.content += delta.content;
    for (const ToolCallDelta& call : delta.tool_calls) {
      if (call.index == static_cast<int32_t>(reply.tool_calls.size())) {
        EXPECT_TRUE(call.id.has_value()) << "the first delta of a call carries its id";
        EXPECT_TRUE(call.name.has_value()) << "the first delta of a call carries its name";
        reply.tool_calls.push_back({call.id.value_or(""), call.name.value_or(""), ""});
      }
      EXPECT_LT(call.index, static_cast<int32_t>(reply.tool_calls.size()));
      reply.tool_calls.at(call.index).arguments += call.arguments;
    }
  };
  size_t begin = 0;
  for (size_t cut : cuts) {
    absorb(stream.push(text.substr(begin, cut - begin)));
    begin = cut;
  }
  absorb(stream.push(text.substr(begin)));
  absorb(stream.finish());
  EXPECT_EQ(stream.saw_tool_call(), !reply.tool_calls.empty());
  return reply;
}

void expect_same(const ParsedReply& expected, const ParsedReply& actual, const std::string& how) {
  EXPECT_EQ(expected.content, actual.content) << how;
  ASSERT_EQ(expected.tool_calls.size(), actual.tool_calls.size()) << how;
  for (size_t i = 0; i < expected.tool_calls.size(); ++i) {
    EXPECT_EQ(expected.tool_calls[i].id, actual.tool_calls[i].id) << how << " call " << i;
    EXPECT_EQ(expected.tool_calls[i].name, actual.tool_calls[i].name) << how << " call " << i;
    EXPECT_EQ(expected.tool_calls[i].arguments, actual.tool_calls[i].arguments)
        << how << " call " << i;
  }
}

TEST(ToolCallFormatTest, NamesRoundTrip) {
  for (ToolCallFormat format : {ToolCallFormat::kNone, ToolCallFormat::kHermes,
                                ToolCallFormat::kLlama3Json, ToolCallFormat::kMistral}) {
    Result<ToolCallFormat> parsed = parse_tool_call_format(tool_call_format_name(format));
    ASSERT_TRUE(parsed.is_ok());
    EXPECT_EQ(*parsed, format);
  }
}

TEST(ToolCallFormatTest, UnknownNameIsInvalidArgumentNamingTheChoices) {
  Result<ToolCallFormat> parsed = parse_tool_call_format("qwen");
  ASSERT_FALSE(parsed.is_ok());
  EXPECT_EQ(parsed.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(parsed.status().message().find("'qwen'"), std::string::npos);
  EXPECT_NE(parsed.status().message().find("hermes, llama3_json, mistral"), std::string::npos);
}

TEST(ToolCallFormatTest, DetectsFormatFromTemplateMarkers) {
  EXPECT_EQ(detect_tool_call_format(
                "{%- if tools %}<tools>{{ tool | tojson }}</tools>\nFor each function call, "
                "return a json object within <tool_call></tool_call> XML tags{%- endif %}"),
            ToolCallFormat::kHermes);
  EXPECT_EQ(detect_tool_call_format("{{- '[TOOL_CALLS][' }}{% for tool_call in tool_calls %}"),
            ToolCallFormat::kMistral);
  EXPECT_EQ(detect_tool_call_format("{{- '<|python_tag|>' + tool_call.name + '.call(' }}"),
            ToolCallFormat::kLlama3Json);
  EXPECT_EQ(detect_tool_call_format("<|start_header_id|>user<|end_header_id|>Respond in the "
                                    "format {\"name\": function name, \"parameters\": dictionary"),
            ToolCallFormat::kLlama3Json);
  EXPECT_EQ(detect_tool_call_format("{% for message in messages %}<|im_start|>{{ message.role }}"
                                    "\n{{ message.content }}<|im_end|>{% endfor %}"),
            ToolCallFormat::kNone);
}

TEST(IdSourceTest, IdsAreCallPrefixAndTwentyFourAlphanumerics) {
  IdSource ids(kSeed);
  const std::string first = ids.next_tool_call_id();
  ASSERT_EQ(first.size(), 5u + 24u);
  EXPECT_EQ(first.substr(0, 5), "call_");
  for (char c : first.substr(5)) EXPECT_TRUE(std::isalnum(static_cast<unsigned char>(c))) << c;
  EXPECT_NE(ids.next_tool_call_id(), first);
}

TEST(IdSourceTest, SameSeedGivesSameIds) {
  IdSource a(kSeed);
  IdSource b(kSeed);
  for (int i = 0; i < 4; ++i) EXPECT_EQ(a.next_tool_call_id(), b.next_tool_call_id());
}

TEST(HermesTest, SingleCallHasNoContentAndCompactArguments) {
  const ParsedReply reply = parse(
      ToolCallFormat::kHermes,
      "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\", \"days\": "
      "3}}\n</tool_call>");
  EXPECT_EQ(reply.content, "");
  ASSERT_EQ(reply.tool_calls.size(), 1u);
  EXPECT_EQ(reply.tool_calls[0].name, "get_weather");
  EXPECT_EQ(reply.tool_calls[0].arguments, R"({"city":"Paris","days":3})");
  EXPECT_EQ(reply.tool_calls[0].id.substr(0, 5), "call_");
}

TEST(HermesTest, ContentBeforeCallsAndSeveralCalls) {
  const ParsedReply reply =
      parse(ToolCallFormat::kHermes,
            "Let me check both.\n\n<tool_call>\n{\"name\": \"a\", \"arguments\": {\"x\": 1}}\n"
            "</tool_call>\n<tool_call>\n{\"name\": \"b\", \"arguments\": {}}\n</tool_call>\n");
  EXPECT_EQ(reply.content, "Let me check both.");
  ASSERT_EQ(reply.tool_calls.size(), 2u);
  EXPECT_EQ(reply.tool_calls[0].name, "a");
  EXPECT_EQ(reply.tool_calls[0].arguments, R"({"x":1})");
  EXPECT_EQ(reply.tool_calls[1].name, "b");
  EXPECT_EQ(reply.tool_calls[1].arguments, "{}");
  EXPECT_NE(reply.tool_calls[0].id, reply.tool_calls[1].id);
}

TEST(HermesTest, ArgumentKeysKeepTheModelsOrder) {
  const ParsedReply reply = parse(
      ToolCallFormat::kHermes,
      R"(<tool_call>{"name": "f", "arguments": {"zeta": 1, "alpha": [1, 2], "mid": null}}</tool_call>)");
  ASSERT_EQ(reply.tool_calls.size(), 1u);
  EXPECT_EQ(reply.tool_calls[0].arguments, R"({"zeta":1,"alpha":[1,2],"mid":null})");
}

TEST(HermesTest, QuotedArgumentsAndMissingArgumentsAreAccepted) {
  const ParsedReply quoted =
      parse(ToolCallFormat::kHermes,
            R"(<tool_call>{"name": "f", "arguments": "{\"q\": \"x\"}"}</tool_call>)");
  ASSERT_EQ(quoted.tool_calls.size(), 1u);
  EXPECT_EQ(quoted.tool_calls[0].arguments, R"({"q":"x"})");
  const ParsedReply missing =
      parse(ToolCallFormat::kHermes, R"(<tool_call>{"name": "now"}</tool_call>)");
  ASSERT_EQ(missing.tool_calls.size(), 1u);
  EXPECT_EQ(missing.tool_calls[0].arguments, "{}");
}

TEST(HermesTest, InvalidJsonStaysContentVerbatim) {
  const std::string text =
      "Hi <tool_call>{\"name\": \"f\", \"arguments\": {\"x\": }</tool_call> bye";
  const ParsedReply reply = parse(ToolCallFormat::kHermes, text);
  EXPECT_EQ(reply.content, text);
  EXPECT_TRUE(reply.tool_calls.empty());
}

TEST(HermesTest, CallWithoutNameOrWithArrayArgumentsStaysContent) {
  for (const std::string text : {R"(<tool_call>{"arguments": {}}</tool_call>)",
                                 R"(<tool_call>{"name": "", "arguments": {}}</tool_call>)",
                                 R"(<tool_call>{"name": "f", "arguments": [1]}</tool_call>)",
                                 R"(<tool_call>[{"name": "f", "arguments": {}}]</tool_call>)"}) {
    const ParsedReply reply = parse(ToolCallFormat::kHermes, text);
    EXPECT_EQ(reply.content, text);
    EXPECT_TRUE(reply.tool_calls.empty()) << text;
  }
}

TEST(HermesTest, InvalidCallDoesNotHideTheValidOneAfterIt) {
  const ParsedReply reply = parse(
      ToolCallFormat::kHermes,
      "<tool_call>{oops</tool_call><tool_call>{\"name\": \"g\", \"arguments\": {}}</tool_call>");
  EXPECT_EQ(reply.content, "<tool_call>{oops</tool_call>");
  ASSERT_EQ(reply.tool_calls.size(), 1u);
  EXPECT_EQ(reply.tool_calls[0].name, "g");
}

TEST(HermesTest, UnclosedCallBeforeANewOneIsContent) {
  const ParsedReply reply =
      parse(ToolCallFormat::kHermes,
            "<tool_call>{\"name\": <tool_call>{\"name\": \"g\", \"arguments\": {}}</tool_call>");
  EXPECT_EQ(reply.content, "<tool_call>{\"name\":");
  ASSERT_EQ(reply.tool_calls.size(), 1u);
  EXPECT_EQ(reply.tool_calls[0].name, "g");
}

TEST(HermesTest, UnterminatedIncompleteCallIsContent) {
  const std::string text = "Sure <tool_call>\n{\"name\": \"f\", \"argu";
  const ParsedReply reply = parse(ToolCallFormat::kHermes, text);
  EXPECT_EQ(reply.content, text);
  EXPECT_TRUE(reply.tool_calls.empty());
}

TEST(HermesTest, CompleteCallMissingOnlyItsClosingTagCounts) {
  const ParsedReply reply =
      parse(ToolCallFormat::kHermes, "<tool_call>\n{\"name\": \"f\", \"arguments\": {\"a\": 1}}\n");
  EXPECT_EQ(reply.content, "");
  ASSERT_EQ(reply.tool_calls.size(), 1u);
  EXPECT_EQ(reply.tool_calls[0].arguments, R"({"a":1})");
}

TEST(HermesTest, PartialMarkerAtTheEndIsContent) {
  const ParsedReply reply = parse(ToolCallFormat::kHermes, "a < b and <tool_c");
  EXPECT_EQ(reply.content, "a < b and <tool_c");
  EXPECT_TRUE(reply.tool_calls.empty());
}

TEST(HermesTest, TextAfterACallIsContentWithItsLeadingSpace) {
  const ParsedReply reply = parse(
      ToolCallFormat::kHermes, "A <tool_call>{\"name\": \"f\", \"arguments\": {}}</tool_call> B\n");
  EXPECT_EQ(reply.content, "A B\n");
  EXPECT_EQ(reply.tool_calls.size(), 1u);
}

TEST(HermesTest, UnicodeArgumentsComeOutAsUtf8) {
  const ParsedReply reply =
      parse(ToolCallFormat::kHermes,
            "<tool_call>{\"name\": \"translate\", \"arguments\": {\"text\": \"caf\\u00e9 "
            "\xE2\x98\x95 \xF0\x9F\x98\x80\", \"to\": \"\xE6\x97\xA5\xE6\x9C\xAC\"}}</tool_call>");
  ASSERT_EQ(reply.tool_calls.size(), 1u);
  EXPECT_EQ(reply.tool_calls[0].arguments,
            "{\"text\":\"caf\xC3\xA9 \xE2\x98\x95 "
            "\xF0\x9F\x98\x80\",\"to\":\"\xE6\x97\xA5\xE6\x9C\xAC\"}");
}

TEST(HermesTest, PlainReplyIsUnchanged) {
  const std::string text = "  Hello,\n world!\n\n";
  EXPECT_EQ(parse(ToolCallFormat::kHermes, text).content, text);
  EXPECT_EQ(parse(ToolCallFormat::kNone, text).content, text);
}

TEST(Llama3JsonTest, WholeReplyIsOneCall) {
  const ParsedReply reply = parse(
      ToolCallFormat::kLlama3Json,
      R"({"name": "get_weather", "parameters": {"location": "San Francisco, CA", "unit": "c"}})");
  EXPECT_EQ(reply.content, "");
  ASSERT_EQ(reply.tool_calls.size(), 1u);
  EXPECT_EQ(reply.tool_calls[0].name, "get_weather");
  EXPECT_EQ(reply.tool_calls[0].arguments, R"({"location":"San Francisco, CA","unit":"c"})");
}

TEST(Llama3JsonTest, PythonTagArgumentsKeyAndSeveralCalls) {
  const ParsedReply reply = parse(ToolCallFormat::kLlama3Json,
                                  "<|python_tag|>{\"name\": \"a\", \"arguments\": {\"x\": 1}}; "
                                  "{\"name\": \"b\", \"parameters\": {\"y\": \"}\"}}\n");
  EXPECT_EQ(reply.content, "");
  ASSERT_EQ(reply.tool_calls.size(), 2u);
  EXPECT_EQ(reply.tool_calls[0].name, "a");
  EXPECT_EQ(reply.tool_calls[0].arguments, R"({"x":1})");
  EXPECT_EQ(reply.tool_calls[1].name, "b");
  EXPECT_EQ(reply.tool_calls[1].arguments, R"({"y":"}"})");
}

TEST(Llama3JsonTest, JsonThatIsNotACallIsContent) {
  for (const std::string text :
       {R"({"answer": 42})", R"({"name": "Bob", "age": 3})", R"({"name": "f", "parameters": )",
        "<|python_tag|>print(1 + 1)", "The answer is {\"name\": \"f\", \"parameters\": {}}"}) {
    const ParsedReply reply = parse(ToolCallFormat::kLlama3Json, text);
    EXPECT_EQ(reply.content, text);
    EXPECT_TRUE(reply.tool_calls.empty()) << text;
  }
}

TEST(Llama3JsonTest, TextAfterTheCallsIsContent) {
  const ParsedReply reply = parse(ToolCallFormat::kLlama3Json,
                                  R"({"name": "f", "parameters": {}}; and then {"name": "g"})");
  ASSERT_EQ(reply.tool_calls.size(), 1u);
  EXPECT_EQ(reply.tool_calls[0].name, "f");
  EXPECT_EQ(reply.content, R"(; and then {"name": "g"})");
}

TEST(MistralTest, ArrayOfCallsAfterContent) {
  const ParsedReply reply =
      parse(ToolCallFormat::kMistral,
            "Checking.[TOOL_CALLS][{\"name\": \"a\", \"arguments\": {\"q\": \"[x]\"}}, "
            "{\"name\": \"b\", \"arguments\": {}, \"id\": \"abcdef123\"}]");
  EXPECT_EQ(reply.content, "Checking.");
  ASSERT_EQ(reply.tool_calls.size(), 2u);
  EXPECT_EQ(reply.tool_calls[0].name, "a");
  EXPECT_EQ(reply.tool_calls[0].arguments, R"({"q":"[x]"})");
  EXPECT_EQ(reply.tool_calls[1].name, "b");
  EXPECT_EQ(reply.tool_calls[1].id.substr(0, 5), "call_");
}

TEST(MistralTest, NameArgsFormWithSeveralCalls) {
  const ParsedReply reply = parse(ToolCallFormat::kMistral,
                                  "[TOOL_CALLS]get_weather[ARGS]{\"city\": \"Paris\"}"
                                  "[TOOL_CALLS]get_time[ARGS]{}");
  EXPECT_EQ(reply.content, "");
  ASSERT_EQ(reply.tool_calls.size(), 2u);
  EXPECT_EQ(reply.tool_calls[0].name, "get_weather");
  EXPECT_EQ(reply.tool_calls[0].arguments, R"({"city":"Paris"})");
  EXPECT_EQ(reply.tool_calls[1].name, "get_time");
  EXPECT_EQ(reply.tool_calls[1].arguments, "{}");
}

TEST(MistralTest, InvalidOrUnterminatedCallsStayContent) {
  for (const std::string text :
       {"[TOOL_CALLS][{\"name\": \"a\", \"arguments\": {}}, {\"arguments\": {}}]", "[TOOL_CALLS][]",
        "[TOOL_CALLS][{\"name\": \"a\", ", "[TOOL_CALLS]f[ARGS]{\"a\": tru}",
        "[TOOL_CALLS]f[ARGS]{\"a\":", "[TOOL_CALLS]f[AR", "[TOOL_CALLS] see above",
        "[TOOL_CALLS]"}) {
    const ParsedReply reply = parse(ToolCallFormat::kMistral, text);
    EXPECT_EQ(reply.content, text);
    EXPECT_TRUE(reply.tool_calls.empty()) << text;
  }
}

TEST(ToolCallStreamTest, ContentIsSentAsSoonAsItCannotStartAMarker) {
  IdSource ids(kSeed);
  ToolCallStream stream(ToolCallFormat::kHermes, &ids);
  EXPECT_EQ(stream.push("Hello, wor").content, "Hello, wor");
  EXPECT_EQ(stream.push("ld <to").content, "ld");  // " " and "<to" are held
  StreamDelta call = stream.push("ol_call>{\"name\": \"f\", \"arguments\": {\"a\": [1, 2]}}");
  EXPECT_TRUE(call.empty()) << "the call's JSON is held until the call closes";
  call = stream.push("</tool_call>\n");
  EXPECT_EQ(call.content, "");
  ASSERT_EQ(call.tool_calls.size(), 1u);
  EXPECT_EQ(call.tool_calls[0].index, 0);
  EXPECT_EQ(call.tool_calls[0].name, "f");
  EXPECT_EQ(call.tool_calls[0].arguments, R"({"a":[1,2]})");
  EXPECT_TRUE(stream.saw_tool_call());
  EXPECT_TRUE(stream.finish().empty()) << "whitespace after the last call is dropped";
}

TEST(ToolCallStreamTest, UnfinishedCallComesBackAsContentAtFinish) {
  IdSource ids(kSeed);
  ToolCallStream stream(ToolCallFormat::kMistral, &ids);
  EXPECT_EQ(stream.push("ok [TOOL_CALLS][{\"name\": ").content, "ok");
  EXPECT_EQ(stream.finish().content, " [TOOL_CALLS][{\"name\": ");
  EXPECT_FALSE(stream.saw_tool_call());
}

TEST(ToolCallStreamTest, NoneFormatPassesTextThrough) {
  IdSource ids(kSeed);
  ToolCallStream stream(ToolCallFormat::kNone, &ids);
  EXPECT_EQ(stream.push("<tool_call>{").content, "<tool_call>{");
  EXPECT_TRUE(stream.finish().empty());
}

struct StreamCase {
  ToolCallFormat format;
  std::string text;
};

std::vector<StreamCase> stream_cases() {
  const std::string unicode = "\"caf\\u00e9 \xE2\x98\x95 \xF0\x9F\x98\x80 \\\"q\\\" \\\\\"";
  return {
      {ToolCallFormat::kHermes,
       "Let me check.\n\n<tool_call>\n{\"name\": \"a\", \"arguments\": {\"s\": " + unicode +
           ", \"n\": [1, 2.5, {\"k\": null}]}}\n</tool_call>\n<tool_call>\n{\"name\": \"b\", "
           "\"arguments\": {}}\n</tool_call>"},
      {ToolCallFormat::kHermes,
       "x <tool_call>{bad}</tool_call> y <tool_call>{\"name\": \"c\", \"arguments\": {\"t\": "
       "\"</tool\"}}</tool_call> z <tool_ca"},
      {ToolCallFormat::kHermes, "<tool_call>\n{\"name\": \"f\", \"arguments\": {\"a\": 1}}\n"},
      {ToolCallFormat::kHermes, "plain text with < and <tool and </tool_call> in it \n"},
      {ToolCallFormat::kLlama3Json,
       "  <|python_tag|>{\"name\": \"a\", \"parameters\": {\"s\": " + unicode +
           "}} ; {\"name\": \"b\", \"arguments\": {\"x\": \"{[\"}}\n\n"},
      {ToolCallFormat::kLlama3Json, "{\"name\": \"a\", \"parameters\": {}} trailing words"},
      {ToolCallFormat::kLlama3Json, "{\"not\": \"a call\"} then text"},
      {ToolCallFormat::kLlama3Json, "<|python_tag|>print('hi')"},
      {ToolCallFormat::kLlama3Json, "Hello <|python_tag|>{}"},
      {ToolCallFormat::kMistral,
       "Sure.[TOOL_CALLS][{\"name\": \"a\", \"arguments\": {\"s\": " + unicode +
           "}}, {\"name\": \"b\", \"arguments\": {\"q\": \"]\"}}] after"},
      {ToolCallFormat::kMistral,
       "[TOOL_CALLS]get_weather[ARGS]{\"city\": \"Paris\"}[TOOL_CALLS]x[ARGS]{bad}"
       "[TOOL_CALLS]y[ARGS]{\"v\": " +
           unicode + "}[TOOL_CALLS] no"},
      {ToolCallFormat::kMistral, "[TOOL_CALLS][{\"name\": \"a\", \"arguments\": {}}"},
  };
}

TEST(ToolCallStreamTest, OneByteAtATimeMatchesTheWholeTextParse) {
  for (const StreamCase& c : stream_cases()) {
    const ParsedReply whole = parse(c.format, c.text);
    std::vector<size_t> cuts;
    for (size_t i = 1; i < c.text.size(); ++i) cuts.push_back(i);
    expect_same(whole, stream_in_pieces(c.format, c.text, cuts),
                std::string("bytewise ") + tool_call_format_name(c.format) + ": " + c.text);
  }
}

TEST(ToolCallStreamTest, RandomChunkingsMatchTheWholeTextParse) {
  std::mt19937 rng(1234);
  for (const StreamCase& c : stream_cases()) {
    const ParsedReply whole = parse(c.format, c.text);
    for (int trial = 0; trial < 200; ++trial) {
      std::vector<size_t> cuts;
      std::uniform_int_distribution<size_t> step(1, 12);
      for (size_t pos = step(rng); pos < c.text.size(); pos += step(rng)) cuts.push_back(pos);
      expect_same(whole, stream_in_pieces(c.format, c.text, cuts),
                  std::string("chunked ") + tool_call_format_name(c.format) + ": " + c.text);
      if (HasFailure()) return;
    }
  }
}

TEST(ToolCallStreamTest, StreamCasesParseAsExpected) {
  // Spot checks that the cases above exercise calls, not just content.
  const std::vector<StreamCase> cases = stream_cases();
  EXPECT_EQ(parse(cases[0].format, cases[0].text).tool_calls.size(), 2u);
  EXPECT_EQ(parse(cases[0].format, cases[0].text).content, "Let me check.");
  EXPECT_EQ(parse(cases[1].format, cases[1].text).content,
            "x <tool_call>{bad}</tool_call> y z <tool_ca");
  EXPECT_EQ(parse(cases[4].format, cases[4].text).tool_calls.size(), 2u);
  EXPECT_EQ(parse(cases[4].format, cases[4].text).tool_calls[0].arguments,
            "{\"s\":\"caf\xC3\xA9 \xE2\x98\x95 \xF0\x9F\x98\x80 \\\"q\\\" \\\\\"}");
  EXPECT_EQ(parse(cases[9].format, cases[9].text).tool_calls.size(), 2u);
  EXPECT_EQ(parse(cases[9].format, cases[9].text).content, "Sure. after");
  const ParsedReply mixed = parse(cases[10].format, cases[10].text);
  ASSERT_EQ(mixed.tool_calls.size(), 2u);
  EXPECT_EQ(mixed.tool_calls[1].name, "y");
  EXPECT_EQ(mixed.content, "[TOOL_CALLS]x[ARGS]{bad}[TOOL_CALLS] no");
}

}  // namespace
}  // namespace kvp
