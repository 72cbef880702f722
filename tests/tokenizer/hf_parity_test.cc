// Parity with Hugging Face `tokenizers` on the two real models' vocabularies.
//
// At test time, tests/tokenizer/hf_reference.py (run with .venv/bin/python from the repo root)
// builds HF tokenizers from the GGUF files' embedded vocabularies, saves them as tokenizer.json
// and encodes every line of tests/tokenizer/corpus.txt (and the whole corpus) with HF. This test
// loads the same tokenizer.json files with kvpool's loader and requires identical ids on every
// case, HF's decoded text from decode(), decode(encode(x)) == x wherever HF round-trips, and the
// incremental detokenizer's pieces to add up to the decoded text.
// Without the models or the Python environment the tests skip with a message.
#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>
#include <iterator>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "support/hf_tokenizer_reference.h"
#include "tokenizer/detokenizer.h"
#include "tokenizer/tokenizer.h"
#include "tokenizer/tokenizer_json.h"
#include "tokenizer/utf8.h"

namespace kvp {
namespace {

namespace fs = std::filesystem;

using test::count_corpus_lines;
using test::kNumRandomCases;
using Case = test::TokenizerCase;

std::vector<Case> read_cases(const fs::path& file) { return test::read_tokenizer_cases(file); }
const fs::path& reference_dir(std::string* why_not, bool* missing) {
  return test::tokenizer_reference_dir(why_not, missing);
}

std::string show(const std::vector<TokenId>& ids) {
  std::string out;
  for (TokenId id : ids) out += fmt::format("{} ", id);
  return out;
}

// Checks every case; prints each failing case with its first differing position.
// `check_decode`: also decode and stream. `mostly_roundtrips`: HF gives back at least 90% of the
// corpus lines unchanged (not so with Metaspace, whose prefix space changes leading spaces).
void expect_parity(const Tokenizer& tok, const std::vector<Case>& cases, bool check_decode,
                   bool mostly_roundtrips = true) {
  size_t num_roundtrips = 0;
  for (size_t i = 0; i < cases.size(); ++i) {
    const Case& c = cases[i];
    SCOPED_TRACE(fmt::format("case {}: \"{}\"", i, c.text.substr(0, 120)));
    auto ids = tok.encode(c.text);
    ASSERT_TRUE(ids.is_ok()) << ids.status().to_string();
    if (*ids != c.ids) {
      size_t first = 0;
      while (first < ids->size() && first < c.ids.size() && (*ids)[first] == c.ids[first]) {
        ++first;
      }
      ADD_FAILURE() << "ids differ from HF at position " << first << "\n  kvpool: " << show(*ids)
                    << "\n  HF:     " << show(c.ids);
      continue;
    }
    auto plain = tok.encode(c.text, {.add_special_tokens = false});
    ASSERT_TRUE(plain.is_ok());
    EXPECT_EQ(*plain, c.ids_plain);
    auto literal = tok.encode(c.text, {.parse_special = false});
    ASSERT_TRUE(literal.is_ok());
    EXPECT_EQ(*literal, c.ids_literal) << "with parse_special = false";
    if (!check_decode) continue;

    auto decoded = tok.decode(c.ids_plain);
    ASSERT_TRUE(decoded.is_ok()) << decoded.status().to_string();
    EXPECT_EQ(*decoded, c.decoded);
    if (c.decoded == c.text) {
      EXPECT_EQ(*decoded, c.text) << "HF round-trips this text, kvpool does not";
      if (i <= count_corpus_lines()) ++num_roundtrips;
    }

    IncrementalDetokenizer stream(tok);
    std::string streamed;
    for (TokenId id : c.ids_plain) {
      auto piece = stream.push(id);
      ASSERT_TRUE(piece.is_ok());
      EXPECT_TRUE(utf8::is_valid(*piece)) << "a streamed piece is not valid UTF-8";
      streamed += *piece;
    }
    streamed += stream.finish();
    EXPECT_EQ(streamed, c.decoded) << "streamed pieces do not add up to the decoded text";
  }
  if (check_decode && mostly_roundtrips) {
    // Nearly every corpus line is text that HF decodes back exactly. (Random texts need not be:
    // SmolLM2's vocab lacks the bytes of some 4-byte characters, which HF then drops.)
    EXPECT_GE(num_roundtrips, (count_corpus_lines() + 1) * 9 / 10);
  }
}

class HfParity : public ::testing::Test {
 protected:
  void SetUp() override {
    std::string why_not;
    bool missing = false;
    dir_ = reference_dir(&why_not, &missing);
    if (dir_.empty() && missing) GTEST_SKIP() << why_not;
    if (dir_.empty()) FAIL() << why_not;
  }
  std::vector<Case> cases(const char* name) const {
    auto all = read_cases(dir_ / name / "expected.jsonl");
    EXPECT_EQ(all.size(), count_corpus_lines() + 1 + kNumRandomCases)
        << "one case per corpus line, the whole corpus, then the random texts";
    return all;
  }
  fs::path dir_;
};

TEST_F(HfParity, SmolLm2TokenizerJsonMatchesHfOnCorpus) {
  auto tok = Tokenizer::from_tokenizer_json((dir_ / "smollm2" / "tokenizer.json").string());
  ASSERT_TRUE(tok.is_ok()) << tok.status().to_string();
  EXPECT_EQ(tok->vocab().model, TokenizerModel::kByteLevelBpe);
  expect_parity(*tok, cases("smollm2"), /*check_decode=*/true);
}

TEST_F(HfParity, Gemma3TokenizerJsonMatchesHfOnCorpus) {
  auto tok = Tokenizer::from_tokenizer_json((dir_ / "gemma3" / "tokenizer.json").string());
  ASSERT_TRUE(tok.is_ok()) << tok.status().to_string();
  EXPECT_EQ(tok->vocab().model, TokenizerModel::kSentencePieceBpe);
  EXPECT_TRUE(tok->vocab().add_bos);
  expect_parity(*tok, cases("gemma3"), /*check_decode=*/true);
}

// The GGUF path: a vocab as the GGUF reader fills it (no pipeline from tokenizer.json), with
// the pipeline pipeline_for_gguf() derives from tokenizer.ggml.pre / model.
TEST_F(HfParity, SmolLm2GgufStyleVocabMatchesHf) {
  auto json = load_tokenizer_json((dir_ / "smollm2" / "tokenizer.json").string());
  ASSERT_TRUE(json.is_ok()) << json.status().to_string();
  TokenizerVocab vocab = json->vocab;
  vocab.pre = "smollm";
  auto pipeline = pipeline_for_gguf(vocab);
  ASSERT_TRUE(pipeline.is_ok()) << pipeline.status().to_string();
  auto tok = Tokenizer::create(vocab, *pipeline);
  ASSERT_TRUE(tok.is_ok()) << tok.status().to_string();
  expect_parity(*tok, cases("smollm2"), /*check_decode=*/true);
}

// Llama 3's and Qwen2's pre-tokenizer regexes (PCRE2 here, Oniguruma in HF) over SmolLM2's
// byte-level vocabulary, from tokenizer.json and from the GGUF `pre` names.
TEST_F(HfParity, Llama3AndQwen2RegexesMatchHf) {
  for (const char* pre : {"llama3", "qwen2"}) {
    SCOPED_TRACE(pre);
    const std::string name = std::string("smollm2_") + pre;
    auto json = load_tokenizer_json((dir_ / name / "tokenizer.json").string());
    ASSERT_TRUE(json.is_ok()) << json.status().to_string();
    EXPECT_EQ(json->pipeline.ignore_merges, std::string(pre) == "llama3");
    auto from_json = Tokenizer::create(json->vocab, json->pipeline);
    ASSERT_TRUE(from_json.is_ok()) << from_json.status().to_string();
    const std::vector<Case> all = cases(name.c_str());
    expect_parity(*from_json, all, /*check_decode=*/true);

    TokenizerVocab vocab = json->vocab;
    vocab.pre = pre;
    auto pipeline = pipeline_for_gguf(vocab);
    ASSERT_TRUE(pipeline.is_ok()) << pipeline.status().to_string();
    auto from_gguf = Tokenizer::create(vocab, *pipeline);
    ASSERT_TRUE(from_gguf.is_ok()) << from_gguf.status().to_string();
    expect_parity(*from_gguf, all, /*check_decode=*/false);
  }
}

// Gemma 3's vocabulary behind a Metaspace pre-tokenizer (prepend "first" without split, and
// "always" with split and the Metaspace decoder), as newer HF Llama-style files have it.
TEST_F(HfParity, MetaspacePreTokenizerMatchesHf) {
  for (const char* name : {"gemma3_metaspace_first", "gemma3_metaspace_always"}) {
    SCOPED_TRACE(name);
    auto tok = Tokenizer::from_tokenizer_json((dir_ / name / "tokenizer.json").string());
    ASSERT_TRUE(tok.is_ok()) << tok.status().to_string();
    expect_parity(*tok, cases(name), /*check_decode=*/true, /*mostly_roundtrips=*/false);
  }
}

// A GGUF-style SentencePiece vocab: tokenizer.json's tokens with the GGUF scores and token
// types, no merges, and the pipeline pipeline_for_gguf() derives.
Result<Tokenizer> gguf_style_spm(const fs::path& dir, bool add_space_prefix) {
  KVP_ASSIGN_OR_RETURN(TokenizerJson json, load_tokenizer_json((dir / "tokenizer.json").string()));
  std::ifstream in(dir / "scores.json");
  const auto scores = nlohmann::json::parse(in);
  TokenizerVocab vocab = json.vocab;
  vocab.merges.clear();
  vocab.scores = scores.at("scores").get<std::vector<float>>();
  vocab.token_types.clear();
  for (int t : scores.at("token_types").get<std::vector<int>>()) {
    vocab.token_types.push_back(static_cast<TokenType>(t));
  }
  vocab.pre = "default";
  vocab.add_space_prefix = add_space_prefix;
  return Tokenizer::from_gguf_vocab(std::move(vocab));
}

// SentencePiece merging by score (llama.cpp's way for a "llama" vocab without merges) against
// HF BPE with merges ordered by the same scores.
TEST_F(HfParity, Gemma3ScoreMergingWithoutMergesMatchesHf) {
  auto tok = gguf_style_spm(dir_ / "gemma3", /*add_space_prefix=*/false);
  ASSERT_TRUE(tok.is_ok()) << tok.status().to_string();
  EXPECT_EQ(tok->vocab().scores.size(), tok->num_tokens());
  expect_parity(*tok, cases("gemma3"), /*check_decode=*/true);
}

// add_space_prefix (Llama 2 style): Prepend "▁" per stretch between added tokens, and a Strip
// decoder that removes it again; from tokenizer.json and from a GGUF-style vocab.
TEST_F(HfParity, SpacePrefixMatchesHf) {
  const fs::path dir = dir_ / "gemma3_space_prefix";
  auto from_json = Tokenizer::from_tokenizer_json((dir / "tokenizer.json").string());
  ASSERT_TRUE(from_json.is_ok()) << from_json.status().to_string();
  const std::vector<Case> all = cases("gemma3_space_prefix");
  expect_parity(*from_json, all, /*check_decode=*/true);
  auto from_gguf = gguf_style_spm(dir, /*add_space_prefix=*/true);
  ASSERT_TRUE(from_gguf.is_ok()) << from_gguf.status().to_string();
  expect_parity(*from_gguf, all, /*check_decode=*/true);
}

}  // namespace
}  // namespace kvp
