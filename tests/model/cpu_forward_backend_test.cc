// CpuForwardBackend (model/cpu_forward_backend.h): block images in the layout forward_backend.h
// documents (checked against slabs laid out by ModelRunner::forward itself, not by the backend),
// write/read round trips, copy-on-write copies, refusals that change nothing, and a forward pass
// equal to ModelRunner::forward on the same batch.
#include "model/cpu_forward_backend.h"

#include <gtest/gtest.h>

#include <cstring>
#include <random>

#include "cache/cache_spec.h"
#include "cache/host_kv_storage.h"
#include "model/model_loader.h"

namespace kvp {
namespace {

std::shared_ptr<ModelRunner> load_tiny(const std::string& name) {
  auto runner = load_model("tests/model/fixtures/tiny/" + name, nullptr);
  KVP_CHECK(runner.is_ok(), "{}", runner.status().to_string());
  return std::move(runner).value();
}

std::vector<KvLayout> layouts_of(const ForwardBackend& backend, int32_t num_blocks,
                                 int32_t block_size, DType dtype) {
  std::vector<KvLayout> layouts;
  for (int32_t g = 0; g < backend.num_cache_groups(); ++g) {
    layouts.push_back(backend.group_layout(g, num_blocks, block_size, dtype));
  }
  return layouts;
}

std::vector<std::byte> random_bytes(size_t size, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::vector<std::byte> out(size);
  for (std::byte& b : out) b = static_cast<std::byte>(rng() & 0xff);
  return out;
}

// The whole pool of one group as an image of every block, in order.
std::vector<std::byte> read_all(const ForwardBackend& backend, int32_t group) {
  const KvLayout& layout = backend.kv_layout(group);
  std::vector<BlockId> all;
  for (int32_t b = 0; b < layout.num_blocks; ++b) all.push_back(BlockId{b});
  std::vector<std::byte> image(all.size() * layout.block_size_bytes());
  const Status st = backend.read_blocks(group, all, image);
  KVP_CHECK(st.is_ok(), "{}", st.to_string());
  return image;
}

// Two sequences (5 and 3 new tokens) on shuffled blocks of 4 tokens, logits of both last rows.
struct TwoSequenceBatch {
  std::vector<int32_t> token_ids = {5, 9, 13, 2, 7, 11, 3, 8};
  std::vector<int32_t> query_start = {0, 5, 8};
  std::vector<int32_t> kv_lens = {5, 3};
  std::vector<int64_t> slots;                        // seq 0 on blocks 6, 1; seq 1 on block 4
  std::vector<int32_t> block_tables = {6, 1, 4, 0};  // [2 seqs][2 blocks]
  std::vector<int32_t> logit_rows = {4, 7};

