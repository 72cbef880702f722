// CPU paged attention: work planning, query/output conversion and the exact merge of split
// softmax states around the Highway kernel (cpu_attention_kernel.cc); the scalar baseline;
// KV write and block copy.
#include "backend/cpu_attention.h"

#include <hwy/aligned_allocator.h>

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstring>
#include <limits>
#include <vector>

#include "backend/cpu_attention_kernel.h"
#include "cache/kv_quant.h"

namespace kvp::cpu {
namespace {

constexpr float kNegInf = -std::numeric_limits<float>::infinity();
// Automatic splits never cut a key range finer than this: a smaller item costs more to merge
// than it gains in balance.
constexpr int32_t kMinSplitKeys = 256;
// Tiles with at most this many query rows per KV head software-prefetch their KV.
constexpr int32_t kMaxPrefetchRows = 8;

Status check_pointers(const AttentionBatch& batch, const PagedKv& kv, const void* q,
                      const void* out) {
  if (batch.num_tokens > 0 && (q == nullptr || out == nullptr)) {
    return Status::invalid_argument("attention: q or out is null for {} tokens", batch.num_tokens);
  }
  if (batch.num_tokens > 0 && (kv.k == nullptr || kv.v == nullptr)) {
    return Status::invalid_argument("attention: KV pointer is null");
  }
  return Status::ok();
}

// One (sequence, query tile) with all its KV heads: its rows and the keys they can see.
struct Tile {
  int32_t seq = 0;
  int32_t first_token = 0;  // batch row of the tile's first query token
  int32_t num_tokens = 0;
  int32_t first_pos = 0;  // position of that token
  int32_t kv_lo = 0;      // keys [kv_lo, kv_hi) are visible to some row of the tile
  int32_t kv_hi = 0;
  int32_t first_item = 0;  // its work items are [first_item, first_item + num_splits)
  int32_t num_splits = 0;
};

// A 64-byte aligned float buffer that only grows.
class Workspace {
 public:
  float* floats(size_t count) {
    if (count > capacity_) {
      buffer_ = hwy::AllocateAligned<float>(count);
      KVP_CHECK(buffer_ != nullptr, "attention workspace of {} floats", count);
      capacity_ = count;
    }
    return buffer_.get();
  }

