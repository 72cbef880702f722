// HostTier (engine/host_tier.h): slabs sized so each group can hold the whole budget, blocks
// handed out in ascending runs and taken back, all-or-nothing allocation, refusals.
#include "engine/host_tier.h"

#include <gtest/gtest.h>

#include <set>

namespace kvp {
namespace {

CacheSpec two_group_spec() {
  // 4 layers: 0 and 2 global, 1 and 3 a window of 8 tokens; 2 KV heads of 4 dims, f32, block 4
  std::vector<LayerAttention> attention = {LayerAttention::global(), LayerAttention::sliding(8),
                                           LayerAttention::global(), LayerAttention::sliding(8)};
  return CacheSpec::create("test", 4, 2, 4, DType::F32, 4, std::move(attention)).value();
}

TEST(HostTier, EachGroupHoldsTheBudgetAndBlocksComeInAscendingRuns) {
  const CacheSpec spec = two_group_spec();
  // a block of one group: 2 layers x K,V x 2 heads x 4 tokens x 4 dims x 4 bytes = 512 bytes
  ASSERT_EQ(spec.block_bytes(0), 512u);
  auto tier = HostTier::create(spec, 10 * 512 + 100, nullptr);
  ASSERT_TRUE(tier.is_ok()) << tier.status().to_string();
  HostTier& t = **tier;
  for (int32_t g = 0; g < 2; ++g) {
    EXPECT_EQ(t.storage().layout(g).num_blocks, 10);
    EXPECT_EQ(t.num_free(g), 10);
  }
  auto a = t.allocate(std::vector<int32_t>{3, 2});
  ASSERT_TRUE(a.has_value());
  EXPECT_EQ((*a)[0], (std::vector<BlockId>{BlockId{0}, BlockId{1}, BlockId{2}}));
  EXPECT_EQ((*a)[1], (std::vector<BlockId>{BlockId{0}, BlockId{1}}));
  auto b = t.allocate(std::vector<int32_t>{7, 0});
  ASSERT_TRUE(b.has_value());
  EXPECT_EQ(t.num_free(0), 0);
  // all or nothing: group 0 is empty, so group 1 gives nothing either
  EXPECT_FALSE(t.allocate(std::vector<int32_t>{1, 1}).has_value());
  EXPECT_EQ(t.num_free(1), 8);
  t.release(*a);
  // what went back comes out again, in ascending order (a run stays a run)
  auto c = t.allocate(std::vector<int32_t>{3, 0});
  ASSERT_TRUE(c.has_value());
  EXPECT_EQ((*c)[0], (std::vector<BlockId>{BlockId{0}, BlockId{1}, BlockId{2}}));
  std::set<int32_t> seen;
  for (BlockId id : (*b)[0]) seen.insert(id.value);
  for (BlockId id : (*c)[0]) seen.insert(id.value);
  EXPECT_EQ(seen.size(), 10u);  // no block handed out twice
  t.release(*b);
  t.release(*c);
  EXPECT_EQ(t.num_free(0), 10);
  EXPECT_EQ(t.num_free(1), 10);
}

TEST(HostTier, AZeroBudgetIsRefused) {
  auto tier = HostTier::create(two_group_spec(), 0, nullptr);
  EXPECT_FALSE(tier.is_ok());
  EXPECT_EQ(tier.status().code(), StatusCode::kInvalidArgument);
}

TEST(HostTier, SlabsComeFromTheGivenAllocator) {
  static int allocations = 0, releases = 0;
  HostKvStorage::SlabAllocator counting;
  counting.allocate = [](size_t bytes, void*) -> void* {
    ++allocations;
    return std::aligned_alloc(HostKvStorage::kAlignment, (bytes + HostKvStorage::kAlignment - 1) /
                                                             HostKvStorage::kAlignment *
                                                             HostKvStorage::kAlignment);
  };
  counting.release = [](void* p, void*) {
    ++releases;
    std::free(p);
  };
  {
    auto tier = HostTier::create(two_group_spec(), 4096, &counting);
    ASSERT_TRUE(tier.is_ok());
    EXPECT_EQ(allocations, 2);
    EXPECT_EQ(releases, 0);
  }
  EXPECT_EQ(releases, 2);
  HostKvStorage::SlabAllocator failing;
  failing.allocate = [](size_t, void*) -> void* { return nullptr; };
  failing.release = [](void*, void*) {};
  auto refused = HostTier::create(two_group_spec(), 4096, &failing);
  ASSERT_FALSE(refused.is_ok());
  EXPECT_EQ(refused.status().code(), StatusCode::kResourceExhausted);
  EXPECT_NE(refused.status().message().find("4096"), std::string::npos);
}

}  // namespace
}  // namespace kvp
