// UTF-8 helpers. Expected replacements follow the Unicode Standard's "U+FFFD substitution of
// maximal subparts" (chapter 3, table 3-8 example) and agree with CPython's
// bytes.decode("utf-8", "replace"), which implements the same practice.
#include "tokenizer/utf8.h"

#include <gtest/gtest.h>

namespace kvp {
namespace {

std::string fffd(int count) {
  std::string out;
  for (int i = 0; i < count; ++i) out += utf8::kReplacementChar;
  return out;
}

TEST(Utf8, LossyReplacesMaximalSubpartsAsTheUnicodeStandardExample) {
  const std::string input = "\x61\xF1\x80\x80\xE1\x80\xC2\x62\x80\x63\x80\xBF\x64";
  std::string expected = "a";  // built with += (operator+ trips a GCC 12 -Wrestrict bug)
  expected += fffd(3);
  expected += "b";
  expected += fffd(1);
  expected += "c";
  expected += fffd(2);
  expected += "d";
  EXPECT_EQ(utf8::lossy(input), expected);
}

TEST(Utf8, SurrogatesOverlongsAndTooLargeAreInvalid) {
  EXPECT_EQ(utf8::lossy("\xED\xA0\x80"), fffd(3));      // U+D800
  EXPECT_EQ(utf8::lossy("\xC0\xAF"), fffd(2));          // overlong '/'
  EXPECT_EQ(utf8::lossy("\xE0\x80\xAF"), fffd(3));      // overlong '/'
  EXPECT_EQ(utf8::lossy("\xF4\x90\x80\x80"), fffd(4));  // U+110000
  EXPECT_EQ(utf8::lossy("\xF0\x9F\x98"), fffd(1));      // truncated emoji
  EXPECT_FALSE(utf8::is_valid("\xED\xA0\x80"));
  EXPECT_EQ(utf8::first_invalid("ok\xC0\xAF"), 2u);
}

TEST(Utf8, ValidTextIsUnchanged) {
  const std::string text = "a\xC3\xA9\xE4\xB8\xAD\xF0\x9F\x98\x80\xEF\xBF\xBD";  // aé中😀U+FFFD
  EXPECT_TRUE(utf8::is_valid(text));
  EXPECT_EQ(utf8::lossy(text), text);
  EXPECT_EQ(utf8::decode_at(text, 3), U'\u4E2D');
  EXPECT_EQ(utf8::decode_at(text, 6), U'\U0001F600');
  std::string encoded;
  utf8::append(encoded, U'\U0001F600');
  EXPECT_EQ(encoded, "\xF0\x9F\x98\x80");
}

TEST(Utf8, IncompleteTailCountsOnlyPrefixesThatCanStillComplete) {
  EXPECT_EQ(utf8::incomplete_tail_length("ab"), 0u);
  EXPECT_EQ(utf8::incomplete_tail_length("a\xF0\x9F\x98"), 3u);
  EXPECT_EQ(utf8::incomplete_tail_length("a\xE4\xB8"), 2u);
  EXPECT_EQ(utf8::incomplete_tail_length("a\xE4"), 1u);
  EXPECT_EQ(utf8::incomplete_tail_length("a\xE4\xB8\xAD"), 0u);  // complete
  EXPECT_EQ(utf8::incomplete_tail_length("a\xED\xA0"), 0u);      // a surrogate never completes
  EXPECT_EQ(utf8::incomplete_tail_length("a\xFF"), 0u);
}

}  // namespace
}  // namespace kvp