 private:
  hwy::AlignedFreeUniquePtr<float[]> buffer_;
  size_t capacity_ = 0;
};

struct Item {
  int32_t tile = 0;
  int32_t kv_begin = 0;
  int32_t kv_end = 0;
};

}  // namespace

Status paged_attention(const AttentionParams& params, const AttentionBatch& batch,
                       const PagedKv& kv, const void* q, DType q_dtype, void* out, ThreadPool* pool,
                       const AttentionTuning& tuning) {
  KVP_RETURN_IF_ERROR(check_attention_args(params, batch, kv));
  KVP_RETURN_IF_ERROR(check_pointers(batch, kv, q, out));
  const int32_t head_dim = kv.head_dim;
  const int32_t num_heads = kv.num_kv_heads;
  const int32_t group = params.num_q_heads / num_heads;
  const int32_t tokens_per_tile = std::max(1, tuning.tile_rows / group);
  const int32_t max_rows = tokens_per_tile * group;  // per KV head
  const int num_threads = pool == nullptr ? 1 : pool->num_threads();

  std::vector<Tile> tiles;
  int64_t total_keys = 0;  // sum of visible key ranges over tiles: the work to balance
  for (int32_t s = 0; s < batch.num_seqs; ++s) {
    const int32_t q_begin = batch.query_start[s];
    const int32_t q_len = batch.query_start[s + 1] - q_begin;
    const int32_t kv_len = batch.kv_lens[s];
    for (int32_t t0 = 0; t0 < q_len; t0 += tokens_per_tile) {
      Tile tile;
      tile.seq = s;
      tile.first_token = q_begin + t0;
      tile.num_tokens = std::min(tokens_per_tile, q_len - t0);
      tile.first_pos = kv_len - q_len + t0;
      tile.kv_hi = tile.first_pos + tile.num_tokens;
      tile.kv_lo = params.window > 0 ? std::max(0, tile.first_pos - params.window + 1) : 0;
      tiles.push_back(tile);
      total_keys += tile.kv_hi - tile.kv_lo;
    }
  }
  if (tiles.empty()) return Status::ok();

  int64_t split_keys = tuning.split_keys;
  if (split_keys <= 0) {
    split_keys = std::numeric_limits<int32_t>::max();
    if (num_threads > 1 && static_cast<int64_t>(tiles.size()) < 4 * num_threads) {
      // Aim at 4 items per thread so uneven ranges still balance.
      const int64_t per_item = (total_keys + 4 * num_threads - 1) / (4 * num_threads);
      split_keys =
          std::max<int64_t>(kMinSplitKeys, (per_item + kChunkKeys - 1) / kChunkKeys * kChunkKeys);
    }
  }
  // Item state: o [num_heads][max_rows][head_dim], m and l [num_heads][max_rows].
  const int64_t state_floats = int64_t{num_heads} * max_rows * (head_dim + 2);
  std::vector<Item> items;
  std::vector<int64_t> partial_offset;  // per item: its state in `partials`, or -1 (unsplit)
  int64_t num_partial_floats = 0;
  for (int32_t i = 0; i < static_cast<int32_t>(tiles.size()); ++i) {
    Tile& tile = tiles[size_t(i)];
    const int64_t range = tile.kv_hi - tile.kv_lo;
    tile.num_splits = static_cast<int32_t>((range + split_keys - 1) / split_keys);
    tile.first_item = static_cast<int32_t>(items.size());
    for (int32_t k = 0; k < tile.num_splits; ++k) {
      const int64_t begin = tile.kv_lo + k * split_keys;
      items.push_back({i, static_cast<int32_t>(begin),
                       static_cast<int32_t>(std::min<int64_t>(tile.kv_hi, begin + split_keys))});
      partial_offset.push_back(tile.num_splits > 1 ? num_partial_floats : -1);
      if (tile.num_splits > 1) num_partial_floats += state_floats;
    }
  }

  // Per-thread scratch, each section 64-byte aligned (the kernel's scratch must be): the q tile,
  // the state of an unsplit item, the kernel's scratch.
  auto align16 = [](int64_t floats) { return (floats + 15) / 16 * 16; };
  const int64_t q_floats = align16(int64_t{num_heads} * max_rows * head_dim);
  const int64_t thread_floats = q_floats + align16(state_floats) +
                                align16(tile_scratch_floats(num_heads, max_rows, head_dim));
  // Kept per calling thread between calls and only grown: a fresh allocation of this size is an
  // mmap, and its page faults cost more than a short decode call.
  thread_local Workspace workspace;
  float* thread_scratch = workspace.floats(static_cast<size_t>(thread_floats * num_threads));
  // Pointers, not the thread_local objects, go into the lambdas: those run on pool threads.
  thread_local Workspace partial_workspace;
  float* partials = partial_workspace.floats(static_cast<size_t>(num_partial_floats));

  const float scale = params.scale;
  const int32_t num_q_heads = params.num_q_heads;
  // Element offset in q / out of the head vector of (KV head h, tile row r).
  auto head_offset = [&](const Tile& tile, int32_t h, int32_t row) {
    const int64_t token = tile.first_token + row / group;
    return (token * num_q_heads + int64_t{h} * group + row % group) * head_dim;
  };

  auto run_item = [&](int64_t item_index, int thread) {
    const Item& item = items[size_t(item_index)];
    const Tile& tile = tiles[size_t(item.tile)];
    const int32_t num_rows = tile.num_tokens * group;
    float* base = thread_scratch + thread * thread_floats;
    float* q_tile = base;  // [num_heads][num_rows][head_dim], scaled
    const int64_t partial = partial_offset[size_t(item_index)];
    float* o = partial >= 0 ? partials + partial : base + q_floats;  // [heads][rows][dim]
    float* m = o + int64_t{num_heads} * num_rows * head_dim;         // [heads][rows]
    float* l = m + int64_t{num_heads} * num_rows;                    // [heads][rows]

    for (int32_t h = 0; h < num_heads; ++h) {
      for (int32_t r = 0; r < num_rows; ++r) {
        const int64_t src = head_offset(tile, h, r);
        float* dst = q_tile + (int64_t{h} * num_rows + r) * head_dim;
        if (q_dtype == DType::F32) {
          const float* q_row = static_cast<const float*>(q) + src;
          for (int32_t d = 0; d < head_dim; ++d) dst[d] = q_row[d] * scale;
        } else {
          for (int32_t d = 0; d < head_dim; ++d) {
            dst[d] = load_as_f32(q, q_dtype, size_t(src + d)) * scale;
          }
        }
      }
    }
    const int64_t all_rows = int64_t{num_heads} * num_rows;
    std::fill(o, o + all_rows * head_dim, 0.0f);
    std::fill(m, m + all_rows, kNegInf);
    std::fill(l, l + all_rows, 0.0f);

    TileTask task;
    task.kv = &kv;
    task.block_table = batch.block_tables + int64_t{tile.seq} * batch.max_blocks_per_seq;
    task.kv_head = 0;
    task.num_heads = num_heads;
    task.head_dim = head_dim;
    task.num_rows = num_rows;
    task.rows_per_token = group;
    task.first_pos = tile.first_pos;
    task.kv_begin = item.kv_begin;
    task.kv_end = item.kv_end;
    task.window = params.window;
    task.soft_cap = params.soft_cap;
    // Prefetch pays where the tile streams KV (few rows per head: decode); a prefill tile
    // re-reads KV that earlier tiles left in cache, and prefetch only costs it issue slots.
    task.prefetch = tuning.prefetch && num_rows <= kMaxPrefetchRows;
    task.pair_bf16 = tuning.pair_bf16;
    task.q = q_tile;
    task.o = o;
    task.m = m;
    task.l = l;
    task.scratch = base + q_floats + align16(state_floats);
    attend_tile(task);

    if (partial >= 0) return;  // merged below
    for (int32_t h = 0; h < num_heads; ++h) {
      for (int32_t r = 0; r < num_rows; ++r) {
        const int64_t row = int64_t{h} * num_rows + r;
        KVP_DCHECK(l[row] > 0.0f, "row {} of a tile saw no key", row);
        const float inv =
            softmax_output_factor(m[row], l[row], params.sinks, h * group + r % group);
        const float* o_row = o + row * head_dim;
        const int64_t dst = head_offset(tile, h, r);
        if (q_dtype == DType::F32) {
          float* out_row = static_cast<float*>(out) + dst;
          for (int32_t d = 0; d < head_dim; ++d) out_row[d] = o_row[d] * inv;
        } else {
          for (int32_t d = 0; d < head_dim; ++d) {
            store_from_f32(out, q_dtype, size_t(dst + d), o_row[d] * inv);
          }
        }
      }
    }
  };
  parallel_for(pool, static_cast<int64_t>(items.size()), run_item);

  if (num_partial_floats == 0) return Status::ok();
  // Merge split states exactly: M = max m_k, L = sum l_k e^(m_k - M), out = sum o_k e^(m_k - M) /
  // L.
  std::vector<int32_t> split_tiles;
  for (int32_t i = 0; i < static_cast<int32_t>(tiles.size()); ++i) {
    if (tiles[size_t(i)].num_splits > 1) split_tiles.push_back(i);
  }
  auto merge_tile = [&](int64_t index, int thread) {
    const Tile& tile = tiles[size_t(split_tiles[size_t(index)])];
    const int32_t num_rows = tile.num_tokens * group;
    const int64_t all_rows = int64_t{num_heads} * num_rows;
    float* acc = thread_scratch + thread * thread_floats;  // [head_dim]
    // Split k's state: o at state(k), m after all_rows * head_dim floats, l after all_rows more.
    auto state = [&](int32_t k) { return partials + partial_offset[size_t(tile.first_item + k)]; };
    for (int32_t h = 0; h < num_heads; ++h) {
      for (int32_t r = 0; r < num_rows; ++r) {
        const int64_t row = int64_t{h} * num_rows + r;
        float m_max = kNegInf;
        for (int32_t k = 0; k < tile.num_splits; ++k) {
          m_max = std::max(m_max, state(k)[all_rows * head_dim + row]);
        }
        std::fill(acc, acc + head_dim, 0.0f);
        float l_sum = 0.0f;
        for (int32_t k = 0; k < tile.num_splits; ++k) {
          const float* st = state(k);
          const float m_k = st[all_rows * head_dim + row];
          if (m_k == kNegInf) continue;  // this split's keys are all masked for the row
          const float w = std::exp(m_k - m_max);
          l_sum += w * st[all_rows * head_dim + all_rows + row];
          const float* o_k = st + row * head_dim;
          for (int32_t d = 0; d < head_dim; ++d) acc[d] += w * o_k[d];
        }
        KVP_DCHECK(l_sum > 0.0f, "row {} of a split tile saw no key", row);
        const float inv = softmax_output_factor(m_max, l_sum, params.sinks, h * group + r % group);
        const int64_t dst = head_offset(tile, h, r);
        for (int32_t d = 0; d < head_dim; ++d) {
          store_from_f32(out, q_dtype, size_t(dst + d), acc[d] * inv);
        }
      }
    }
  };
  parallel_for(pool, static_cast<int64_t>(split_tiles.size()), merge_tile);
  return Status::ok();
}

Status paged_attention_scalar(const AttentionParams& params, const AttentionBatch& batch,
                              const PagedKv& kv, const void* q, DType q_dtype, void* out,
                              ThreadPool* pool) {
  KVP_RETURN_IF_ERROR(check_attention_args(params, batch, kv));
  KVP_RETURN_IF_ERROR(check_pointers(batch, kv, q, out));
  const int32_t head_dim = kv.head_dim;
  const int32_t group = params.num_q_heads / kv.num_kv_heads;
  const int num_threads = pool == nullptr ? 1 : pool->num_threads();
  std::vector<float> scratch(static_cast<size_t>(num_threads) * 2 * head_dim);
  auto run = [&](int64_t index, int thread) {  // index = seq * num_q_heads + head
    const int32_t s = static_cast<int32_t>(index / params.num_q_heads);
    const int32_t h = static_cast<int32_t>(index % params.num_q_heads);
    const int32_t q_begin = batch.query_start[s];
    const int32_t q_len = batch.query_start[s + 1] - q_begin;
    const int32_t kv_len = batch.kv_lens[s];
    const int32_t* table = batch.block_tables + int64_t{s} * batch.max_blocks_per_seq;
    float* q_row = scratch.data() + size_t(thread) * 2 * head_dim;  // [head_dim]
    float* acc = q_row + head_dim;                                  // [head_dim]
    for (int32_t t = 0; t < q_len; ++t) {
      const int64_t row = (int64_t{q_begin} + t) * params.num_q_heads + h;
      for (int32_t d = 0; d < head_dim; ++d) q_row[d] = load_as_f32(q, q_dtype, row * head_dim + d);
      const int32_t pos = kv_len - q_len + t;
      const int32_t first = params.window > 0 ? std::max(0, pos - params.window + 1) : 0;
      float m = kNegInf, l = 0.0f;
      std::fill(acc, acc + head_dim, 0.0f);
      for (int32_t j = first; j <= pos; ++j) {
        const int64_t block = table[j / kv.block_size];
        const int32_t token = j % kv.block_size;
        const int64_t base = kv.row_offset(block, h / group, token);
        const float k_scale = kv_row_scale(kv, kv.k, block, h / group, token);
        const float v_scale = kv_row_scale(kv, kv.v, block, h / group, token);
        float dot = 0.0f;
        for (int32_t d = 0; d < head_dim; ++d) dot += q_row[d] * kv_element(kv, kv.k, base + d);
        float logit = dot * k_scale * params.scale;
        if (params.soft_cap > 0.0f) logit = params.soft_cap * std::tanh(logit / params.soft_cap);
        const float m_new = std::max(m, logit);
        const float alpha = std::exp(m - m_new);
        const float p = std::exp(logit - m_new);
        l = l * alpha + p;
        for (int32_t d = 0; d < head_dim; ++d) {
          acc[d] = acc[d] * alpha + p * v_scale * kv_element(kv, kv.v, base + d);
        }
        m = m_new;
      }
      const float inv = softmax_output_factor(m, l, params.sinks, h);
      for (int32_t d = 0; d < head_dim; ++d)
        store_from_f32(out, q_dtype, row * head_dim + d, acc[d] * inv);
    }
  };
  parallel_for(pool, int64_t{batch.num_seqs} * params.num_q_heads, run);
  return Status::ok();
}

Status write_kv(const KvWrite& write, const PagedKv& kv) {
  KVP_RETURN_IF_ERROR(check_kv_write_args(write, kv));
  if (write.num_tokens > 0 && (kv.k == nullptr || kv.v == nullptr)) {
    return Status::invalid_argument("kv write: KV pointer is null");
  }
  const bool quantise = is_kv8(kv.dtype);  // f32 rows in, 8-bit rows and scales out
  const size_t in_bytes = quantise ? sizeof(float) : dtype_size_bytes(kv.dtype);
  const size_t elem_bytes = dtype_size_bytes(kv.dtype);
  const size_t row_bytes = size_t(kv.head_dim) * elem_bytes;
  for (int32_t i = 0; i < write.num_tokens; ++i) {
    const int64_t slot = write.slot_mapping[i];
    if (slot < 0) continue;  // padding
    const int64_t block = slot / kv.block_size;
    const auto token = static_cast<int32_t>(slot % kv.block_size);
    for (int32_t h = 0; h < kv.num_kv_heads; ++h) {
      const int64_t src = (int64_t{i} * kv.num_kv_heads + h) * kv.head_dim;
      const int64_t dst = kv.row_offset(block, h, token);
      const void* ins[2] = {write.k, write.v};
      void* outs[2] = {kv.k, kv.v};
      for (int32_t which = 0; which < 2; ++which) {
        const auto* in = static_cast<const std::byte*>(ins[which]) + size_t(src) * in_bytes;
        auto* out = static_cast<std::byte*>(outs[which]);
        if (quantise) {
          F16 scale;
          quantize_kv8(kv.dtype, reinterpret_cast<const float*>(in), kv.head_dim,
                       reinterpret_cast<uint8_t*>(out + dst), &scale);
          std::memcpy(out + kv.scale_offset(block, h, token), &scale, sizeof scale);
        } else {
          std::memcpy(out + size_t(dst) * elem_bytes, in, row_bytes);
        }
      }
    }
  }
  return Status::ok();
}

Status copy_blocks(const KvLayout& layout, void* slab, std::span<const BlockCopy> copies) {
  if (layout.num_layers <= 0 || layout.num_blocks <= 0 || layout.num_kv_heads <= 0 ||
      layout.block_size <= 0 || layout.head_dim <= 0) {
    return Status::invalid_argument(
        "copy blocks: layout must be positive (layers {}, blocks {}, kv heads {}, block size {}, "
        "head dim {})",
        layout.num_layers, layout.num_blocks, layout.num_kv_heads, layout.block_size,
        layout.head_dim);
  }
  if (!copies.empty() && slab == nullptr) {
    return Status::invalid_argument("copy blocks: slab is null");
  }
  for (size_t i = 0; i < copies.size(); ++i) {
    for (const BlockId id : {copies[i].src, copies[i].dst}) {
      if (id.value < 0 || id.value >= layout.num_blocks) {
        return Status::invalid_argument(
            "copy blocks: copy {} names block {}, outside the pool of {}", i, id.value,
            layout.num_blocks);
      }
    }
  }
  const size_t elem_bytes = dtype_size_bytes(layout.dtype);
  const size_t block_bytes = size_t(layout.block_pitch()) * elem_bytes;  // one layer's K and V
  auto* base = static_cast<std::byte*>(slab);
  for (const BlockCopy& copy : copies) {
    if (copy.src == copy.dst) continue;
    for (int32_t layer = 0; layer < layout.num_layers; ++layer) {
      std::memcpy(base + size_t(layout.block_offset(layer, copy.dst.value, 0)) * elem_bytes,
                  base + size_t(layout.block_offset(layer, copy.src.value, 0)) * elem_bytes,
                  block_bytes);
    }
  }
  return Status::ok();
}

const char* kernel_target() { return attend_tile_target(); }

}  // namespace kvp::cpu
