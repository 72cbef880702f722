// HostKvStorage: the KV bytes of a block pool in host memory, one slab per cache group, laid out
// as cache/kv_layout.h says. It executes the byte moves that bookkeeping asks for (BlockCopy),
// and moves one sequence between its blocks and dense per-layer tensors (gather / scatter) —
// what cache files, host offload and tests need.
//
//   group g slab (4096-byte aligned, KvLayout::size_bytes() of spec.group_layout(g, n_g)):
//   ┌──── layer 0 of the group ─────┬──── layer 1 ──── …
//   │ b0.K b0.V b1.K b1.V …          │ b0.K b0.V …
//   b.K = [num_kv_heads][block_size][head_dim] (8-bit: each head's rows followed by their scales)
//
// A block table here is logical: entry i holds the block of tokens [i * block_size,
// (i + 1) * block_size) of the sequence. Gather and scatter read only the entries that cover
// the requested token range, so a windowed group's table may hold anything (e.g. BlockId{-1})
// in entries for tokens that fell behind the window.
//
// Dense tensors are one layer's K (or V) of a token range: [num_tokens][num_kv_heads] head
// vectors of the spec's dtype, tokens in order; a head vector is [head_dim] elements, for 8-bit KV
// followed by its f16 scale (cache/kv_quant.h kv_vector_bytes).
//
// Block ids and table shapes come from bookkeeping, so violations are programming errors
// (KVP_CHECK), never Status. Not thread-safe; the engine loop owns it.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <type_traits>
#include <vector>

#include "cache/block_ops.h"
#include "cache/cache_spec.h"
#include "cache/kv_layout.h"
#include "common/dtype.h"
#include "common/ids.h"
#include "common/status.h"

namespace kvp {

class HostKvStorage {
 public:
  static constexpr size_t kAlignment = 4096;
  static constexpr uint64_t kMaxSlabBytes = uint64_t{1} << 46;  // 64 TiB

  // Slabs of kHugePageBytes and more are aligned to it and offered to the kernel as
  // transparent huge pages: a session of a large model is hundreds of MB, and faulting it in
  // 4 KiB pages costs more than copying it.
  static constexpr size_t kHugePageBytes = size_t{2} << 20;

  enum class Init { kZeroed, kUninitialized };  // kUninitialized: the caller writes every byte

  // Where slabs come from when not from aligned_alloc: a backend may hand out memory its device
  // copies into directly (pinned; ForwardBackend::host_slab_allocator). allocate returns null
  // when it cannot; memory it returns is at least kAlignment-aligned.
  struct SlabAllocator {
    void* (*allocate)(size_t bytes, void* context) = nullptr;
    void (*release)(void* ptr, void* context) = nullptr;
    void* context = nullptr;
  };

  // Allocates one slab per group of `spec` (zeroed unless told); group g holds num_blocks[g]
  // blocks. InvalidArgument if num_blocks has the wrong length or a negative count;
  // ResourceExhausted if a slab would exceed kMaxSlabBytes or the memory cannot be had.
  // allocator: null for aligned host memory (huge pages advised for large slabs).
  static Result<HostKvStorage> create(const CacheSpec& spec, std::span<const int32_t> num_blocks,
                                      Init init = Init::kZeroed,
                                      const SlabAllocator* allocator = nullptr);

  HostKvStorage(HostKvStorage&&) noexcept = default;
  HostKvStorage& operator=(HostKvStorage&&) noexcept = default;

  const CacheSpec& spec() const { return spec_; }
  int32_t num_groups() const { return spec_.num_groups(); }
  const KvLayout& layout(int32_t group) const;

  // The whole slab of a group, for backends and for before/after comparisons.
  std::span<std::byte> slab(int32_t group);
  std::span<const std::byte> slab(int32_t group) const;

  // One KV head's block in one layer of a group: [block_size][head_dim] elements.
  // T is float (F32), F16 or Bf16 and must match the spec's dtype. kv: 0 = K, 1 = V.
  // requires: layer_in_group < group's layers, 0 <= block < num_blocks, 0 <= head < heads.
  template <typename T>
  std::span<T> head_block(int32_t group, int32_t layer_in_group, BlockId block, int32_t kv,
                          int32_t head);
  template <typename T>
  std::span<const T> head_block(int32_t group, int32_t layer_in_group, BlockId block, int32_t kv,
                                int32_t head) const;

  // Copies every layer's K and V of ops[i].src into ops[i].dst, in order (mutates the slab).
  // requires: every id in [0, num_blocks) of the group.
  void copy_blocks(int32_t group, std::span<const BlockCopy> ops);

  // Dense K and V of tokens [token_begin, token_end) of one layer (model layer index) of a
  // sequence with the given block table of that layer's group. Does not modify the storage.
  // requires: the table covers the range with valid ids; k_out and v_out hold exactly
  //   dense_bytes(token_end - token_begin) bytes.
  void gather_layer(int32_t layer, std::span<const BlockId> block_table, int64_t token_begin,
                    int64_t token_end, std::span<std::byte> k_out,
                    std::span<std::byte> v_out) const;
  // The inverse: writes dense K and V of tokens [token_begin, token_end) into the blocks of the
  // table (mutates those slots only).
  void scatter_layer(int32_t layer, std::span<const BlockId> block_table, int64_t token_begin,
                     int64_t token_end, std::span<const std::byte> k_in,
                     std::span<const std::byte> v_in);

  // Bytes of one layer's dense K (or V) of num_tokens tokens.
  size_t dense_bytes(int64_t num_tokens) const;

 private:
  struct FreeSlab {
    SlabAllocator allocator;  // release == null: std::free
    void operator()(std::byte* p) const;
  };
  using Slab = std::unique_ptr<std::byte[], FreeSlab>;

  HostKvStorage(CacheSpec spec, std::vector<KvLayout> layouts, std::vector<Slab> slabs);
  std::byte* head_block_ptr(int32_t group, int32_t layer_in_group, BlockId block, int32_t kv,
                            int32_t head) const;
  void check_table(int32_t group, std::span<const BlockId> block_table, int64_t token_begin,
                   int64_t token_end) const;

  CacheSpec spec_;
  std::vector<KvLayout> layouts_;  // [num_groups]
  std::vector<Slab> slabs_;        // [num_groups], each layouts_[g].size_bytes() bytes
};

template <typename T>
constexpr DType dtype_of() {
  static_assert(std::is_same_v<T, float> || std::is_same_v<T, F16> || std::is_same_v<T, Bf16>,
                "KV elements are float, F16 or Bf16");
  if constexpr (std::is_same_v<T, float>) return DType::F32;
  if constexpr (std::is_same_v<T, F16>) return DType::F16;
  return DType::BF16;
}

template <typename T>
std::span<T> HostKvStorage::head_block(int32_t group, int32_t layer_in_group, BlockId block,
                                       int32_t kv, int32_t head) {
  KVP_CHECK(dtype_of<T>() == spec_.dtype(), "view as {} of a {} cache", dtype_name(dtype_of<T>()),
            dtype_name(spec_.dtype()));
  const KvLayout& l = layout(group);
  return {reinterpret_cast<T*>(head_block_ptr(group, layer_in_group, block, kv, head)),
          static_cast<size_t>(l.block_size) * l.head_dim};
}

template <typename T>
std::span<const T> HostKvStorage::head_block(int32_t group, int32_t layer_in_group, BlockId block,
                                             int32_t kv, int32_t head) const {
  return const_cast<HostKvStorage*>(this)->head_block<T>(group, layer_in_group, block, kv, head);
}

}  // namespace kvp
