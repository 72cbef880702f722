// HostKvStorage: slabs, typed views, block copy, gather and scatter (see host_kv_storage.h).
#include "cache/host_kv_storage.h"

#include "cache/kv_quant.h"

#include <sys/mman.h>

#include <cstdlib>
#include <cstring>
#include <new>

namespace kvp {

void HostKvStorage::FreeSlab::operator()(std::byte* p) const {
  if (allocator.release != nullptr) {
    allocator.release(p, allocator.context);
  } else {
    std::free(p);
  }
}

HostKvStorage::HostKvStorage(CacheSpec spec, std::vector<KvLayout> layouts, std::vector<Slab> slabs)
    : spec_(std::move(spec)), layouts_(std::move(layouts)), slabs_(std::move(slabs)) {}

Result<HostKvStorage> HostKvStorage::create(const CacheSpec& spec,
                                            std::span<const int32_t> num_blocks, Init init,
                                            const SlabAllocator* allocator) {
  if (static_cast<int64_t>(num_blocks.size()) != spec.num_groups()) {
    return Status::invalid_argument("host KV storage: {} block counts for {} cache groups",
                                    num_blocks.size(), spec.num_groups());
  }
  std::vector<KvLayout> layouts;
  std::vector<Slab> slabs;
  for (int32_t g = 0; g < spec.num_groups(); ++g) {
    if (num_blocks[g] < 0) {
      return Status::invalid_argument("host KV storage: group {}: negative block count {}", g,
                                      num_blocks[g]);
    }
    // Refuse sizes the layout's int64 element arithmetic or any host could not hold.
    const unsigned __int128 wanted =
        static_cast<unsigned __int128>(spec.block_bytes(g)) * static_cast<uint32_t>(num_blocks[g]);
    if (wanted > kMaxSlabBytes) {
      return Status::resource_exhausted(
          "host KV storage: group {}: {} blocks of {} bytes exceed the {} bytes a slab may hold", g,
          num_blocks[g], spec.block_bytes(g), kMaxSlabBytes);
    }
    const KvLayout layout = spec.group_layout(g, num_blocks[g]);
    const size_t bytes = layout.size_bytes();
    void* p = nullptr;
    FreeSlab deleter;
    if (allocator != nullptr) {
      p = allocator->allocate(bytes == 0 ? kAlignment : bytes, allocator->context);
      deleter.allocator = *allocator;
    } else {
      // aligned_alloc wants a multiple of the alignment; never zero bytes.
      const size_t alignment = bytes >= kHugePageBytes ? kHugePageBytes : kAlignment;
      const size_t rounded = (bytes + alignment - 1) / alignment * alignment;
      p = std::aligned_alloc(alignment, rounded == 0 ? alignment : rounded);
      if (p != nullptr && alignment == kHugePageBytes) {
        madvise(p, rounded, MADV_HUGEPAGE);  // advice; may be off
      }
    }
    if (p == nullptr) {
      return Status::resource_exhausted("host KV storage: group {}: cannot allocate {} bytes", g,
                                        bytes);
    }
    if (init == Init::kZeroed) std::memset(p, 0, bytes);
    layouts.push_back(layout);
    slabs.emplace_back(static_cast<std::byte*>(p), deleter);
  }
  return HostKvStorage(spec, std::move(layouts), std::move(slabs));
}

const KvLayout& HostKvStorage::layout(int32_t group) const {
  KVP_CHECK(group >= 0 && group < num_groups(), "group {} of {}", group, num_groups());
  return layouts_[group];
}

std::span<std::byte> HostKvStorage::slab(int32_t group) {
  return {slabs_[group].get(), layout(group).size_bytes()};
}

std::span<const std::byte> HostKvStorage::slab(int32_t group) const {
  return {slabs_[group].get(), layout(group).size_bytes()};
}

std::byte* HostKvStorage::head_block_ptr(int32_t group, int32_t layer_in_group, BlockId block,
                                         int32_t kv, int32_t head) const {
  const KvLayout& l = layout(group);
  KVP_CHECK(layer_in_group >= 0 && layer_in_group < l.num_layers, "layer {} of {}", layer_in_group,
            l.num_layers);
  KVP_CHECK(block.value >= 0 && block.value < l.num_blocks, "block {} of {}", block.value,
            l.num_blocks);
  KVP_CHECK(kv == 0 || kv == 1, "kv {}", kv);
  KVP_CHECK(head >= 0 && head < l.num_kv_heads, "head {} of {}", head, l.num_kv_heads);
  const int64_t offset = l.elem_offset(layer_in_group, block.value, kv, head, 0);
  return slabs_[group].get() + static_cast<size_t>(offset) * dtype_size_bytes(l.dtype);
}

void HostKvStorage::copy_blocks(int32_t group, std::span<const BlockCopy> ops) {
  const KvLayout& l = layout(group);
  const size_t elem_bytes = dtype_size_bytes(l.dtype);
  // K and V of one block in one layer are adjacent: one run of block_pitch elements.
  const size_t run_bytes = static_cast<size_t>(l.block_pitch()) * elem_bytes;
  std::byte* base = slabs_[group].get();
  for (const BlockCopy& op : ops) {
    KVP_CHECK(op.src.value >= 0 && op.src.value < l.num_blocks, "copy from block {} of {}",
              op.src.value, l.num_blocks);
    KVP_CHECK(op.dst.value >= 0 && op.dst.value < l.num_blocks, "copy to block {} of {}",
              op.dst.value, l.num_blocks);
    if (op.src == op.dst) continue;
    for (int32_t layer = 0; layer < l.num_layers; ++layer) {
      const size_t src = static_cast<size_t>(l.block_offset(layer, op.src.value, 0)) * elem_bytes;
      const size_t dst = static_cast<size_t>(l.block_offset(layer, op.dst.value, 0)) * elem_bytes;
      std::memcpy(base + dst, base + src, run_bytes);
    }
  }
}

size_t HostKvStorage::dense_bytes(int64_t num_tokens) const {
  return static_cast<size_t>(num_tokens) * spec_.num_kv_heads() *
         kv_vector_bytes(spec_.dtype(), spec_.head_dim());
}

void HostKvStorage::check_table(int32_t group, std::span<const BlockId> block_table,
                                int64_t token_begin, int64_t token_end) const {
  const KvLayout& l = layout(group);
  KVP_CHECK(0 <= token_begin && token_begin <= token_end, "token range [{}, {})", token_begin,
            token_end);
  if (token_begin == token_end) return;
  const int64_t last_entry = (token_end - 1) / l.block_size;
  KVP_CHECK(last_entry < static_cast<int64_t>(block_table.size()),
            "block table of {} entries for tokens up to {}", block_table.size(), token_end);
  for (int64_t i = token_begin / l.block_size; i <= last_entry; ++i) {
    KVP_CHECK(block_table[i].value >= 0 && block_table[i].value < l.num_blocks,
              "block table entry {}: block {} of {}", i, block_table[i].value, l.num_blocks);
  }
}

// One token's head vectors are head_dim elements at (block, head, slot) (8-bit: and the scale at
// scale_offset); a dense row is [num_kv_heads] dense head vectors (cache/kv_quant.h). Gather and
// scatter move one head vector at a time.
void HostKvStorage::gather_layer(int32_t layer, std::span<const BlockId> block_table,
                                 int64_t token_begin, int64_t token_end, std::span<std::byte> k_out,
                                 std::span<std::byte> v_out) const {
  const int32_t group = spec_.group_of_layer(layer);
  const int32_t layer_in_group = spec_.index_in_group(layer);
  check_table(group, block_table, token_begin, token_end);
  const size_t bytes = dense_bytes(token_end - token_begin);
  KVP_CHECK(k_out.size() == bytes && v_out.size() == bytes, "dense K/V of {} and {} bytes, need {}",
            k_out.size(), v_out.size(), bytes);
  const KvLayout& l = layouts_[group];
  const size_t elem_bytes = dtype_size_bytes(l.dtype);
  const size_t row_bytes = static_cast<size_t>(l.head_dim) * elem_bytes;
  const size_t vec_bytes = kv_vector_bytes(l.dtype, l.head_dim);
  const bool scaled = is_kv8(l.dtype);
  const std::byte* base = slabs_[group].get();
  std::span<std::byte> outs[2] = {k_out, v_out};
  size_t row = 0;
  for (int64_t t = token_begin; t < token_end; ++t, ++row) {
    const int32_t block = block_table[t / l.block_size].value;
    const int32_t slot = static_cast<int32_t>(t % l.block_size);
    for (int32_t kv = 0; kv < 2; ++kv) {
      for (int32_t h = 0; h < l.num_kv_heads; ++h) {
        const size_t src = static_cast<size_t>(l.elem_offset(layer_in_group, block, kv, h, slot));
        std::byte* out = outs[kv].data() + (row * l.num_kv_heads + h) * vec_bytes;
        std::memcpy(out, base + src * elem_bytes, row_bytes);
        if (scaled) {
          std::memcpy(out + row_bytes, base + l.scale_offset(layer_in_group, block, kv, h, slot),
                      sizeof(F16));
        }
      }
    }
  }
}

void HostKvStorage::scatter_layer(int32_t layer, std::span<const BlockId> block_table,
                                  int64_t token_begin, int64_t token_end,
                                  std::span<const std::byte> k_in,
                                  std::span<const std::byte> v_in) {
  const int32_t group = spec_.group_of_layer(layer);
  const int32_t layer_in_group = spec_.index_in_group(layer);
  check_table(group, block_table, token_begin, token_end);
  const size_t bytes = dense_bytes(token_end - token_begin);
  KVP_CHECK(k_in.size() == bytes && v_in.size() == bytes, "dense K/V of {} and {} bytes, need {}",
            k_in.size(), v_in.size(), bytes);
  const KvLayout& l = layouts_[group];
  const size_t elem_bytes = dtype_size_bytes(l.dtype);
  const size_t row_bytes = static_cast<size_t>(l.head_dim) * elem_bytes;
  const size_t vec_bytes = kv_vector_bytes(l.dtype, l.head_dim);
  const bool scaled = is_kv8(l.dtype);
  std::byte* base = slabs_[group].get();
  std::span<const std::byte> ins[2] = {k_in, v_in};
  size_t row = 0;
  for (int64_t t = token_begin; t < token_end; ++t, ++row) {
    const int32_t block = block_table[t / l.block_size].value;
    const int32_t slot = static_cast<int32_t>(t % l.block_size);
    for (int32_t kv = 0; kv < 2; ++kv) {
      for (int32_t h = 0; h < l.num_kv_heads; ++h) {
        const size_t dst = static_cast<size_t>(l.elem_offset(layer_in_group, block, kv, h, slot));
        const std::byte* in = ins[kv].data() + (row * l.num_kv_heads + h) * vec_bytes;
        std::memcpy(base + dst * elem_bytes, in, row_bytes);
        if (scaled) {
          std::memcpy(base + l.scale_offset(layer_in_group, block, kv, h, slot), in + row_bytes,
                      sizeof(F16));
        }
      }
    }
  }
}

}  // namespace kvp
