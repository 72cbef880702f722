// Highway implementation of attend_tile (cpu_attention_kernel.h), compiled once per x86 target
// (SSE4, AVX2, AVX-512, ...) through foreach_target and picked at run time by
// HWY_DYNAMIC_DISPATCH, so one binary runs at full width on AVX2 and AVX-512 machines.
//
// Per chunk of kChunkKeys keys:
//   1. K rows of the chunk, as f32 (bf16/f16 are widened once into scratch; f32 is read in place)
//   2. S[r][t] = q_r · k_t for every active row: 2 rows x 4 keys per pass, so each K vector
//      loaded serves two rows and each q vector four keys
//   3. soft cap, causal/window mask, online softmax update of (m, l) and rescale of o
//   4. V rows as f32, then o_r += sum_t P[r][t] v_t: 2 rows x 4 vectors of head_dim per pass
// Everything accumulates in f32.

#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "backend/cpu_attention_kernel.cc"
#include <hwy/foreach_target.h>  // IWYU pragma: keep
// foreach_target must come first: it re-includes this file once per target.
#include <hwy/contrib/math/math-inl.h>
#include <hwy/highway.h>

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <limits>

#include "backend/cpu_attention_kernel.h"

HWY_BEFORE_NAMESPACE();
namespace kvp::cpu::HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;
using DF = hn::ScalableTag<float>;
using VF = hn::Vec<DF>;

constexpr float kNegInf = -std::numeric_limits<float>::infinity();

// dst[0..count) = src[0..count) widened to f32. src: one K or V row of dtype t.
HWY_INLINE void widen_row(DF df, const void* src, DType t, int32_t count, float* HWY_RESTRICT dst) {
  const int32_t lanes = static_cast<int32_t>(hn::Lanes(df));
  int32_t i = 0;
  if (t == DType::BF16) {
    const hn::Rebind<hwy::bfloat16_t, DF> dbf;
    const auto* p = static_cast<const hwy::bfloat16_t*>(src);
    for (; i + lanes <= count; i += lanes)
      hn::StoreU(hn::PromoteTo(df, hn::LoadU(dbf, p + i)), df, dst + i);
  } else {
    const hn::Rebind<hwy::float16_t, DF> dh;
    const auto* p = static_cast<const hwy::float16_t*>(src);
    for (; i + lanes <= count; i += lanes)
      hn::StoreU(hn::PromoteTo(df, hn::LoadU(dh, p + i)), df, dst + i);
  }
  for (; i < count; ++i) dst[i] = load_as_f32(src, t, static_cast<size_t>(i));
}

// s[r * s_stride + t] = q[r] · k[t] for r < kRows, t < kKeys. q, k: rows of head_dim floats.
template <int kRows, int kKeys>
HWY_INLINE void dot_rows_keys(DF df, const float* const* q, const float* const* k, int32_t head_dim,
                              float* HWY_RESTRICT s, int32_t s_stride) {
  const int32_t lanes = static_cast<int32_t>(hn::Lanes(df));
  VF acc[kRows][kKeys];
  for (int r = 0; r < kRows; ++r) {
    for (int t = 0; t < kKeys; ++t) acc[r][t] = hn::Zero(df);
  }
  int32_t d = 0;
  for (; d + lanes <= head_dim; d += lanes) {
    VF kv[kKeys];
    for (int t = 0; t < kKeys; ++t) kv[t] = hn::LoadU(df, k[t] + d);
    for (int r = 0; r < kRows; ++r) {
      const VF qv = hn::LoadU(df, q[r] + d);
      for (int t = 0; t < kKeys; ++t) acc[r][t] = hn::MulAdd(qv, kv[t], acc[r][t]);
    }
  }
  for (int r = 0; r < kRows; ++r) {
    for (int t = 0; t < kKeys; ++t) {
      float sum = hn::GetLane(hn::SumOfLanes(df, acc[r][t]));
      for (int32_t e = d; e < head_dim; ++e) sum += q[r][e] * k[t][e];
      s[r * s_stride + t] = sum;
    }
  }
}

