// Pre-tokenizer steps on their own. Every expected list of pieces was produced with HF
// tokenizers 0.23.2's pre_tokenize_str on the same step and text.
#include "tokenizer/pre_tokenizer.h"

#include <gtest/gtest.h>

namespace kvp {
namespace {

std::vector<std::string> split(const std::vector<PreTokenizerStep>& steps,
                               const std::string& text) {
  TokenizerPipeline pipeline;
  pipeline.pre_tokenizer = steps;
  auto pre = PreTokenizer::create(pipeline);
  KVP_CHECK(pre.is_ok(), "{}", pre.status().to_string());
  std::vector<TextPiece> pieces;
  KVP_CHECK(pre->split(text, 0, &pieces).is_ok());
  std::vector<std::string> out;
  for (const TextPiece& piece : pieces) out.push_back(piece.text);
  return out;
}

PreTokenizerStep split_step(const std::string& pattern, bool is_regex, SplitBehavior behavior) {
  PreTokenizerStep step;
  step.kind = PreTokenizerStep::Kind::kSplit;
  step.pattern = pattern;
  step.pattern_is_regex = is_regex;
  step.behavior = behavior;
  return step;
}

using Pieces = std::vector<std::string>;

TEST(PreTokenizer, SplitBehaviorsMatchHf) {
  const std::string text = "a  b,,c d";
  struct Expect {
    SplitBehavior behavior;
    Pieces literal_space;  // Split(" ")
    Pieces regex;          // Split(Regex(",+| "))
  };
  const std::vector<Expect> expects = {
      {SplitBehavior::kIsolated,
       {"a", " ", " ", "b,,c", " ", "d"},
       {"a", " ", " ", "b", ",,", "c", " ", "d"}},
      {SplitBehavior::kRemoved, {"a", "b,,c", "d"}, {"a", "b", "c", "d"}},
      {SplitBehavior::kMergedWithPrevious,
       {"a ", " ", "b,,c ", "d"},
       {"a ", " ", "b,,", "c ", "d"}},
      {SplitBehavior::kMergedWithNext, {"a", " ", " b,,c", " d"}, {"a", " ", " b", ",,c", " d"}},
      {SplitBehavior::kContiguous,
       {"a", "  ", "b,,c", " ", "d"},
       {"a", "  ", "b", ",,", "c", " ", "d"}},
  };
  for (const Expect& e : expects) {
    SCOPED_TRACE(static_cast<int>(e.behavior));
    EXPECT_EQ(split({split_step(" ", /*is_regex=*/false, e.behavior)}, text), e.literal_space);
    EXPECT_EQ(split({split_step(",+| ", /*is_regex=*/true, e.behavior)}, text), e.regex);
  }
}

TEST(PreTokenizer, DigitsContiguousMatchesHf) {
  PreTokenizerStep digits;
  digits.kind = PreTokenizerStep::Kind::kDigits;
  digits.individual_digits = false;
  EXPECT_EQ(split({digits}, "ab123c4 56"), (Pieces{"ab", "123", "c", "4", " ", "56"}));
}

TEST(PreTokenizer, MetaspaceAlwaysWithSplitMatchesHf) {
  PreTokenizerStep metaspace;
  metaspace.kind = PreTokenizerStep::Kind::kMetaspace;
  metaspace.prepend = PreTokenizerStep::Prepend::kAlways;
  metaspace.split = true;
  EXPECT_EQ(split({metaspace}, "hello  world x"),
            (Pieces{"\xE2\x96\x81hello", "\xE2\x96\x81", "\xE2\x96\x81world", "\xE2\x96\x81x"}));
}

TEST(PreTokenizer, ByteLevelAddPrefixSpaceMatchesHf) {
  PreTokenizerStep byte_level;
  byte_level.kind = PreTokenizerStep::Kind::kByteLevel;
  byte_level.add_prefix_space = true;
  byte_level.use_regex = true;
  // "Ġ" (U+0120) spells the space byte.
  EXPECT_EQ(split({byte_level}, "hi there"), (Pieces{"\xC4\xA0hi", "\xC4\xA0there"}));
}

}  // namespace
}  // namespace kvp
