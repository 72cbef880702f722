// Tokenizer behaviour that does not need a real model: very long inputs through every built-in
// pre-tokenizer regex (PCRE2 JIT must not run out of stack), GGUF pipeline errors, and
// concurrent use of one Tokenizer.
#include "tokenizer/tokenizer.h"

#include <gtest/gtest.h>

#include <thread>

#include "tokenizer/pre_tokenizer.h"

namespace kvp {
namespace {

// A byte-level vocab of the 256 single bytes and no merges: every byte is one token.
TokenizerVocab byte_vocab(const std::string& pre) {
  TokenizerVocab vocab;
  vocab.model = TokenizerModel::kByteLevelBpe;
  vocab.pre = pre;
  for (int b = 0; b < 256; ++b) {
    vocab.tokens.push_back(ByteLevelAlphabet::get().encode(static_cast<uint8_t>(b)));
  }
  return vocab;
}

TEST(Tokenizer, MegabyteRunsThroughEveryBuiltInRegex) {
  const std::vector<std::string> inputs = {std::string(1 << 20, 'a'), std::string(1 << 20, ' '),
                                           std::string(1 << 20, '\n'), std::string(1 << 20, '7'),
                                           std::string(1 << 20, '!')};
  for (const char* pre : {"gpt2", "smollm", "llama3", "qwen2"}) {
    SCOPED_TRACE(pre);
    TokenizerVocab vocab = byte_vocab(pre);
    auto pipeline = pipeline_for_gguf(vocab);
    ASSERT_TRUE(pipeline.is_ok()) << pipeline.status().to_string();
    auto tok = Tokenizer::create(vocab, *pipeline);
    ASSERT_TRUE(tok.is_ok()) << tok.status().to_string();
    for (const std::string& input : inputs) {
      auto ids = tok->encode(input);
      ASSERT_TRUE(ids.is_ok()) << ids.status().to_string();
      EXPECT_EQ(ids->size(), input.size());  // no merges: one token per byte
      EXPECT_EQ((*ids)[0], static_cast<TokenId>(static_cast<uint8_t>(input[0])));
    }
  }
}

TEST(Tokenizer, UnknownGgufPreIsRefusedByName) {
  auto pipeline = pipeline_for_gguf(byte_vocab("deepseek-coder-v9"));
  ASSERT_FALSE(pipeline.is_ok());
  EXPECT_EQ(pipeline.status().code(), StatusCode::kUnsupported);
  EXPECT_NE(pipeline.status().message().find("deepseek-coder-v9"), std::string::npos);
}

TEST(Tokenizer, InconsistentVocabIsRefused) {
  TokenizerVocab vocab = byte_vocab("gpt2");
  auto pipeline = pipeline_for_gguf(vocab);
  ASSERT_TRUE(pipeline.is_ok());

  TokenizerVocab bad = vocab;
  bad.scores = {1.0f, 2.0f};
  auto tok = Tokenizer::create(bad, *pipeline);
  ASSERT_FALSE(tok.is_ok());
  EXPECT_NE(tok.status().message().find("scores"), std::string::npos);

  bad = vocab;
  bad.bos_id = 300;
  bad.add_bos = true;
  tok = Tokenizer::create(bad, *pipeline);
  ASSERT_FALSE(tok.is_ok());
  EXPECT_NE(tok.status().message().find("bos_token_id 300"), std::string::npos);

  bad = vocab;
  bad.merges.emplace_back("a", "q\xC3\xA9");
  tok = Tokenizer::create(bad, *pipeline);
  ASSERT_FALSE(tok.is_ok());
  EXPECT_EQ(tok.status().code(), StatusCode::kCorruption);

  bad = vocab;
  bad.model = TokenizerModel::kSentencePieceBpe;  // neither merges nor scores
  auto spm_pipeline = pipeline_for_gguf(bad);
  ASSERT_TRUE(spm_pipeline.is_ok());
  tok = Tokenizer::create(bad, *spm_pipeline);
  ASSERT_FALSE(tok.is_ok());
  EXPECT_NE(tok.status().message().find("merges or one score per token"), std::string::npos);
}

TEST(Tokenizer, ConcurrentEncodesAgree) {
  TokenizerVocab vocab = byte_vocab("llama3");
  vocab.tokens.push_back("ab");
  vocab.merges.emplace_back("a", "b");
  auto pipeline = pipeline_for_gguf(vocab);
  ASSERT_TRUE(pipeline.is_ok());
  auto tok = Tokenizer::create(vocab, *pipeline);
  ASSERT_TRUE(tok.is_ok());
  const std::string text = "abab cab, 12345 ab\n\n  ab!";
  auto expected = tok->encode(text);
  ASSERT_TRUE(expected.is_ok());
  // "abab": the merge joins each "ab" -> two tokens of id 256.
  EXPECT_EQ((*expected)[0], 256);
  EXPECT_EQ((*expected)[1], 256);
  std::vector<std::vector<TokenId>> results(4);
  std::vector<std::thread> threads;
  for (auto& result : results) {
    threads.emplace_back([&] {
      for (int i = 0; i < 200; ++i) result = tok->encode(text).value();
    });
  }
  for (auto& t : threads) t.join();
  for (const auto& result : results) EXPECT_EQ(result, *expected);
}

}  // namespace
}  // namespace kvp
