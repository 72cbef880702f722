// tokenizer.json loading and encoding edge cases on small hand-written tokenizers: bad files
// give a Status naming the component and reason; merges, added tokens and byte fallback behave
// as worked out by hand below.
#include "tokenizer/tokenizer_json.h"

#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include "tokenizer/tokenizer.h"

namespace kvp {
namespace {

using nlohmann::json;

// A byte-level BPE over "a", "b", "c", "Ġ" with merges a+b (rank 0), ab+c (rank 1), Ġ+ab.
json tiny_byte_level() {
  return json::parse(R"({
    "added_tokens": [
      {"id": 7, "content": "<|s|>", "special": true, "normalized": false,
       "lstrip": false, "rstrip": false, "single_word": false}
    ],
    "normalizer": null,
    "pre_tokenizer": {"type": "ByteLevel", "add_prefix_space": false, "use_regex": true},
    "post_processor": null,
    "decoder": {"type": "ByteLevel"},
    "model": {"type": "BPE", "dropout": null, "unk_token": null, "fuse_unk": false,
              "byte_fallback": false,
              "vocab": {"a": 0, "b": 1, "c": 2, "\u0120": 3, "ab": 4, "abc": 5, "\u0120ab": 6},
              "merges": ["a b", ["ab", "c"], "\u0120 ab"]}
  })");
}

Result<Tokenizer> make(const json& j) {
  auto parsed = parse_tokenizer_json(j.dump(), "test.json");
  if (!parsed.is_ok()) return parsed.status();
  return Tokenizer::create(std::move(parsed->vocab), std::move(parsed->pipeline));
}

void expect_error(const json& j, StatusCode code, const std::string& needle) {
  auto tok = make(j);
  ASSERT_FALSE(tok.is_ok()) << "accepted: " << j.dump().substr(0, 200);
  EXPECT_EQ(tok.status().code(), code) << tok.status().to_string();
  EXPECT_NE(tok.status().message().find(needle), std::string::npos)
      << "message '" << tok.status().message() << "' does not name '" << needle << "'";
}

TEST(TokenizerJson, MergesByRankAndAddedTokens) {
  auto tok = make(tiny_byte_level());
  ASSERT_TRUE(tok.is_ok()) << tok.status().to_string();
  // "abc ab<|s|>ab": pieces "abc", " ab", then the added token, then "ab".
  auto ids = tok->encode("abc ab<|s|>ab");
  ASSERT_TRUE(ids.is_ok()) << ids.status().to_string();
  EXPECT_EQ(*ids, (std::vector<TokenId>{5, 6, 7, 4}));
  auto text = tok->decode(*ids);
  ASSERT_TRUE(text.is_ok());
  EXPECT_EQ(*text, "abc ab<|s|>ab");
  auto skipped = tok->decode(*ids, /*skip_special=*/true);
  ASSERT_TRUE(skipped.is_ok());
  EXPECT_EQ(*skipped, "abc abab");
}

// lstrip/rstrip: the added token swallows whitespace (Unicode too) on its sides. Expected ids
// worked out by hand and confirmed with HF tokenizers 0.23.2 on the same JSON.
TEST(TokenizerJson, AddedTokenLstripRstripSwallowWhitespace) {
  json j = tiny_byte_level();
  j["model"]["vocab"]["<|s|>"] = 7;
  j["model"]["vocab"]["<m>"] = 8;
  j["added_tokens"].push_back(json::parse(R"({"id": 8, "content": "<m>", "special": true,
      "normalized": false, "lstrip": true, "rstrip": true, "single_word": false})"));
  auto tok = make(j);
  ASSERT_TRUE(tok.is_ok()) << tok.status().to_string();
  const std::vector<std::pair<std::string, std::vector<TokenId>>> cases = {
      {"ab  <m>  ab", {4, 8, 4}},
      {"ab<m>ab", {4, 8, 4}},
      {" <m>\n ab", {8, 4}},
      {"ab <|s|> <m> ab", {4, 3, 7, 8, 4}},
      {"ab <|s|>  <m>ab", {4, 3, 7, 8, 4}},
      {"ab\u3000<m>\u00a0ab", {4, 8, 4}},
  };
  for (const auto& [text, expected] : cases) {
    auto ids = tok->encode(text);
    ASSERT_TRUE(ids.is_ok());
    EXPECT_EQ(*ids, expected) << text;
  }
}

TEST(TokenizerJson, ParseSpecialFalseEncodesSpecialTextAsText) {
  auto tok = make(tiny_byte_level());
  ASSERT_TRUE(tok.is_ok());
  // "<", "|", ">" are not in the tiny vocab and there is no unk: HF drops them; "s" too.
  auto ids = tok->encode("ab<|s|>", {.parse_special = false});
  ASSERT_TRUE(ids.is_ok());
  EXPECT_EQ(*ids, (std::vector<TokenId>{4}));
}

TEST(TokenizerJson, InvalidUtf8InputIsRefused) {
  auto tok = make(tiny_byte_level());
  ASSERT_TRUE(tok.is_ok());
  auto ids = tok->encode("ab\xC3(");
  ASSERT_FALSE(ids.is_ok());
  EXPECT_EQ(ids.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(ids.status().message().find("byte 2"), std::string::npos) << ids.status().message();
}

TEST(TokenizerJson, DecodeRejectsUnknownId) {
  auto tok = make(tiny_byte_level());
  ASSERT_TRUE(tok.is_ok());
  const std::vector<TokenId> ids = {0, 99};
  auto text = tok->decode(ids);
  ASSERT_FALSE(text.is_ok());
  EXPECT_NE(text.status().message().find("99"), std::string::npos);
}

TEST(TokenizerJson, NotJsonIsCorruption) {
  auto parsed = parse_tokenizer_json("{\"model\": ", "broken.json");
  ASSERT_FALSE(parsed.is_ok());
  EXPECT_EQ(parsed.status().code(), StatusCode::kCorruption);
  EXPECT_NE(parsed.status().message().find("broken.json"), std::string::npos);
}

TEST(TokenizerJson, MissingFileIsNotFound) {
  auto parsed = load_tokenizer_json("/nonexistent/dir/tokenizer.json");
  ASSERT_FALSE(parsed.is_ok());
  EXPECT_EQ(parsed.status().code(), StatusCode::kNotFound);
  EXPECT_NE(parsed.status().message().find("/nonexistent/dir/tokenizer.json"), std::string::npos);
}

TEST(TokenizerJson, UnsupportedComponentsAreNamed) {
  json j = tiny_byte_level();
  j["model"]["type"] = "WordPiece";
  expect_error(j, StatusCode::kUnsupported, "WordPiece");

  j = tiny_byte_level();
  j["normalizer"] = json::parse(R"({"type": "NFKC"})");
  expect_error(j, StatusCode::kUnsupported, "NFKC");

  j = tiny_byte_level();
  j["pre_tokenizer"] = json::parse(R"({"type": "Whitespace"})");
  expect_error(j, StatusCode::kUnsupported, "Whitespace");

  j = tiny_byte_level();
  j["decoder"] = json::parse(R"({"type": "WordPiece", "prefix": "##"})");
  expect_error(j, StatusCode::kUnsupported, "WordPiece");

  j = tiny_byte_level();
  j["post_processor"] = json::parse(R"({"type": "BertProcessing"})");
  expect_error(j, StatusCode::kUnsupported, "BertProcessing");

  j = tiny_byte_level();
  j["model"]["dropout"] = 0.1;
  expect_error(j, StatusCode::kUnsupported, "dropout");
}

TEST(TokenizerJson, BrokenFieldsAreCorruption) {
  json j = tiny_byte_level();
  j["model"]["merges"].push_back("a zzz");
  expect_error(j, StatusCode::kCorruption, "zzz");

  j = tiny_byte_level();
  j["model"]["vocab"]["a"] = "zero";
  expect_error(j, StatusCode::kCorruption, "model.vocab");

  j = tiny_byte_level();
  j["model"]["merges"].push_back(42);
  expect_error(j, StatusCode::kCorruption, "model.merges");

  j = tiny_byte_level();
  j["model"].erase("vocab");
  expect_error(j, StatusCode::kCorruption, "model.vocab");

  j = tiny_byte_level();
  j["model"]["unk_token"] = "<missing>";
  expect_error(j, StatusCode::kCorruption, "<missing>");

  j = tiny_byte_level();
  j["added_tokens"][0]["id"] = 3;  // id 3 is "Ġ" in the vocab
  expect_error(j, StatusCode::kCorruption, "added_tokens");
}

TEST(TokenizerJson, BadRegexIsInvalidArgument) {
  json j = tiny_byte_level();
  j["pre_tokenizer"] = json::parse(R"({"type": "Split", "pattern": {"Regex": "(unclosed"},
                                       "behavior": "Isolated", "invert": false})");
  expect_error(j, StatusCode::kInvalidArgument, "(unclosed");
}

// SentencePiece style with byte fallback and fused unk; pieces worked out by hand.
// A post-processor id of 2^32 + 1 wrapped to the valid id 1 in get<int32_t>().
TEST(TokenizerJson, PostProcessorIdsPast32BitsAreRefused) {
  json j = tiny_byte_level();
  j["post_processor"] = json::parse(R"({"type": "TemplateProcessing",
      "single": [{"SpecialToken": {"id": "<|s|>", "type_id": 0}},
                 {"Sequence": {"id": "A", "type_id": 0}}],
      "pair": [], "special_tokens": {"<|s|>": {"id": "<|s|>", "ids": [4294967303],
                                               "tokens": ["<|s|>"]}}})");
  expect_error(j, StatusCode::kCorruption, "special token '<|s|>' has id 4294967303");
  j["post_processor"]["special_tokens"]["<|s|>"]["ids"][0] = 7;
  EXPECT_TRUE(make(j).is_ok()) << make(j).status().to_string();
}

TEST(TokenizerJson, SentencePieceByteFallbackAndFusedUnk) {
  const json j = json::parse(R"({
    "added_tokens": [{"id": 0, "content": "<unk>", "special": true, "normalized": false},
                     {"id": 1, "content": "<s>", "special": true, "normalized": false}],
    "normalizer": {"type": "Sequence", "normalizers": [
        {"type": "Prepend", "prepend": "\u2581"},
        {"type": "Replace", "pattern": {"String": " "}, "content": "\u2581"}]},
    "pre_tokenizer": null,
    "post_processor": {"type": "TemplateProcessing",
        "single": [{"SpecialToken": {"id": "<s>", "type_id": 0}},
                   {"Sequence": {"id": "A", "type_id": 0}}],
        "pair": [], "special_tokens": {"<s>": {"id": "<s>", "ids": [1], "tokens": ["<s>"]}}},
    "decoder": {"type": "Sequence", "decoders": [
        {"type": "Replace", "pattern": {"String": "\u2581"}, "content": " "},
        {"type": "ByteFallback"}, {"type": "Fuse"},
        {"type": "Strip", "content": " ", "start": 1, "stop": 0}]},
    "model": {"type": "BPE", "unk_token": "<unk>", "fuse_unk": true, "byte_fallback": true,
              "vocab": {"<unk>": 0, "<s>": 1, "\u2581": 2, "h": 3, "i": 4, "\u2581h": 5,
                        "\u2581hi": 6, "<0xC3>": 7, "<0xA9>": 8},
              "merges": [["\u2581", "h"], ["\u2581h", "i"]]}
  })");
  auto tok = make(j);
  ASSERT_TRUE(tok.is_ok()) << tok.status().to_string();
  EXPECT_TRUE(tok->vocab().add_bos);
  // "hi é" -> "▁hi▁é": ▁hi, ▁, é as bytes C3 A9. "xy" has no tokens and no bytes for its
  // characters (x=0x78 is absent) -> one fused <unk>.
  auto ids = tok->encode("hi \xC3\xA9xy");
  ASSERT_TRUE(ids.is_ok());
  EXPECT_EQ(*ids, (std::vector<TokenId>{1, 6, 2, 7, 8, 0}));
  const std::vector<TokenId> plain = {6, 2, 7, 8};
  auto text = tok->decode(plain);
  ASSERT_TRUE(text.is_ok());
  EXPECT_EQ(*text, "hi \xC3\xA9");
  // A lone continuation byte token is not valid UTF-8: HF gives one U+FFFD per byte.
  const std::vector<TokenId> broken = {6, 8, 8};
  text = tok->decode(broken);
  ASSERT_TRUE(text.is_ok());
  EXPECT_EQ(*text, "hi\xEF\xBF\xBD\xEF\xBF\xBD");
}

}  // namespace
}  // namespace kvp