// o[r][:] += sum_{t < num_keys} p[r][t] * v[t][:] for r < kRows.
template <int kRows>
HWY_INLINE void accumulate_pv(DF df, float* const* o, const float* const* p, const float* const* v,
                              int32_t num_keys, int32_t head_dim) {
  const int32_t lanes = static_cast<int32_t>(hn::Lanes(df));
  int32_t d = 0;
  for (; d + 4 * lanes <= head_dim; d += 4 * lanes) {
    VF acc[kRows][4];
    for (int r = 0; r < kRows; ++r) {
      for (int c = 0; c < 4; ++c) acc[r][c] = hn::LoadU(df, o[r] + d + c * lanes);
    }
    for (int32_t t = 0; t < num_keys; ++t) {
      VF pt[kRows];
      for (int r = 0; r < kRows; ++r) pt[r] = hn::Set(df, p[r][t]);
      for (int c = 0; c < 4; ++c) {
        const VF vv = hn::LoadU(df, v[t] + d + c * lanes);
        for (int r = 0; r < kRows; ++r) acc[r][c] = hn::MulAdd(pt[r], vv, acc[r][c]);
      }
    }
    for (int r = 0; r < kRows; ++r) {
      for (int c = 0; c < 4; ++c) hn::StoreU(acc[r][c], df, o[r] + d + c * lanes);
    }
  }
  for (; d + lanes <= head_dim; d += lanes) {
    VF acc[kRows];
    for (int r = 0; r < kRows; ++r) acc[r] = hn::LoadU(df, o[r] + d);
    for (int32_t t = 0; t < num_keys; ++t) {
      const VF vv = hn::LoadU(df, v[t] + d);
      for (int r = 0; r < kRows; ++r) acc[r] = hn::MulAdd(hn::Set(df, p[r][t]), vv, acc[r]);
    }
    for (int r = 0; r < kRows; ++r) hn::StoreU(acc[r], df, o[r] + d);
  }
  for (; d < head_dim; ++d) {
    for (int r = 0; r < kRows; ++r) {
      float acc = o[r][d];
      for (int32_t t = 0; t < num_keys; ++t) acc += p[r][t] * v[t][d];
      o[r][d] = acc;
    }
  }
}

// Row pointers of keys [j0, j0 + num_keys) of one KV head, for K (kv_base = kv.k) or V.
// Widened into buf ([kChunkKeys][head_dim] f32) unless the pool is f32.
HWY_INLINE void gather_rows(DF df, const TileTask& task, const void* kv_base, int32_t j0,
                            int32_t num_keys, float* HWY_RESTRICT buf, const float** rows) {
  const PagedKv& kv = *task.kv;
  const size_t elem_bytes = dtype_size_bytes(kv.dtype);
  const auto* base = static_cast<const std::byte*>(kv_base);
  const int64_t head_offset = int64_t{task.kv_head} * kv.block_size;
  for (int32_t t = 0; t < num_keys; ++t) {
    const int32_t j = j0 + t;
    const int64_t block = task.block_table[j / kv.block_size];
    const int64_t elem =
        block * kv.block_pitch + (head_offset + j % kv.block_size) * int64_t{task.head_dim};
    const void* src = base + static_cast<size_t>(elem) * elem_bytes;
    if (kv.dtype == DType::F32) {
      rows[t] = static_cast<const float*>(src);
    } else {
      float* dst = buf + int64_t{t} * task.head_dim;
      widen_row(df, src, kv.dtype, task.head_dim, dst);
      rows[t] = dst;
    }
  }
}

