// IncrementalDetokenizer: characters split across tokens are held back until complete, invalid
// bytes become U+FFFD, and leading-space stripping happens once at the start of the stream.
// Expected texts are written out by hand from the UTF-8 encodings.
#include "tokenizer/detokenizer.h"

#include <gtest/gtest.h>

#include "tokenizer/pre_tokenizer.h"
#include "tokenizer/utf8.h"

namespace kvp {
namespace {

// A byte-level vocabulary of the 256 single bytes: token i is byte i.
Tokenizer byte_level_tokenizer() {
  TokenizerVocab vocab;
  vocab.model = TokenizerModel::kByteLevelBpe;
  for (int b = 0; b < 256; ++b) {
    vocab.tokens.push_back(ByteLevelAlphabet::get().encode(static_cast<uint8_t>(b)));
  }
  vocab.tokens.push_back("<|end|>");
  TokenizerPipeline pipeline;
  PreTokenizerStep byte_level;
  byte_level.kind = PreTokenizerStep::Kind::kByteLevel;
  pipeline.pre_tokenizer.push_back(byte_level);
  DecoderStep decoder;
  decoder.kind = DecoderStep::Kind::kByteLevel;
  pipeline.decoder.push_back(decoder);
  pipeline.added_tokens.push_back({.id = 256, .content = "<|end|>", .special = true});
  auto tok = Tokenizer::create(std::move(vocab), std::move(pipeline));
  KVP_CHECK(tok.is_ok(), "{}", tok.status().to_string());
  return std::move(tok).value();
}

std::vector<std::string> stream(IncrementalDetokenizer& detok, const std::vector<TokenId>& ids) {
  std::vector<std::string> pieces;
  for (TokenId id : ids) {
    auto piece = detok.push(id);
    KVP_CHECK(piece.is_ok(), "{}", piece.status().to_string());
    pieces.push_back(*piece);
  }
  return pieces;
}

TEST(IncrementalDetokenizer, HoldsBackMultiByteCharacterUntilComplete) {
  const Tokenizer tok = byte_level_tokenizer();
  IncrementalDetokenizer detok(tok);
  // "a中b": 61, E4 B8 AD, 62
  auto pieces = stream(detok, {0x61, 0xE4, 0xB8, 0xAD, 0x62});
  EXPECT_EQ(pieces, (std::vector<std::string>{"a", "", "", "\xE4\xB8\xAD", "b"}));
  EXPECT_EQ(detok.num_pending_bytes(), 0u);
  EXPECT_EQ(detok.finish(), "");
}

TEST(IncrementalDetokenizer, FourByteEmojiWithSkinToneAcrossTokens) {
  const Tokenizer tok = byte_level_tokenizer();
  IncrementalDetokenizer detok(tok);
  // 👍🏽 = F0 9F 91 8D, F0 9F 8F BD
  auto pieces = stream(detok, {0xF0, 0x9F, 0x91, 0x8D, 0xF0, 0x9F, 0x8F});
  EXPECT_EQ(pieces, (std::vector<std::string>{"", "", "", "\xF0\x9F\x91\x8D", "", "", ""}));
  EXPECT_EQ(detok.num_pending_bytes(), 3u);
  auto last = detok.push(0xBD);
  ASSERT_TRUE(last.is_ok());
  EXPECT_EQ(*last, "\xF0\x9F\x8F\xBD");
}

TEST(IncrementalDetokenizer, InvalidBytesBecomeReplacementCharacters) {
  const Tokenizer tok = byte_level_tokenizer();
  IncrementalDetokenizer detok(tok);
  // E4 B8 then 'x': the sequence can no longer complete -> one U+FFFD (maximal subpart), then x.
  auto pieces = stream(detok, {0xE4, 0xB8, 0x78, 0xFF});
  EXPECT_EQ(pieces, (std::vector<std::string>{"", "", "\xEF\xBF\xBDx", "\xEF\xBF\xBD"}));
  // A dangling lead byte at the end of the stream is flushed as U+FFFD.
  ASSERT_TRUE(detok.push(0xE4).is_ok());
  EXPECT_EQ(detok.finish(), "\xEF\xBF\xBD");
}

TEST(IncrementalDetokenizer, EveryPieceIsValidUtf8AndPiecesAddUpToDecode) {
  const Tokenizer tok = byte_level_tokenizer();
  const std::string text = "Grüße, 世界! 👨‍👩‍👧 ok";
  auto ids = tok.encode(text);
  ASSERT_TRUE(ids.is_ok());
  EXPECT_EQ(ids->size(), text.size());  // one token per byte
  IncrementalDetokenizer detok(tok);
  std::string joined;
  for (const std::string& piece : stream(detok, *ids)) {
    EXPECT_TRUE(utf8::is_valid(piece));
    joined += piece;
  }
  joined += detok.finish();
  EXPECT_EQ(joined, text);
}

TEST(IncrementalDetokenizer, SkipsSpecialTokensWhenAsked) {
  const Tokenizer tok = byte_level_tokenizer();
  IncrementalDetokenizer keep(tok);
  IncrementalDetokenizer skip(tok, /*skip_special=*/true);
  EXPECT_EQ(stream(keep, {0x68, 256}), (std::vector<std::string>{"h", "<|end|>"}));
  EXPECT_EQ(stream(skip, {0x68, 256}), (std::vector<std::string>{"h", ""}));
}

TEST(IncrementalDetokenizer, RejectsIdOutsideVocab) {
  const Tokenizer tok = byte_level_tokenizer();
  IncrementalDetokenizer detok(tok);
  auto bad = detok.push(257);
  ASSERT_FALSE(bad.is_ok());
  EXPECT_EQ(bad.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(bad.status().message().find("257"), std::string::npos);
  EXPECT_FALSE(detok.push(-1).is_ok());
}

// SentencePiece style: "▁" for spaces, <0xXX> byte fallback, strip of the first leading space.
TEST(IncrementalDetokenizer, SentencePieceByteFallbackAndLeadingStrip) {
  TokenizerVocab vocab;
  vocab.model = TokenizerModel::kSentencePieceBpe;
  vocab.tokens = {"<unk>", "\xE2\x96\x81hi", "\xE2\x96\x81", "<0xE4>", "<0xB8>", "<0xAD>", "x", "h",
                  "i",     "\xE2\x96\x81h"};
  vocab.scores = {0, -1, -2, 0, 0, 0, -3, -4, -5, -6};
  vocab.token_types = {TokenType::kUnknown, TokenType::kNormal, TokenType::kNormal,
                       TokenType::kByte,    TokenType::kByte,   TokenType::kByte,
                       TokenType::kNormal,  TokenType::kNormal, TokenType::kNormal,
                       TokenType::kNormal};
  vocab.unk_id = 0;
  vocab.add_space_prefix = true;
  auto pipeline = pipeline_for_gguf(vocab);
  ASSERT_TRUE(pipeline.is_ok());
  auto tok = Tokenizer::create(vocab, *pipeline);
  ASSERT_TRUE(tok.is_ok()) << tok.status().to_string();
  // " hi 中x" -> ▁hi ▁ <0xE4> <0xB8> <0xAD> x; the prefix space of "▁hi" is stripped.
  auto ids = tok->encode("hi \xE4\xB8\xADx");
  ASSERT_TRUE(ids.is_ok());
  EXPECT_EQ(*ids, (std::vector<TokenId>{1, 2, 3, 4, 5, 6}));
  IncrementalDetokenizer detok(*tok);
  EXPECT_EQ(stream(detok, *ids),
            (std::vector<std::string>{"hi", " ", "", "", "\xE4\xB8\xAD", "x"}));
  auto decoded = tok->decode(*ids);
  ASSERT_TRUE(decoded.is_ok());
  EXPECT_EQ(*decoded, "hi \xE4\xB8\xADx");
}

}  // namespace
}  // namespace kvp
