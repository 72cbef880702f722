#include "common/status.h"

#include <gtest/gtest.h>

namespace kvp {
namespace {

Result<int> parse_positive(int x) {
  if (x <= 0) return Status::invalid_argument("value {} is not positive", x);
  return x;
}

Status twice(int x, int* out) {
  KVP_ASSIGN_OR_RETURN(int v, parse_positive(x));
  *out = 2 * v;
  return Status::ok();
}

TEST(Status, CarriesCodeAndMessage) {
  Status s = Status::corruption("file '{}': checksum", "a.kvc");
  EXPECT_FALSE(s.is_ok());
  EXPECT_EQ(s.code(), StatusCode::kCorruption);
  EXPECT_EQ(s.to_string(), "corruption: file 'a.kvc': checksum");
  EXPECT_TRUE(Status::ok().is_ok());
}

TEST(Status, ResultPropagatesThroughMacros) {
  int out = 0;
  EXPECT_TRUE(twice(4, &out).is_ok());
  EXPECT_EQ(out, 8);
  Status s = twice(-1, &out);
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(s.message(), "value -1 is not positive");
}

TEST(StatusDeathTest, ValueOfFailedResultAborts) {
  Result<int> r = parse_positive(0);
  EXPECT_DEATH((void)r.value(), "value\\(\\) of a failed Result");
}

}  // namespace
}  // namespace kvp
