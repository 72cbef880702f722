// Tests of SessionStore: names, turns, prefix sharing of a system prompt, tier moves and the
// operations they return, make_room's LRU order, erase, and the error paths.
#include "cache/session_store.h"

#include <gtest/gtest.h>

#include <numeric>

namespace kvp {
namespace {

std::vector<int32_t> iota_tokens(int32_t count, int32_t first) {
  std::vector<int32_t> tokens(count);  // [count]
  std::iota(tokens.begin(), tokens.end(), first);
  return tokens;
}

struct Fixture {
  explicit Fixture(int32_t device_blocks = 16, int32_t host_blocks = 8, int32_t block_size = 4)
      : device(device_blocks),
        host(host_blocks),
        cache(&device, block_size, 99),
        store(&device, &cache, &host, SessionStoreConfig{block_size, "/tmp/kv"}) {}
  // A session with one finished turn of `tokens`.
  SessionId make_session(const std::string& name, const std::vector<int32_t>& tokens) {
    SessionId id = store.create(name).value();
    std::vector<CacheOp> ops;
    EXPECT_TRUE(store.begin(id, &ops));
    EXPECT_TRUE(store.append_tokens(id, tokens, &ops).has_value());
    store.end(id);
    return id;
  }
  BlockAllocator device;
  BlockAllocator host;
  PrefixCache cache;
  SessionStore store;
};

TEST(SessionStore, CreateRejectsEmptyAndTakenNames) {
  Fixture f;
  Result<SessionId> a = f.store.create("agent-a");
  ASSERT_TRUE(a.is_ok());
  Result<SessionId> again = f.store.create("agent-a");
  ASSERT_FALSE(again.is_ok());
  EXPECT_EQ(again.status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(again.status().message(), "session name 'agent-a' is already taken");
  EXPECT_EQ(f.store.create("").status().message(), "session name is empty");
  EXPECT_EQ(f.store.find("agent-a"), *a);
  EXPECT_FALSE(f.store.find("nobody").has_value());
}

TEST(SessionStore, TurnsKeepTokensAndTable) {
  Fixture f;
  SessionId id = f.make_session("a", iota_tokens(6, 0));
  std::vector<CacheOp> ops;
  ASSERT_TRUE(f.store.begin(id, &ops));
  std::optional<int32_t> cached = f.store.append_tokens(id, iota_tokens(3, 6), &ops);
  ASSERT_TRUE(cached.has_value());
  EXPECT_EQ(*cached, 0);
  f.store.end(id);
  EXPECT_EQ(f.store.tokens(id).size(), 9u);
  EXPECT_EQ(f.store.table(id).num_tokens(), 9);
  SessionInfo info = f.store.info(id);
  EXPECT_EQ(info.stats.num_turns, 2);
  EXPECT_EQ(info.num_device_blocks, 3);
  EXPECT_TRUE(ops.empty());
  f.store.check_integrity();
}

TEST(SessionStore, SessionsSharingASystemPromptShareItsBlocks) {
  Fixture f;
  std::vector<int32_t> system = iota_tokens(8, 1000);  // two full blocks
  std::vector<int32_t> prompt_a = system;
  prompt_a.push_back(1);
  SessionId a = f.make_session("a", prompt_a);
  std::vector<int32_t> prompt_b = system;
  prompt_b.push_back(2);
  prompt_b.push_back(3);
  SessionId b = f.store.create("b").value();
  std::vector<CacheOp> ops;
  ASSERT_TRUE(f.store.begin(b, &ops));
  std::optional<int32_t> cached = f.store.append_tokens(b, prompt_b, &ops);
  ASSERT_TRUE(cached.has_value());
  EXPECT_EQ(*cached, 8);
  EXPECT_EQ(f.store.table(b).block(0), f.store.table(a).block(0));
  EXPECT_EQ(f.store.table(b).block(1), f.store.table(a).block(1));
  EXPECT_NE(f.store.table(b).block(2), f.store.table(a).block(2));
  EXPECT_EQ(f.device.ref_count(f.store.table(a).block(0)), 2);
  EXPECT_EQ(f.store.info(b).stats.num_prefix_hit_tokens, 8);
  f.store.end(b);
  f.store.check_integrity();
}

TEST(SessionStore, PromptThatIsEntirelyCachedStillComputesItsLastToken) {
  Fixture f;
  std::vector<int32_t> tokens = iota_tokens(8, 0);
  f.make_session("a", tokens);
  SessionId b = f.store.create("b").value();
  std::vector<CacheOp> ops;
  ASSERT_TRUE(f.store.begin(b, &ops));
  std::optional<int32_t> cached = f.store.append_tokens(b, tokens, &ops);
  ASSERT_TRUE(cached.has_value());
  EXPECT_EQ(*cached, 4);  // only [0, 7) is matched: one full block
  f.store.end(b);
}

TEST(SessionStore, OffloadTransfersEveryBlockToHostAndResumeBringsThemBack) {
  Fixture f;
  SessionId id = f.make_session("a", iota_tokens(10, 0));
  std::vector<BlockId> device_blocks(f.store.table(id).blocks().begin(),
                                     f.store.table(id).blocks().end());
  f.cache.clear();  // no prefix sharing in this test: everything must travel
  std::vector<CacheOp> ops;
  ASSERT_TRUE(f.store.offload(id, &ops));
  ASSERT_EQ(ops.size(), 3u);
  for (int i = 0; i < 3; ++i) {
    const BlockTransfer& t = std::get<BlockTransfer>(ops[i]);
    EXPECT_EQ(t.src_pool, Pool::Device);
    EXPECT_EQ(t.src, device_blocks[i]);
    EXPECT_EQ(t.dst_pool, Pool::Host);
  }
  EXPECT_EQ(f.store.info(id).tier, Tier::Offloaded);
  EXPECT_EQ(f.store.info(id).num_host_blocks, 3);
  EXPECT_EQ(f.device.num_free(), 16);
  f.store.check_integrity();

  std::vector<BlockId> host_blocks;
  for (const CacheOp& op : ops) host_blocks.push_back(std::get<BlockTransfer>(op).dst);
  ops.clear();
  ASSERT_TRUE(f.store.resume(id, &ops));
  ASSERT_EQ(ops.size(), 3u);
  for (int i = 0; i < 3; ++i) {
    const BlockTransfer& t = std::get<BlockTransfer>(ops[i]);
    EXPECT_EQ(t.src_pool, Pool::Host);
    EXPECT_EQ(t.src, host_blocks[i]);
    EXPECT_EQ(t.dst, f.store.table(id).block(i));
  }
  EXPECT_EQ(f.host.num_free(), 8);
  EXPECT_EQ(f.store.info(id).stats.num_blocks_transferred, 6);
  f.store.check_integrity();
}

TEST(SessionStore, ResumeTakesBlocksStillInThePrefixCache) {
  Fixture f;
  SessionId id = f.make_session("a", iota_tokens(10, 0));  // blocks 0, 1 full and registered
  std::vector<CacheOp> ops;
  ASSERT_TRUE(f.store.offload(id, &ops));
  EXPECT_EQ(f.device.num_evictable(), 2);
  ops.clear();
  ASSERT_TRUE(f.store.resume(id, &ops));
  ASSERT_EQ(ops.size(), 1u);  // only the partial last block travels
  EXPECT_EQ(std::get<BlockTransfer>(ops[0]).dst, f.store.table(id).block(2));
  EXPECT_EQ(f.store.info(id).stats.num_prefix_hit_tokens, 8);
  f.store.check_integrity();
}

TEST(SessionStore, SaveToDiskFromHostAndLoadBack) {
  Fixture f;
  std::vector<int32_t> tokens = iota_tokens(7, 0);
  SessionId id = f.make_session("a", tokens);
  f.cache.clear();
  std::vector<CacheOp> ops;
  ASSERT_TRUE(f.store.offload(id, &ops));
  ops.clear();
  f.store.save_to_disk(id, &ops);
  ASSERT_EQ(ops.size(), 1u);
  const SaveToDisk& save = std::get<SaveToDisk>(ops[0]);
  EXPECT_EQ(save.session, id);
  EXPECT_EQ(save.path, "/tmp/kv/session-1.kvc");
  EXPECT_EQ(save.src_pool, Pool::Host);
  EXPECT_EQ(save.blocks.size(), 2u);
  EXPECT_EQ(save.token_ids, tokens);
  EXPECT_EQ(save.num_tokens, 7);
  EXPECT_EQ(f.host.num_free(), 8);
  EXPECT_EQ(f.store.info(id).tier, Tier::OnDisk);
  f.store.check_integrity();

  ops.clear();
  ASSERT_TRUE(f.store.resume(id, &ops));
  ASSERT_EQ(ops.size(), 1u);
  const LoadFromDisk& load = std::get<LoadFromDisk>(ops[0]);
  EXPECT_EQ(load.path, "/tmp/kv/session-1.kvc");
  EXPECT_EQ(load.dst_pool, Pool::Device);
  EXPECT_EQ(load.first_position, 0);
  EXPECT_EQ(load.num_tokens, 7);
  ASSERT_EQ(load.blocks.size(), 2u);
  EXPECT_EQ(load.blocks[1], f.store.table(id).block(1));
  f.store.check_integrity();
}

TEST(SessionStore, SaveToDiskStraightFromDevice) {
  Fixture f;
  SessionId id = f.make_session("a", iota_tokens(5, 0));
  std::vector<CacheOp> ops;
  f.store.save_to_disk(id, &ops);
  EXPECT_EQ(std::get<SaveToDisk>(ops[0]).src_pool, Pool::Device);
  EXPECT_EQ(f.store.info(id).num_device_blocks, 0);
}

TEST(SessionStore, MakeRoomMovesLeastRecentlyUsedIdleSessionsFirst) {
  Fixture f(/*device_blocks=*/6, /*host_blocks=*/2, /*block_size=*/4);
  f.cache.clear();
  SessionId a = f.make_session("a", iota_tokens(8, 0));    // 2 blocks
  SessionId b = f.make_session("b", iota_tokens(8, 100));  // 2 blocks
  SessionId c = f.make_session("c", iota_tokens(8, 200));  // 2 blocks
  f.cache.clear();  // keep every block private so make_room must move sessions
  std::vector<CacheOp> ops;
  ASSERT_TRUE(f.store.begin(b, &ops));  // b becomes most recently used and active
  ASSERT_TRUE(f.store.make_room(4, &ops));
  // a (LRU) goes to host and fills it; c is next: a moves on to disk to make host room for c.
  EXPECT_EQ(f.store.info(b).tier, Tier::Resident);
  EXPECT_EQ(f.store.info(a).tier, Tier::OnDisk);
  EXPECT_EQ(f.store.info(c).tier, Tier::Offloaded);
  EXPECT_TRUE(f.device.can_allocate(4));
  EXPECT_FALSE(f.store.make_room(5, &ops));  // only active b is left on device
  f.store.end(b);
  f.store.check_integrity();
}

TEST(SessionStore, BeginResumesAndMakesRoom) {
  Fixture f(/*device_blocks=*/4, /*host_blocks=*/8, /*block_size=*/4);
  SessionId a = f.make_session("a", iota_tokens(12, 0));  // 3 blocks
  f.cache.clear();
  std::vector<CacheOp> ops;
  ASSERT_TRUE(f.store.offload(a, &ops));
  SessionId b = f.make_session("b", iota_tokens(8, 50));  // 2 blocks
  f.cache.clear();
  ops.clear();
  ASSERT_TRUE(f.store.begin(a, &ops));  // needs 3 of 4: b must move to host first
  EXPECT_EQ(f.store.info(b).tier, Tier::Offloaded);
  EXPECT_EQ(f.store.info(a).tier, Tier::Resident);
  EXPECT_TRUE(f.store.info(a).active);
  // Order: b's blocks leave the device before a's blocks arrive.
  ASSERT_EQ(ops.size(), 5u);
  EXPECT_EQ(std::get<BlockTransfer>(ops[0]).src_pool, Pool::Device);
  EXPECT_EQ(std::get<BlockTransfer>(ops[4]).src_pool, Pool::Host);
  f.store.end(a);
  f.store.check_integrity();
}

TEST(SessionStore, MakeRoomSavesStraightToDiskWhenHostCannotTakeTheSession) {
  Fixture f(/*device_blocks=*/4, /*host_blocks=*/4, /*block_size=*/4);
  SessionId a = f.make_session("a", iota_tokens(12, 0));  // 3 blocks
  f.cache.clear();
  std::vector<CacheOp> ops;
  ASSERT_TRUE(f.store.offload(a, &ops));                  // host: 3 of 4 used
  SessionId b = f.make_session("b", iota_tokens(8, 50));  // 2 blocks
  f.cache.clear();
  ops.clear();
  ASSERT_TRUE(f.store.begin(a, &ops));  // b does not fit the host, and a must stay: b to disk
  EXPECT_EQ(f.store.info(b).tier, Tier::OnDisk);
  ASSERT_EQ(ops.size(), 4u);
  EXPECT_EQ(std::get<SaveToDisk>(ops[0]).src_pool, Pool::Device);
  f.store.end(a);
  f.store.check_integrity();
}

TEST(SessionStore, AppendThatCannotFitChangesNothing) {
  Fixture f(/*device_blocks=*/2, /*host_blocks=*/2, /*block_size=*/4);
  SessionId a = f.store.create("a").value();
  std::vector<CacheOp> ops;
  ASSERT_TRUE(f.store.begin(a, &ops));
  EXPECT_FALSE(f.store.append_tokens(a, iota_tokens(9, 0), &ops).has_value());
  EXPECT_EQ(f.store.tokens(a).size(), 0u);
  EXPECT_EQ(f.device.num_free(), 2);
  f.store.end(a);
  f.store.check_integrity();
}

TEST(SessionStore, EraseReleasesBlocksAndRemovesTheFile) {
  Fixture f;
  SessionId a = f.make_session("a", iota_tokens(6, 0));
  SessionId b = f.make_session("b", iota_tokens(6, 10));
  std::vector<CacheOp> ops;
  f.store.save_to_disk(b, &ops);
  ops.clear();
  f.store.erase(a, &ops);
  EXPECT_TRUE(ops.empty());
  f.store.erase(b, &ops);
  ASSERT_EQ(ops.size(), 1u);
  EXPECT_EQ(std::get<RemoveFile>(ops[0]).path, "/tmp/kv/session-2.kvc");
  EXPECT_FALSE(f.store.find("a").has_value());
  EXPECT_EQ(f.store.num_sessions(), 0);
  EXPECT_EQ(f.device.num_available(), 16);
  f.store.check_integrity();
}

using SessionStoreDeathTest = ::testing::Test;

TEST_F(SessionStoreDeathTest, WrongStateCallsAbort) {
  Fixture f;
  SessionId a = f.store.create("a").value();
  std::vector<CacheOp> ops;
  std::vector<int32_t> tokens = iota_tokens(3, 0);
  EXPECT_DEATH((void)f.store.append_tokens(a, tokens, &ops), "not active");
  EXPECT_DEATH(f.store.end(a), "not active");
  ASSERT_TRUE(f.store.begin(a, &ops));
  EXPECT_DEATH((void)f.store.offload(a, &ops), "active");
  EXPECT_DEATH(f.store.erase(a, &ops), "erase of active session");
  EXPECT_DEATH((void)f.store.begin(a, &ops), "already active");
  f.store.end(a);
  f.store.save_to_disk(a, &ops);
  EXPECT_DEATH(f.store.save_to_disk(a, &ops), "on disk");
  EXPECT_DEATH((void)f.store.table(a), "on disk");
  EXPECT_DEATH((void)f.store.info(SessionId{42}), "unknown session 42");
}

// Gemma-3-like: a global group (block 4) and a sliding-window group (block 2, window 5).
struct TwoGroupFixture {
  TwoGroupFixture()
      : global_device(32),
        global_host(32),
        window_device(16),
        window_host(16),
        global_cache(&global_device, 4, 9),
        window_cache(&window_device, 2, 9),
        store({SessionGroup{&global_device, &global_cache, &global_host, 4, 0},
               SessionGroup{&window_device, &window_cache, &window_host, 2, 5}},
              "/d") {}
  BlockAllocator global_device;
  BlockAllocator global_host;
  BlockAllocator window_device;
  BlockAllocator window_host;
  PrefixCache global_cache;
  PrefixCache window_cache;
  SessionStore store;
};

TEST(SessionStore, TwoGroupsMoveTogetherAndWindowGroupMovesOnlyItsWindow) {
  TwoGroupFixture f;
  SessionId id = f.store.create("a").value();
  std::vector<CacheOp> ops;
  ASSERT_TRUE(f.store.begin(id, &ops));
  for (int32_t i = 0; i < 13; ++i) {  // decode-like: window trims as it goes
    ASSERT_TRUE(f.store.append_tokens(id, iota_tokens(1, i), &ops).has_value());
  }
  f.store.end(id);
  EXPECT_TRUE(ops.empty());
  // 13 tokens: global 4 blocks; window: last append at old length 12 kept positions >= 8,
  // so entries 0..3 dropped, 4..6 held.
  EXPECT_EQ(f.store.table(id, 0).num_held_blocks(), 4);
  EXPECT_EQ(f.store.table(id, 1).num_dropped_blocks(), 4);
  EXPECT_EQ(f.store.table(id, 1).num_held_blocks(), 3);
  std::vector<BlockId> window_blocks(f.store.table(id, 1).blocks().begin() + 4,
                                     f.store.table(id, 1).blocks().end());
  f.global_cache.clear();
  f.window_cache.clear();

  ASSERT_TRUE(f.store.offload(id, &ops));
  ASSERT_EQ(ops.size(), 7u);  // 4 global + 3 window transfers
  for (int i = 0; i < 4; ++i) EXPECT_EQ(std::get<BlockTransfer>(ops[i]).group, 0);
  for (int i = 0; i < 3; ++i) {
    const BlockTransfer& t = std::get<BlockTransfer>(ops[4 + i]);
    EXPECT_EQ(t.group, 1);
    EXPECT_EQ(t.src, window_blocks[i]);
  }
  EXPECT_EQ(f.window_device.num_free(), 16);
  f.store.check_integrity();

  ops.clear();
  f.store.save_to_disk(id, &ops);
  ASSERT_EQ(ops.size(), 2u);
  const SaveToDisk& global_save = std::get<SaveToDisk>(ops[0]);
  const SaveToDisk& window_save = std::get<SaveToDisk>(ops[1]);
  EXPECT_EQ(global_save.group, 0);
  EXPECT_EQ(global_save.first_position, 0);
  EXPECT_EQ(global_save.blocks.size(), 4u);
  EXPECT_EQ(window_save.group, 1);
  EXPECT_EQ(window_save.first_position, 8);
  EXPECT_EQ(window_save.blocks.size(), 3u);
  EXPECT_EQ(window_save.path, global_save.path);
  EXPECT_EQ(f.window_host.num_free(), 16);
  f.store.check_integrity();

  ops.clear();
  ASSERT_TRUE(f.store.resume(id, &ops));
  ASSERT_EQ(ops.size(), 2u);
  const LoadFromDisk& window_load = std::get<LoadFromDisk>(ops[1]);
  EXPECT_EQ(window_load.group, 1);
  EXPECT_EQ(window_load.first_position, 8);
  EXPECT_EQ(window_load.blocks.size(), 3u);
  EXPECT_EQ(f.store.table(id, 1).num_dropped_blocks(), 4);
  EXPECT_EQ(f.store.table(id, 1).slot(12) % 2, 0);
  f.store.check_integrity();
}

TEST(SessionStore, TwoGroupsShareASystemPromptThroughBothPrefixCaches) {
  TwoGroupFixture f;
  std::vector<int32_t> prompt = iota_tokens(13, 0);
  SessionId a = f.store.create("a").value();
  std::vector<CacheOp> ops;
  ASSERT_TRUE(f.store.begin(a, &ops));
  ASSERT_TRUE(f.store.append_tokens(a, prompt, &ops).has_value());  // one chunk: no trim yet
  f.store.end(a);
  SessionId b = f.store.create("b").value();
  ASSERT_TRUE(f.store.begin(b, &ops));
  std::optional<int32_t> cached = f.store.append_tokens(b, prompt, &ops);
  ASSERT_TRUE(cached.has_value());
  // Matchable [0, 12): global hits 3 blocks (12); window group needs positions [8, 12): held.
  EXPECT_EQ(*cached, 12);
  EXPECT_EQ(f.store.table(b, 0).block(2), f.store.table(a, 0).block(2));
  EXPECT_EQ(f.store.table(b, 1).num_dropped_blocks(), 4);
  EXPECT_EQ(f.store.table(b, 1).block(5), f.store.table(a, 1).block(5));
  f.store.end(b);
  f.store.check_integrity();
}

TEST(SessionStore, WindowBlocksDroppedDuringDecodeStayMatchable) {
  TwoGroupFixture f;
  std::vector<int32_t> prompt = iota_tokens(13, 0);
  SessionId a = f.store.create("a").value();
  std::vector<CacheOp> ops;
  ASSERT_TRUE(f.store.begin(a, &ops));
  ASSERT_TRUE(f.store.append_tokens(a, prompt, &ops).has_value());
  for (int32_t i = 0; i < 10; ++i) {  // decode: the window group drops blocks 0..8
    ASSERT_TRUE(f.store.append_tokens(a, iota_tokens(1, 100 + i), &ops).has_value());
  }
  f.store.end(a);
  EXPECT_EQ(f.store.table(a, 1).num_dropped_blocks(), 9);
  std::vector<int32_t> prompt_b = prompt;
  prompt_b.push_back(500);
  SessionId b = f.store.create("b").value();
  ASSERT_TRUE(f.store.begin(b, &ops));
  std::optional<int32_t> cached = f.store.append_tokens(b, prompt_b, &ops);
  ASSERT_TRUE(cached.has_value());
  // Global: 3 blocks (12 tokens) cached at a's end. Window: position 12 attends to (7, 12], so
  // window blocks 4 and 5 (positions 8..11) are needed; a registered them before dropping them.
  EXPECT_EQ(*cached, 12);
  EXPECT_EQ(f.store.table(b, 1).num_dropped_blocks(), 4);
  f.store.end(b);
  f.store.check_integrity();
}

TEST_F(SessionStoreDeathTest, MakeRoomWithOneCountNeedsOneGroup) {
  TwoGroupFixture f;
  std::vector<CacheOp> ops;
  EXPECT_DEATH((void)f.store.make_room(1, &ops), "2 groups");
}

}  // namespace
}  // namespace kvp
