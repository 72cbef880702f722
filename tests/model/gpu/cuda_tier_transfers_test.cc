// CudaForwardBackend's tier transfers (model/cuda/cuda_forward_backend.h): blocks move between
// the device pool and a pinned host slab (the backend's slab allocator) on the copy stream, one
// DMA per run, and land as read_blocks' synchronous image says; they are ordered after the
// compute stream's queued work (a fill still running when the transfer starts is copied whole);
// tickets complete in order; work queued on the compute stream after order_after_transfers sees
// the copy's bytes; an engine's restore whose step runs under its copy, layer by layer, computes
// what a restore that waits for its copy computes; a copy out ordered after keeps its bytes from
// the writes queued behind it, and an engine giving a session's blocks back as its copy out
// starts computes what one that waits computes. Skips without a CUDA device.
#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <cstring>
#include <memory>
#include <optional>
#include <random>

#include "cache/cache_spec.h"
#include "engine/engine.h"
#include "model/cuda/cuda_forward_backend.h"
#include "model/random_model.h"
#include "support/gpu_skip.h"

namespace kvp::cuda {
namespace {

std::vector<std::byte> read_all(const ForwardBackend& backend, int32_t num_blocks) {
  std::vector<BlockId> all;
  for (int32_t b = 0; b < num_blocks; ++b) all.push_back(BlockId{b});
  std::vector<std::byte> image(all.size() * backend.kv_layout(0).block_size_bytes());
  KVP_CHECK(backend.read_blocks(0, all, image).is_ok(), "read_blocks");
  return image;
}

// A backend of the SmolLM2-135M shape (head_dim 64: the pool is not padded) with a bf16 pool of
// num_blocks blocks of 16 tokens, and the CacheSpec of host slabs in its layout.
struct TestPool {
  std::unique_ptr<ForwardBackend> owner;
  CudaForwardBackend* gpu = nullptr;
  std::optional<CacheSpec> cache;
};
void make_pool(int32_t num_blocks, TestPool* pool) {
  constexpr int32_t kBlockSize = 16;
  auto spec = random_model_spec("smollm2-135m");
  ASSERT_TRUE(spec.is_ok());
  auto made = make_random_cuda_backend(*spec, 1);
  ASSERT_TRUE(made.is_ok()) << made.status().to_string();
  pool->owner = std::move(made).value();
  pool->gpu = static_cast<CudaForwardBackend*>(pool->owner.get());
  std::vector<KvLayout> layouts = {pool->gpu->group_layout(0, num_blocks, kBlockSize, DType::BF16)};
  ASSERT_TRUE(pool->gpu->allocate_kv(layouts).is_ok());
  std::vector<LayerAttention> attention(spec->num_layers, LayerAttention::global());
  pool->cache = CacheSpec::create("test", spec->num_layers, spec->num_kv_heads, spec->head_dim,
                                  DType::BF16, kBlockSize, attention)
                    .value();
}

// n blocks of host slab in the pool's layout from the backend's (pinned) slab allocator, zeroed.
HostKvStorage pinned_slab(const TestPool& pool, int32_t n) {
  auto made = HostKvStorage::create(*pool.cache, std::vector<int32_t>{n},
                                    HostKvStorage::Init::kZeroed, pool.gpu->host_slab_allocator());
  KVP_CHECK(made.is_ok(), "{}", made.status().to_string());
  return std::move(made).value();
}

TEST(CudaTierTransfers, BlocksMoveThroughPinnedSlabsInOrderAfterQueuedWork) {
  SKIP_WITHOUT_GPU();
  constexpr int32_t kBlocks = 32;
  TestPool made;
  make_pool(kBlocks, &made);
  if (HasFatalFailure()) return;
  CudaForwardBackend* gpu = made.gpu;
  const CacheSpec& cache = *made.cache;
  auto slab = HostKvStorage::create(cache, std::vector<int32_t>{8}, HostKvStorage::Init::kZeroed,
                                    gpu->host_slab_allocator());
  ASSERT_TRUE(slab.is_ok()) << slab.status().to_string();
  HostKvStorage host = std::move(slab).value();
  cudaPointerAttributes attributes{};
  ASSERT_EQ(cudaPointerGetAttributes(&attributes, host.slab(0).data()), cudaSuccess);
  EXPECT_EQ(attributes.type, cudaMemoryTypeHost) << "the host tier's slab is pinned";

  const KvLayout& layout = gpu->kv_layout(0);
  const size_t block_bytes = layout.block_size_bytes();
  const size_t run_bytes = size_t(layout.block_pitch()) * 2;
  ASSERT_TRUE(gpu->fill_kv_random(7).is_ok());
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  // a second fill, queued and not waited for: the transfer must copy what it writes
  ASSERT_TRUE(gpu->fill_kv_random(8).is_ok());
  // pool 5, 6, 7 -> host 0, 1, 2 (one run), pool 2 -> host 5
  const std::vector<BlockTransfer> out = {{Pool::Device, BlockId{5}, Pool::Host, BlockId{0}, 0},
                                          {Pool::Device, BlockId{6}, Pool::Host, BlockId{1}, 0},
                                          {Pool::Device, BlockId{7}, Pool::Host, BlockId{2}, 0},
                                          {Pool::Device, BlockId{2}, Pool::Host, BlockId{5}, 0}};
  auto first = gpu->start_transfers(0, out, host);
  ASSERT_TRUE(first.is_ok()) << first.status().to_string();
  ASSERT_TRUE(gpu->wait_transfers(*first).is_ok());
  auto done = gpu->transfers_done(*first);
  ASSERT_TRUE(done.is_ok());
  EXPECT_TRUE(*done);
  const std::vector<std::byte> pool = read_all(*gpu, kBlocks);
  for (const BlockTransfer& op : out) {
    for (int32_t layer = 0; layer < layout.num_layers; ++layer) {
      const std::byte* in_slab =
          host.slab(0).data() + host.layout(0).block_offset(layer, op.dst.value, 0) * 2;
      EXPECT_EQ(0,
                std::memcmp(in_slab, pool.data() + op.src.value * block_bytes + layer * run_bytes,
                            run_bytes))
          << "pool block " << op.src.value << " layer " << layer;
    }
  }
  // back into pool 20, 21, 22 and 9; the rest of the pool unchanged
  const std::vector<BlockTransfer> in = {{Pool::Host, BlockId{0}, Pool::Device, BlockId{20}, 0},
                                         {Pool::Host, BlockId{1}, Pool::Device, BlockId{21}, 0},
                                         {Pool::Host, BlockId{2}, Pool::Device, BlockId{22}, 0},
                                         {Pool::Host, BlockId{5}, Pool::Device, BlockId{9}, 0}};
  auto second = gpu->start_transfers(0, in, host);
  ASSERT_TRUE(second.is_ok()) << second.status().to_string();
  EXPECT_GT(*second, *first);
  ASSERT_TRUE(gpu->wait_transfers(*second).is_ok());
  const std::vector<std::byte> after = read_all(*gpu, kBlocks);
  const int32_t moved[4][2] = {{5, 20}, {6, 21}, {7, 22}, {2, 9}};
  std::vector<bool> destination(kBlocks, false);
  for (const auto& m : moved) {
    destination[m[1]] = true;
    EXPECT_EQ(0, std::memcmp(after.data() + m[1] * block_bytes, pool.data() + m[0] * block_bytes,
                             block_bytes))
        << "block " << m[0] << " -> " << m[1];
  }
  for (int32_t b = 0; b < kBlocks; ++b) {
    if (destination[b]) continue;
    EXPECT_EQ(
        0, std::memcmp(after.data() + b * block_bytes, pool.data() + b * block_bytes, block_bytes))
        << "block " << b << " changed";
  }
  // refusals change nothing
  const std::vector<BlockTransfer> bad = {
      {Pool::Device, BlockId{kBlocks}, Pool::Host, BlockId{0}, 0}};
  EXPECT_FALSE(gpu->start_transfers(0, bad, host).is_ok());
}

// A copy into the pool of ~750 MB (tens of ms on the copy engine) and, queued on the compute
// stream right after order_after_transfers, a block copy from the last block it fills: the block
// copy must read the new bytes, not the pool's old ones (without the order it would run at once,
// long before the transfer's last block lands).
TEST(CudaTierTransfers, ComputeWorkOrderedAfterATransferSeesItsBytes) {
  SKIP_WITHOUT_GPU();
  constexpr int32_t kMoved = 2048;
  TestPool made;
  make_pool(kMoved + 1, &made);
  if (HasFatalFailure()) return;
  CudaForwardBackend* gpu = made.gpu;
  HostKvStorage host = pinned_slab(made, kMoved);
  std::memset(host.slab(0).data(), 0x5a, host.slab(0).size());
  ASSERT_TRUE(gpu->fill_kv_random(3).is_ok());
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  std::vector<BlockTransfer> in;
  for (int32_t b = 0; b < kMoved; ++b) {
    in.push_back({Pool::Host, BlockId{b}, Pool::Device, BlockId{b}, 0});
  }
  auto ticket = gpu->start_transfers(0, in, host);
  ASSERT_TRUE(ticket.is_ok()) << ticket.status().to_string();
  ASSERT_TRUE(gpu->order_after_transfers(*ticket).is_ok());
  const std::vector<BlockCopy> copy = {{BlockId{kMoved - 1}, BlockId{kMoved}, 0}};
  ASSERT_TRUE(gpu->copy_blocks(0, copy).is_ok());
  const std::vector<std::byte> pool = read_all(*gpu, kMoved + 1);  // on the compute stream
  const size_t block_bytes = gpu->kv_layout(0).block_size_bytes();
  const std::byte* copied = pool.data() + size_t(kMoved) * block_bytes;
  size_t stale = 0;
  for (size_t i = 0; i < block_bytes; ++i) stale += copied[i] != std::byte{0x5a};
  EXPECT_EQ(stale, 0u) << "of " << block_bytes << " bytes";
  ASSERT_TRUE(gpu->wait_transfers(*ticket).is_ok());
  // a ticket already done orders nothing and is no error
  EXPECT_TRUE(gpu->order_after_transfers(*ticket).is_ok());
}

// Out of the pool with its blocks given back at once: ~750 MB (tens of ms on the copy engine)
// copied out and ordered after (order_after_transfers), then, queued right behind it, either a
// block copy on the compute stream over every source block, or a copy into the pool of other
// bytes into those blocks. Both wait for the copy out: the host copy holds what a copy waited for
// before anything touched the blocks holds, and the pool ends with the new bytes.
TEST(CudaTierTransfers, ACopyOutOrderedAfterKeepsItsBytesFromWritesQueuedBehindIt) {
  SKIP_WITHOUT_GPU();
  constexpr int32_t kMoved = 2048;
  TestPool made;
  make_pool(kMoved + 1, &made);
  if (HasFatalFailure()) return;
  CudaForwardBackend* gpu = made.gpu;
  HostKvStorage reference = pinned_slab(made, kMoved), copied = pinned_slab(made, kMoved),
                other = pinned_slab(made, kMoved), back = pinned_slab(made, kMoved);
  std::memset(other.slab(0).data(), 0x5a, other.slab(0).size());
  std::vector<BlockTransfer> out, in;
  for (int32_t b = 0; b < kMoved; ++b) {
    out.push_back({Pool::Device, BlockId{b}, Pool::Host, BlockId{b}, 0});
    in.push_back({Pool::Host, BlockId{b}, Pool::Device, BlockId{b}, 0});
  }
  const size_t bytes = copied.slab(0).size();
  for (const bool copy_in : {false, true}) {
    SCOPED_TRACE(copy_in ? "a copy into the pool behind it" : "a block copy behind it");
    ASSERT_TRUE(gpu->fill_kv_random(copy_in ? 5 : 4).is_ok());
    auto r = gpu->start_transfers(0, out, reference);
    ASSERT_TRUE(r.is_ok()) << r.status().to_string();
    ASSERT_TRUE(gpu->wait_transfers(*r).is_ok());
    std::memset(copied.slab(0).data(), 0, bytes);

    auto t = gpu->start_transfers(0, out, copied);
    ASSERT_TRUE(t.is_ok()) << t.status().to_string();
    ASSERT_TRUE(gpu->order_after_transfers(*t).is_ok());
    if (!copy_in) {
      std::vector<BlockCopy> over;
      for (int32_t b = 0; b < kMoved; ++b) over.push_back({BlockId{kMoved}, BlockId{b}, 0});
      ASSERT_TRUE(gpu->copy_blocks(0, over).is_ok());
    } else {
      auto i = gpu->start_transfers(0, in, other);
      ASSERT_TRUE(i.is_ok()) << i.status().to_string();
      ASSERT_TRUE(gpu->wait_transfers(*i).is_ok());
    }
    ASSERT_TRUE(gpu->wait_transfers(*t).is_ok());
    size_t differ = 0;
    for (size_t i = 0; i < bytes; ++i) differ += copied.slab(0)[i] != reference.slab(0)[i];
    EXPECT_EQ(differ, 0u) << "of " << bytes << " bytes copied out";

    // what the pool holds now: the block copied over every block, or the other bytes
    auto b = gpu->start_transfers(0, out, back);
    ASSERT_TRUE(b.is_ok());
    ASSERT_TRUE(gpu->wait_transfers(*b).is_ok());
    if (copy_in) {
      EXPECT_EQ(0, std::memcmp(back.slab(0).data(), other.slab(0).data(), bytes));
    } else {
      const std::vector<std::byte> pool = read_all(*gpu, kMoved + 1);
      const size_t block_bytes = gpu->kv_layout(0).block_size_bytes();
      size_t stale = 0;
      for (int32_t blk = 0; blk < kMoved; blk += 97) {
        stale += std::memcmp(pool.data() + size_t(blk) * block_bytes,
                             pool.data() + size_t(kMoved) * block_bytes, block_bytes) != 0;
      }
      EXPECT_EQ(stale, 0u);
    }
  }
}

// An agent's 7K-token session (~160 MB of KV in the SmolLM2-135M shape: milliseconds on the
// copy engine) pushed to the host tier by another request, then its next turn alone: with
// restore_overlap its step is ordered after the copy layer by layer and runs while the
// copy lands; without, it waits for the copy. Both steps run the same batch on the same KV, so
// the greedy tokens agree; a layer that did not wait for its blocks would read the other
// request's KV left in them.
TEST(CudaTierTransfers, ARestoreOverlappingItsStepLayerByLayerComputesWhatWaitingComputes) {
  SKIP_WITHOUT_GPU();
  auto spec = random_model_spec("smollm2-135m");
  ASSERT_TRUE(spec.is_ok());
  constexpr int32_t kHistory = 7000;  // the shape's context is 8192
  std::mt19937 rng(11);
  const auto random_prompt = [&](int32_t n) {
    std::vector<int32_t> tokens(n);
    for (int32_t& t : tokens) t = 3 + int32_t(rng() % uint32_t(spec->vocab_size - 3));
    return tokens;
  };
  const std::vector<int32_t> history = random_prompt(kHistory);
  const std::vector<int32_t> other = random_prompt(kHistory);
  const std::vector<int32_t> next_turn = random_prompt(3);
  const auto run = [&](bool overlap, EngineStats* stats, bool copy_out_overlap = false) {
    auto backend = make_random_cuda_backend(*spec, 1);
    KVP_CHECK(backend.is_ok(), "{}", backend.status().to_string());
    EngineConfig config;
    config.num_blocks = 660;  // 10560 tokens: one history and a half
    config.block_size = 16;
    config.kv_dtype = DType::BF16;
    config.host_tier_bytes = uint64_t{2} << 30;
    config.restore_overlap = overlap ? RestoreOverlap::kAlone : RestoreOverlap::kOff;
    config.copy_out_overlap = copy_out_overlap;
    // the session leaves when the other request needs its room, not ahead of that (a write-back)
    if (copy_out_overlap) config.tier_watermark = 0;
    auto engine = Engine::create(backend->get(), config);
    KVP_CHECK(engine.is_ok(), "{}", engine.status().to_string());
    const auto serve = [&](std::vector<int32_t> prompt, bool session, int32_t max_tokens) {
      Request r;
      r.prompt_tokens = std::move(prompt);
      r.max_tokens = max_tokens;
      r.ignore_eos = true;
      if (session) r.session = "agent";
      const RequestId id = (*engine)->submit(r).value();
      std::vector<int32_t> tokens;
      for (int guard = 0; (*engine)->has_unfinished() && guard < 10000; ++guard) {
        for (const EngineEvent& e : (*engine)->step()) {
          if (e.kind == EngineEvent::Kind::kToken && e.request_id == id)
            tokens.push_back(e.token_id);
        }
      }
      return tokens;
    };
    serve(history, true, 4);
    serve(other, false, 4);  // the idle session leaves the pool for the host tier
    (*engine)->settle_tier_moves();
    const std::vector<int32_t> tokens = serve(next_turn, true, 8);
    (*engine)->check_integrity();
    *stats = (*engine)->stats();
    return tokens;
  };
  EngineStats overlapped, waited;
  const std::vector<int32_t> with_overlap = run(true, &overlapped);
  const std::vector<int32_t> with_wait = run(false, &waited);
  ASSERT_EQ(overlapped.num_session_restores, 1);
  ASSERT_EQ(waited.num_session_restores, 1);
  EXPECT_EQ(overlapped.num_restores_joined_steps, 1);
  EXPECT_EQ(waited.num_restores_joined_steps, 0);
  EXPECT_EQ(with_overlap.size(), 8u);
  EXPECT_EQ(with_overlap, with_wait);

  // the session pushed out for the other request's room with its blocks given back at once: the
  // other request's prefill writes them as each layer is read out (a layer that did not wait
  // would leave the other request's KV in the host copy, and the restore would compute from it)
  EngineStats given_back;
  const std::vector<int32_t> with_copy_out_overlap = run(true, &given_back, true);
  ASSERT_EQ(given_back.num_session_restores, 1);
  EXPECT_EQ(given_back.num_session_moves_to_host, 1);
  EXPECT_EQ(given_back.num_copies_out_ordered, 1);
  EXPECT_EQ(waited.num_copies_out_ordered, 0);
  EXPECT_EQ(with_copy_out_overlap, with_wait);
}

}  // namespace
}  // namespace kvp::cuda