  TwoSequenceBatch() {
    for (int32_t t = 0; t < 5; ++t) slots.push_back(int64_t{block_tables[t / 4]} * 4 + t % 4);
    for (int32_t t = 0; t < 3; ++t) slots.push_back(int64_t{block_tables[2]} * 4 + t);
  }
  ForwardBatch batch(int32_t num_groups) const {
    ForwardBatch b;
    b.token_ids = token_ids;
    b.query_start = query_start;
    b.kv_lens = kv_lens;
    for (int32_t g = 0; g < num_groups; ++g) b.groups.push_back({slots, block_tables, 2});
    b.logit_rows = logit_rows;
    return b;
  }
};

class CpuForwardBackendTest : public ::testing::TestWithParam<DType> {};

TEST_P(CpuForwardBackendTest, WrittenBlocksReadBackInAnyOrderAndOthersStayUntouched) {
  CpuForwardBackend backend(load_tiny("gemma3"));  // two cache groups
  ASSERT_TRUE(backend.allocate_kv(layouts_of(backend, 8, 4, GetParam())).is_ok());
  for (int32_t g = 0; g < backend.num_cache_groups(); ++g) {
    const size_t block_bytes = backend.kv_layout(g).block_size_bytes();
    const std::vector<std::byte> before = read_all(backend, g);
    const std::vector<BlockId> blocks = {BlockId{5}, BlockId{2}, BlockId{7}};
    const std::vector<std::byte> image = random_bytes(3 * block_bytes, 17 + g);
    ASSERT_TRUE(backend.write_blocks(g, blocks, image).is_ok());
    // one block at a time, in another order
    for (size_t i : {2u, 0u, 1u}) {
      std::vector<std::byte> one(block_bytes);
      ASSERT_TRUE(backend.read_blocks(g, std::span(&blocks[i], 1), one).is_ok());
      EXPECT_EQ(0, std::memcmp(one.data(), image.data() + i * block_bytes, block_bytes))
          << "group " << g << " block " << blocks[i].value;
    }
    const std::vector<std::byte> after = read_all(backend, g);
    for (int32_t b : {0, 1, 3, 4, 6}) {
      EXPECT_EQ(0, std::memcmp(after.data() + b * block_bytes, before.data() + b * block_bytes,
                               block_bytes))
          << "group " << g << " block " << b << " changed";
    }
  }
}

TEST_P(CpuForwardBackendTest, CopyBlocksCopiesEveryLayerOfTheSourceBlock) {
  CpuForwardBackend backend(load_tiny("llama"));
  ASSERT_TRUE(backend.allocate_kv(layouts_of(backend, 8, 4, GetParam())).is_ok());
  const size_t block_bytes = backend.kv_layout(0).block_size_bytes();
  const std::vector<BlockId> sources = {BlockId{1}, BlockId{3}};
  const std::vector<std::byte> image = random_bytes(2 * block_bytes, 5);
  ASSERT_TRUE(backend.write_blocks(0, sources, image).is_ok());
  const std::vector<BlockCopy> ops = {{BlockId{1}, BlockId{6}, 0}, {BlockId{3}, BlockId{0}, 0}};
  ASSERT_TRUE(backend.copy_blocks(0, ops).is_ok());
  const std::vector<std::byte> all = read_all(backend, 0);
  EXPECT_EQ(0, std::memcmp(all.data() + 6 * block_bytes, image.data(), block_bytes));
  EXPECT_EQ(0, std::memcmp(all.data() + 0 * block_bytes, image.data() + block_bytes, block_bytes));
  EXPECT_EQ(0, std::memcmp(all.data() + 1 * block_bytes, image.data(), block_bytes));
}

// The cache spec of a backend's model with the pool's dtype and block size (as the engine makes
// it), for host slabs of transfers.
CacheSpec spec_of(const ForwardBackend& backend, DType dtype, int32_t block_size) {
  const ModelSpec& m = backend.spec();
  std::vector<LayerAttention> attention;
  for (int32_t l = 0; l < m.num_layers; ++l) {
    attention.push_back(m.layer_is_sliding[l] ? LayerAttention::sliding(m.sliding_window)
                                              : LayerAttention::global());
  }
  return CacheSpec::create("test", m.num_layers, m.num_kv_heads, m.head_dim, dtype, block_size,
                           std::move(attention))
      .value();
}

// Tier transfers: the host slab (addressed here through KvLayout, not the backend) holds each
// block's per-layer runs as read_blocks' image has them, whether the CPU backend's own transfers
// or the base implementation (through images) move them; moving back into other pool blocks
// reproduces the image, and the pool's other blocks stay untouched.
TEST_P(CpuForwardBackendTest, TierTransfersMoveBlocksBetweenThePoolAndAHostSlab) {
  CpuForwardBackend backend(load_tiny("gemma3"));  // two cache groups
  ASSERT_TRUE(backend.allocate_kv(layouts_of(backend, 8, 4, GetParam())).is_ok());
  const CacheSpec spec = spec_of(backend, GetParam(), 4);
  for (const bool base : {false, true}) {
    auto mine = HostKvStorage::create(spec, std::vector<int32_t>(spec.num_groups(), 5));
    ASSERT_TRUE(mine.is_ok());
    HostKvStorage host = std::move(mine).value();
    for (int32_t g = 0; g < backend.num_cache_groups(); ++g) {
      const KvLayout& layout = backend.kv_layout(g);
      const KvLayout& slab = host.layout(g);
      const size_t block_bytes = layout.block_size_bytes();
      const size_t run_bytes = size_t(layout.block_pitch()) * dtype_size_bytes(layout.dtype);
      const std::vector<BlockId> filled = {BlockId{5}, BlockId{6}, BlockId{2}};
      ASSERT_TRUE(backend.write_blocks(g, filled, random_bytes(3 * block_bytes, 40 + g)).is_ok());
      const std::vector<std::byte> before = read_all(backend, g);
      const std::vector<BlockTransfer> out = {
          {Pool::Device, BlockId{5}, Pool::Host, BlockId{0}, g},
          {Pool::Device, BlockId{6}, Pool::Host, BlockId{1}, g},
          {Pool::Device, BlockId{2}, Pool::Host, BlockId{3}, g}};
      auto ticket = base ? backend.ForwardBackend::start_transfers(g, out, host)
                         : backend.start_transfers(g, out, host);
      ASSERT_TRUE(ticket.is_ok()) << ticket.status().to_string();
      ASSERT_TRUE(backend.wait_transfers(*ticket).is_ok());
      for (const BlockTransfer& op : out) {
        for (int32_t layer = 0; layer < layout.num_layers; ++layer) {
          const std::byte* in_slab =
              host.slab(g).data() +
              slab.block_offset(layer, op.dst.value, 0) * dtype_size_bytes(slab.dtype);
          const std::byte* in_image =
              before.data() + op.src.value * block_bytes + layer * run_bytes;
          EXPECT_EQ(0, std::memcmp(in_slab, in_image, run_bytes))
              << "base " << base << " group " << g << " block " << op.src.value << " layer "
              << layer;
        }
      }
      // back into blocks 0, 1, 7 (host 0, 1, 3: one run of two, then one)
      const std::vector<BlockTransfer> in = {{Pool::Host, BlockId{0}, Pool::Device, BlockId{0}, g},
                                             {Pool::Host, BlockId{1}, Pool::Device, BlockId{1}, g},
                                             {Pool::Host, BlockId{3}, Pool::Device, BlockId{7}, g}};
      ticket = base ? backend.ForwardBackend::start_transfers(g, in, host)
                    : backend.start_transfers(g, in, host);
      ASSERT_TRUE(ticket.is_ok()) << ticket.status().to_string();
      ASSERT_TRUE(backend.wait_transfers(*ticket).is_ok());
      const std::vector<std::byte> after = read_all(backend, g);
      const int32_t moved[3][2] = {{5, 0}, {6, 1}, {2, 7}};  // {source, destination}
      for (const auto& m : moved) {
        EXPECT_EQ(0, std::memcmp(after.data() + m[1] * block_bytes,
                                 before.data() + m[0] * block_bytes, block_bytes))
            << "base " << base << " group " << g << " block " << m[0] << " -> " << m[1];
      }
      for (int32_t b : {2, 3, 4, 5, 6}) {
        EXPECT_EQ(0, std::memcmp(after.data() + b * block_bytes, before.data() + b * block_bytes,
                                 block_bytes))
            << "group " << g << " block " << b << " changed";
      }
    }
  }
}

TEST(CpuForwardBackend, BadTierTransfersAreRefusedWithNothingCopied) {
  CpuForwardBackend backend(load_tiny("llama"));
  ASSERT_TRUE(backend.allocate_kv(layouts_of(backend, 8, 4, DType::F32)).is_ok());
  HostKvStorage host =
      HostKvStorage::create(spec_of(backend, DType::F32, 4), std::vector<int32_t>{2}).value();
  const std::vector<std::byte> zeros(host.slab(0).size());
  auto refused = [&](std::vector<BlockTransfer> ops, int32_t group = 0) {
    auto ticket = backend.start_transfers(group, ops, host);
    return !ticket.is_ok() && ticket.status().code() == StatusCode::kInvalidArgument;
  };
  EXPECT_TRUE(refused({{Pool::Device, BlockId{8}, Pool::Host, BlockId{0}, 0}}));  // pool id
  EXPECT_TRUE(refused({{Pool::Device, BlockId{0}, Pool::Host, BlockId{2}, 0}}));  // host id
  EXPECT_TRUE(refused({{Pool::Device, BlockId{0}, Pool::Host, BlockId{0}, 0},
                       {Pool::Host, BlockId{1}, Pool::Device, BlockId{1}, 0}}));  // directions
  EXPECT_TRUE(refused({{Pool::Device, BlockId{0}, Pool::Device, BlockId{1}, 0}}));
  EXPECT_TRUE(refused({{Pool::Device, BlockId{0}, Pool::Host, BlockId{0}, 0}}, 1));  // group
  HostKvStorage bf16 =
      HostKvStorage::create(spec_of(backend, DType::BF16, 4), std::vector<int32_t>{2}).value();
  auto other = backend.start_transfers(
      0, std::vector<BlockTransfer>{{Pool::Device, BlockId{0}, Pool::Host, BlockId{0}, 0}}, bf16);
  EXPECT_FALSE(other.is_ok());  // another layout
  EXPECT_EQ(0, std::memcmp(host.slab(0).data(), zeros.data(), zeros.size()));
}

INSTANTIATE_TEST_SUITE_P(KvDtypes, CpuForwardBackendTest,
                         ::testing::Values(DType::F32, DType::BF16, DType::F16),
                         [](const auto& info) { return std::string(dtype_name(info.param)); });

TEST(CpuForwardBackend, BadIdsSizesAndGroupsAreRefusedWithNothingChanged) {
  CpuForwardBackend backend(load_tiny("gemma3"));
  std::vector<std::byte> one(64);
  // nothing allocated yet
  Status st = backend.read_blocks(0, std::vector<BlockId>{BlockId{0}}, one);
  EXPECT_EQ(st.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(st.message().find("before allocate_kv"), std::string::npos) << st.to_string();

  ASSERT_TRUE(backend.allocate_kv(layouts_of(backend, 8, 4, DType::F32)).is_ok());
  const size_t block_bytes = backend.kv_layout(0).block_size_bytes();
  ASSERT_TRUE(
      backend.write_blocks(0, std::vector<BlockId>{BlockId{1}}, random_bytes(block_bytes, 3))
          .is_ok());
  const std::vector<std::byte> before = read_all(backend, 0);
  const std::vector<std::byte> image = random_bytes(2 * block_bytes, 4);

  st = backend.write_blocks(0, std::vector<BlockId>{BlockId{1}, BlockId{8}}, image);
  EXPECT_EQ(st.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(st.message().find("block 8"), std::string::npos) << st.to_string();
  st = backend.write_blocks(0, std::vector<BlockId>{BlockId{-1}, BlockId{2}}, image);
  EXPECT_EQ(st.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(st.message().find("block -1"), std::string::npos) << st.to_string();
  st = backend.write_blocks(0, std::vector<BlockId>{BlockId{1}},
                            image);  // two blocks' bytes for one
  EXPECT_EQ(st.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(st.message().find("bytes"), std::string::npos) << st.to_string();
  st = backend.write_blocks(2, std::vector<BlockId>{BlockId{1}},
                            std::span(image).first(block_bytes));
  EXPECT_EQ(st.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(st.message().find("group 2"), std::string::npos) << st.to_string();
  st = backend.copy_blocks(
      0, std::vector<BlockCopy>{{BlockId{1}, BlockId{2}, 0}, {BlockId{1}, BlockId{9}, 0}});
  EXPECT_EQ(st.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(st.message().find("block 9"), std::string::npos) << st.to_string();
  st = backend.copy_blocks(0, std::vector<BlockCopy>{{BlockId{1}, BlockId{2}, 1}});
  EXPECT_EQ(st.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(st.message().find("of group 1"), std::string::npos) << st.to_string();
  std::vector<std::byte> out(2 * block_bytes, std::byte{0x33});
  st = backend.read_blocks(0, std::vector<BlockId>{BlockId{1}, BlockId{100}}, out);
  EXPECT_EQ(st.code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(out, std::vector<std::byte>(2 * block_bytes, std::byte{0x33})) << "read in part";

  EXPECT_EQ(read_all(backend, 0), before) << "a refused call changed the pool";
}

TEST(CpuForwardBackend, KvDtypesAndLayoutsOtherThanTheModelsAreRefused) {
  CpuForwardBackend backend(load_tiny("gemma3"));
  EXPECT_TRUE(backend.check_kv_dtype(DType::F32).is_ok());
  EXPECT_TRUE(backend.check_kv_dtype(DType::BF16).is_ok());
  EXPECT_TRUE(backend.check_kv_dtype(DType::F16).is_ok());
  const Status bad = backend.check_kv_dtype(static_cast<DType>(9));
  EXPECT_EQ(bad.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(bad.message().find("cpu"), std::string::npos) << bad.to_string();

  std::vector<KvLayout> layouts = layouts_of(backend, 8, 4, DType::BF16);
  EXPECT_EQ(backend.allocate_kv(std::span(layouts).first(1)).code(),
            StatusCode::kInvalidArgument);  // gemma3 has two groups
  std::vector<KvLayout> wrong = layouts;
  wrong[1].num_kv_heads += 1;
  const Status st = backend.allocate_kv(wrong);
  EXPECT_EQ(st.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(st.message().find("group 1"), std::string::npos) << st.to_string();
  ASSERT_TRUE(backend.allocate_kv(layouts).is_ok());
  EXPECT_EQ(backend.kv_layout(1), layouts[1]);
}

// The backend's forward pass is ModelRunner::forward on the backend's slabs: the same logits and,
// read as block images, the same KV as slabs that the test lays out and hands to the runner.
TEST(CpuForwardBackend, ForwardEqualsModelRunnerForwardAndImagesFollowTheSlabLayout) {
  for (const char* name : {"llama", "gemma3", "qwen3", "qwen3_moe", "qwen2_moe", "gpt_oss"}) {
    SCOPED_TRACE(name);
    std::shared_ptr<ModelRunner> runner = load_tiny(name);
    CpuForwardBackend backend(runner);
    const int32_t num_groups = runner->num_cache_groups();
    const std::vector<KvLayout> layouts = layouts_of(backend, 8, 4, DType::F32);
    ASSERT_TRUE(backend.allocate_kv(layouts).is_ok());
    std::vector<HostKvSlab> slabs(num_groups);
    for (int32_t g = 0; g < num_groups; ++g) {
      slabs[g].layout = layouts[g];
      slabs[g].bytes.assign(layouts[g].size_bytes(), std::byte{0});
      // the same starting bytes in both pools
      const std::vector<std::byte> zeros(8 * layouts[g].block_size_bytes());
      std::vector<BlockId> all;
      for (int32_t b = 0; b < 8; ++b) all.push_back(BlockId{b});
      ASSERT_TRUE(backend.write_blocks(g, all, zeros).is_ok());
    }
    const TwoSequenceBatch two;
    const int32_t vocab = runner->spec().vocab_size;
    std::vector<float> expected(2 * vocab), logits(2 * vocab);
    ASSERT_TRUE(runner->forward(two.batch(num_groups), slabs, expected).is_ok());
    ASSERT_TRUE(backend.forward(two.batch(num_groups), logits).is_ok());
    EXPECT_EQ(logits, expected);

    for (int32_t g = 0; g < num_groups; ++g) {
      const KvLayout& l = layouts[g];
      const size_t run_bytes = static_cast<size_t>(l.block_pitch()) * sizeof(float);
      const std::vector<std::byte> image = read_all(backend, g);
      size_t offset = 0;
      bool any_written = false;
      for (int32_t b = 0; b < l.num_blocks; ++b) {
        for (int32_t layer = 0; layer < l.num_layers; ++layer) {
          const std::byte* slab_run = slabs[g].bytes.data() + l.block_offset(layer, b, 0) * 4;
          EXPECT_EQ(0, std::memcmp(image.data() + offset, slab_run, run_bytes))
              << "group " << g << " block " << b << " layer " << layer;
          for (size_t i = 0; i < run_bytes; ++i) any_written |= slab_run[i] != std::byte{0};
          offset += run_bytes;
        }
      }
      EXPECT_TRUE(any_written) << "group " << g << ": the forward pass wrote no KV";
    }

    // a bad batch is refused by the backend as by the runner
    TwoSequenceBatch bad;
    bad.token_ids[0] = vocab;
    EXPECT_EQ(backend.forward(bad.batch(num_groups), logits).code(), StatusCode::kInvalidArgument);
  }
}

}  // namespace
}  // namespace kvp
