// HostTier (engine/host_tier.h): slabs sized so each group can hold the whole budget, blocks
// handed out in ascending runs and taken back, all-or-nothing allocation, refusals; pageable
// blocks' pages resident (populated) once handed out, as the kernel's mincore reports.
#include "engine/host_tier.h"

#include <gtest/gtest.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cstdint>
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

// Whether every page of [begin, begin + bytes) is resident, as mincore(2) reports.
bool resident(const std::byte* begin, size_t bytes) {
  const size_t page = static_cast<size_t>(::sysconf(_SC_PAGESIZE));
  const uintptr_t first = reinterpret_cast<uintptr_t>(begin) / page * page;
  const uintptr_t last = (reinterpret_cast<uintptr_t>(begin) + bytes + page - 1) / page * page;
  std::vector<unsigned char> pages((last - first) / page);
  if (::mincore(reinterpret_cast<void*>(first), last - first, pages.data()) != 0) return false;
  for (unsigned char p : pages) {
    if ((p & 1) == 0) return false;
  }
  return true;
}

TEST(HostTier, PageableBlocksArePopulatedWhenFirstHandedOut) {
  // 2 layers x K,V x 2 heads x 16 tokens x 64 dims x 4 bytes = 32 KiB a block; a 64 MiB slab
  const CacheSpec spec = CacheSpec::create("test", 2, 2, 64, DType::F32, 16,
                                           {LayerAttention::global(), LayerAttention::global()})
                             .value();
  ASSERT_EQ(spec.block_bytes(0), 32768u);
  auto tier = HostTier::create(spec, 64 << 20, nullptr);
  ASSERT_TRUE(tier.is_ok()) << tier.status().to_string();
  HostTier& t = **tier;
  const KvLayout& layout = t.storage().layout(0);
  const std::byte* slab = t.storage().slab(0).data();
  const size_t elem = dtype_size_bytes(layout.dtype);
  const auto blocks_resident = [&](int32_t first, int32_t n) {
    bool all = true;
    for (int32_t layer = 0; layer < layout.num_layers; ++layer) {
      all &= resident(slab + layout.block_offset(layer, first, 0) * elem,
                      n * layout.block_pitch() * elem);
    }
    return all;
  };
  // whatever the allocator handed out (fresh pages, or reused ones under a sanitizer), its pages
  // are dropped first: not resident until something maps them again
  const size_t page = static_cast<size_t>(::sysconf(_SC_PAGESIZE));
  const uintptr_t from = (reinterpret_cast<uintptr_t>(slab) + page - 1) / page * page;
  const uintptr_t to = (reinterpret_cast<uintptr_t>(slab) + layout.size_bytes()) / page * page;
  ASSERT_EQ(::madvise(reinterpret_cast<void*>(from), to - from, MADV_DONTNEED), 0);
  ASSERT_FALSE(blocks_resident(1, 99));
  auto a = t.allocate(std::vector<int32_t>{100});
  ASSERT_TRUE(a.has_value());
  EXPECT_EQ((*a)[0].front(), BlockId{0});
  EXPECT_TRUE(blocks_resident(0, 100));  // each layer's run of the 100 blocks
  t.release(*a);
}

}  // namespace
}  // namespace kvp