void attend_tile(const TileTask& task) {
  const DF df;
  const int32_t lanes = static_cast<int32_t>(hn::Lanes(df));
  const int32_t head_dim = task.head_dim;
  const int32_t group = task.rows_per_token;
  const int32_t num_tokens = task.num_rows / group;
  float* k_buf = task.scratch;                            // [kChunkKeys][head_dim]
  float* v_buf = k_buf + int64_t{kChunkKeys} * head_dim;  // [kChunkKeys][head_dim]
  float* s = v_buf + int64_t{kChunkKeys} * head_dim;      // [num_rows][kChunkKeys]
  const float* k_rows[kChunkKeys];
  const float* v_rows[kChunkKeys];

  for (int32_t j0 = task.kv_begin; j0 < task.kv_end; j0 += kChunkKeys) {
    const int32_t num_keys = std::min(kChunkKeys, task.kv_end - j0);
    const int32_t j_last = j0 + num_keys - 1;
    // Tokens at positions p see keys [p - window + 1, p]; keep those that see any of
    // [j0, j_last]: p >= j0 and (no window or p - window + 1 <= j_last).
    int32_t tok_begin = std::max(0, j0 - task.first_pos);
    int32_t tok_end = num_tokens;
    if (task.window > 0) {
      const int64_t last_pos = int64_t{j_last} + task.window - 1;
      tok_end = static_cast<int32_t>(
          std::min<int64_t>(num_tokens, std::max<int64_t>(0, last_pos - task.first_pos + 1)));
    }
    if (tok_begin >= tok_end) continue;
    const int32_t row_begin = tok_begin * group;
    const int32_t row_end = tok_end * group;

    gather_rows(df, task, task.kv->k, j0, num_keys, k_buf, k_rows);

    // 2. logits
    for (int32_t r = row_begin; r < row_end; r += 2) {
      const bool pair = r + 1 < row_end;
      const float* q2[2] = {task.q + int64_t{r} * head_dim,
                            task.q + int64_t{pair ? r + 1 : r} * head_dim};
      float* s_row = s + int64_t{r} * kChunkKeys;
      int32_t t = 0;
      if (pair) {
        for (; t + 4 <= num_keys; t += 4) {
          dot_rows_keys<2, 4>(df, q2, k_rows + t, head_dim, s_row + t, kChunkKeys);
        }
        for (; t < num_keys; ++t) {
          dot_rows_keys<2, 1>(df, q2, k_rows + t, head_dim, s_row + t, kChunkKeys);
        }
      } else {
        for (; t + 4 <= num_keys; t += 4) {
          dot_rows_keys<1, 4>(df, q2, k_rows + t, head_dim, s_row + t, kChunkKeys);
        }
        for (; t < num_keys; ++t) {
          dot_rows_keys<1, 1>(df, q2, k_rows + t, head_dim, s_row + t, kChunkKeys);
        }
      }
    }

    // 3. cap, mask, online softmax
    const VF cap = hn::Set(df, task.soft_cap);
    const VF inv_cap = hn::Set(df, task.soft_cap > 0.0f ? 1.0f / task.soft_cap : 0.0f);
    for (int32_t r = row_begin; r < row_end; ++r) {
      float* s_row = s + int64_t{r} * kChunkKeys;
      if (task.soft_cap > 0.0f) {
        for (int32_t t = 0; t < kChunkKeys; t += lanes) {
          const VF x = hn::Load(df, s_row + t);
          hn::Store(hn::Mul(cap, hn::Tanh(df, hn::Mul(x, inv_cap))), df, s_row + t);
        }
      }
      const int32_t pos = task.first_pos + r / group;
      const int32_t visible_first = task.window > 0 ? pos - task.window + 1 : 0;
      float row_max = kNegInf;
      for (int32_t t = 0; t < kChunkKeys; ++t) {
        const int32_t j = j0 + t;
        if (t >= num_keys || j > pos || j < visible_first) {
          s_row[t] = kNegInf;
        } else {
          row_max = std::max(row_max, s_row[t]);
        }
      }
      const float m_old = task.m[r];
      const float m_new = std::max(m_old, row_max);
      if (m_new == kNegInf) {  // sees nothing yet: P = 0 keeps o unchanged
        std::fill(s_row, s_row + kChunkKeys, 0.0f);
        continue;
      }
      const VF m_vec = hn::Set(df, m_new);
      VF sum = hn::Zero(df);
      for (int32_t t = 0; t < kChunkKeys; t += lanes) {
        const VF p = hn::Exp(df, hn::Sub(hn::Load(df, s_row + t), m_vec));
        hn::Store(p, df, s_row + t);
        sum = hn::Add(sum, p);
      }
      const float alpha = std::exp(m_old - m_new);  // 0 when m_old is -inf
      task.l[r] = task.l[r] * alpha + hn::GetLane(hn::SumOfLanes(df, sum));
      task.m[r] = m_new;
      if (alpha != 1.0f) {
        float* o_row = task.o + int64_t{r} * head_dim;
        const VF a = hn::Set(df, alpha);
        int32_t d = 0;
        for (; d + lanes <= head_dim; d += lanes) {
          hn::StoreU(hn::Mul(a, hn::LoadU(df, o_row + d)), df, o_row + d);
        }
        for (; d < head_dim; ++d) o_row[d] *= alpha;
      }
    }

    // 4. values
    gather_rows(df, task, task.kv->v, j0, num_keys, v_buf, v_rows);
    for (int32_t r = row_begin; r < row_end; r += 2) {
      float* o2[2] = {task.o + int64_t{r} * head_dim, task.o + int64_t{r + 1} * head_dim};
      const float* p2[2] = {s + int64_t{r} * kChunkKeys, s + int64_t{r + 1} * kChunkKeys};
      if (r + 1 < row_end) {
        accumulate_pv<2>(df, o2, p2, v_rows, num_keys, head_dim);
      } else {
        accumulate_pv<1>(df, o2, p2, v_rows, num_keys, head_dim);
      }
    }
  }
}

const char* attend_tile_target() { return hwy::TargetName(HWY_TARGET); }

}  // namespace kvp::cpu::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace kvp::cpu {

HWY_EXPORT(attend_tile);
HWY_EXPORT(attend_tile_target);

void attend_tile(const TileTask& task) { HWY_DYNAMIC_DISPATCH(attend_tile)(task); }
const char* attend_tile_target() { return HWY_DYNAMIC_DISPATCH(attend_tile_target)(); }

}  // namespace kvp::cpu
#endif
