// The CUDA sampler (sampler_kernels.h): one CTA per sampled token, no sort of the vocabulary.
//
// Passes over the row, each strided over 1024 threads (the scratch row stays in L2):
//   A  raw row: online max / sum of exp for log_z; scratch = row (× 1/T when nothing is edited)
//   B  (penalties or masks only) scatter them, then scratch ×= 1/T
//   C  max and argmax of scratch (greedy: the answer)
//   D  top-k: 4-level radix select (8 bits a level) over the ordered bits of scratch, by count
//   E  top-p: the same select by probability mass exp(s - max), target top_p × (top-k) mass
//   F  every warp sums the kept mass of its contiguous segment; the warp whose segment holds
//      u × total walks it with a warp scan and picks the first token whose running mass > target
//   G  top-n raw logprobs: n block-wide argmax rounds
// The kept set is "ordered above the boundary": value > v, or value == v among the first j of
// the tokens equal to v in id order (the CPU's most-likely-first order breaks ties by lower id).
#include <cuda_runtime.h>

#include <climits>
#include <cstdint>

#include "model/cuda/sampler_kernels.h"

namespace kvp::cuda::detail {
namespace {

constexpr int kThreads = 1024;
constexpr int kWarps = kThreads / 32;

__device__ __forceinline__ float neg_inf() { return __int_as_float(0xff800000); }

// Monotone map of floats to unsigned keys (larger float, larger key).
__device__ __forceinline__ uint32_t order_key(float x) {
  const uint32_t b = __float_as_uint(x);
  return (b & 0x80000000u) ? ~b : (b | 0x80000000u);
}
__device__ __forceinline__ float key_value(uint32_t k) {
  return __uint_as_float((k & 0x80000000u) ? (k & 0x7fffffffu) : ~k);
}
// NaN counts as -inf; -0 as +0 (the CPU's == treats them as one value).
__device__ __forceinline__ float clean(float x) {
  if (x != x) return neg_inf();
  return x == 0.0f ? 0.0f : x;
}

__device__ __forceinline__ double warp_sum(double v) {
  for (int off = 16; off > 0; off >>= 1) v += __shfl_xor_sync(0xffffffffu, v, off);
  return v;
}
__device__ __forceinline__ float warp_sum_f(float v) {
  for (int off = 16; off > 0; off >>= 1) v += __shfl_xor_sync(0xffffffffu, v, off);
  return v;
}
// (value, index): larger value wins, ties to the lower index.
__device__ __forceinline__ void warp_argmax(float& v, int& i) {
  for (int off = 16; off > 0; off >>= 1) {
    const float ov = __shfl_xor_sync(0xffffffffu, v, off);
    const int oi = __shfl_xor_sync(0xffffffffu, i, off);
    if (ov > v || (ov == v && oi < i)) v = ov, i = oi;
  }
}
// Online (max, sum of exp(x - max)) pairs.
__device__ __forceinline__ void lse_combine(float& m, float& s, float om, float os) {
  if (om == neg_inf()) return;
  if (m == neg_inf()) {
    m = om, s = os;
    return;
  }
  const float nm = fmaxf(m, om);
  s = s * expf(m - nm) + os * expf(om - nm);
  m = nm;
}

struct Shared {
  float f[kWarps];
  int i[kWarps];
  double d[kWarps];
  uint32_t count[256];
  double mass[256];
  float warp_bins[kWarps][256];  // each warp's mass histogram (no atomics across warps)
  double warp_mass[kWarps];
  int32_t eq_base[kWarps];
  uint32_t sel_prefix, sel_want, sel_neq;
  double sel_target, sel_above;
  int chosen_warp;
  double chosen_base, chosen_target;
};

// Every thread returns the block's value.
__device__ double block_sum(double v, Shared& sh) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  v = warp_sum(v);
  __syncthreads();
  if (lane == 0) sh.d[warp] = v;
  __syncthreads();
  return warp_sum(sh.d[lane]);
}
__device__ void block_argmax(float& v, int& idx, Shared& sh) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  warp_argmax(v, idx);
  __syncthreads();
  if (lane == 0) sh.f[warp] = v, sh.i[warp] = idx;
  __syncthreads();
  v = sh.f[lane];
  idx = sh.i[lane];
  warp_argmax(v, idx);
}
__device__ void block_lse(float& m, float& s, Shared& sh) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  for (int off = 16; off > 0; off >>= 1) {
    const float om = __shfl_xor_sync(0xffffffffu, m, off);
    const float os = __shfl_xor_sync(0xffffffffu, s, off);
    lse_combine(m, s, om, os);
  }
  __syncthreads();
  if (lane == 0) sh.f[warp] = m, sh.d[warp] = s;
  __syncthreads();
  m = sh.f[lane];
  s = static_cast<float>(sh.d[lane]);
  for (int off = 16; off > 0; off >>= 1) {
    const float om = __shfl_xor_sync(0xffffffffu, m, off);
    const float os = __shfl_xor_sync(0xffffffffu, s, off);
    lse_combine(m, s, om, os);
  }
}

struct Boundary {
  uint32_t key;  // kept: key > this, or key == this among the first j equals in id order
  uint32_t j;
  uint32_t neq;  // tokens whose key == this
};

// Radix select over the keys of s[0, vocab): by count (weights 1, target = k: the k-th
// largest) or by mass (weights exp(s - m), target: the first token, most likely first, where the
// running mass reaches the target). Every thread returns the boundary.
template <bool kByMass>
__device__ Boundary radix_select(const float* s, int vocab, float m, double target, Shared& sh) {
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  uint32_t prefix = 0;
  double want = target;
  double above_total = 0.0;
  uint32_t neq = 0;
  for (int level = 0; level < 4; ++level) {
    const int shift = 24 - 8 * level;
    for (int b = tid; b < 256; b += kThreads) sh.count[b] = 0;
    if (kByMass) {
      for (int b = lane; b < 256; b += 32) sh.warp_bins[warp][b] = 0.0f;
    }
    __syncthreads();
    // Counts matter at every level by count, and at the last by mass (the boundary's equals).
    const bool counting = !kByMass || level == 3;
    for (int base = 0; base < vocab; base += kThreads) {  // warp-uniform trip count
      const int i = base + tid;
      bool valid = false;
      uint32_t bin = 0;
      float p = 0.0f;
      if (i < vocab) {
        const float x = s[i];
        const uint32_t k = order_key(x);
        valid = level == 0 || (k >> (shift + 8)) == (prefix >> (shift + 8));
        bin = (k >> shift) & 255u;
        if (kByMass && valid) p = expf(x - m);
      }
      // Warp-aggregated adds for the warp's most common bins (few distinct at the top level,
      // where one shared address would otherwise take 32 atomics a warp), direct for the rest.
      unsigned todo = __ballot_sync(0xffffffffu, valid);
      for (int round = 0; round < 4 && todo != 0u; ++round) {
        const int src = __ffs(todo) - 1;
        const uint32_t b = __shfl_sync(0xffffffffu, bin, src);
        const bool in = ((todo >> lane) & 1u) && bin == b;
        const unsigned group = __ballot_sync(0xffffffffu, in);
        if (kByMass) {
          const float sum = warp_sum_f(in ? p : 0.0f);
          if (lane == src) sh.warp_bins[warp][b] += sum;  // one writer: this round's bin
        }
        if (counting && lane == src) atomicAdd(&sh.count[b], static_cast<uint32_t>(__popc(group)));
        todo &= ~group;
      }
      if ((todo >> lane) & 1u) {
        if (kByMass && p > 0.0f) atomicAdd(&sh.warp_bins[warp][bin], p);
        if (counting) atomicAdd(&sh.count[bin], 1u);
      }
      __syncwarp();
    }
    __syncthreads();
    if (kByMass) {  // the warps' histograms, added in double
      for (int b = tid; b < 256; b += kThreads) {
        double sum = 0.0;
        for (int w = 0; w < kWarps; ++w) sum += static_cast<double>(sh.warp_bins[w][b]);
        sh.mass[b] = sum;
      }
      __syncthreads();
    }
    if (warp == 0) {
      // lane l holds bins 255 - 8l down to 248 - 8l: lanes in most-likely-first order
      double w[8];
      uint32_t c[8];
      double tot = 0.0;
      for (int j = 0; j < 8; ++j) {
        const int bin = 255 - 8 * lane - j;
        c[j] = sh.count[bin];
        w[j] = kByMass ? sh.mass[bin] : static_cast<double>(c[j]);
        tot += w[j];
      }
      double incl = tot;
      for (int off = 1; off < 32; off <<= 1) {
        const double n = __shfl_up_sync(0xffffffffu, incl, off);
        if (lane >= off) incl += n;
      }
      const double excl = incl - tot;
      const bool mine = excl < want && want <= incl;
      const unsigned ballot = __ballot_sync(0xffffffffu, mine);
      if (mine) {
        double acc = excl;
        for (int j = 0; j < 8; ++j) {
          if (acc + w[j] >= want) {
            sh.sel_prefix = prefix | (uint32_t(255 - 8 * lane - j) << shift);
            sh.sel_target = want - acc;
            sh.sel_above = above_total + acc;
            sh.sel_neq = c[j];
            break;
          }
          acc += w[j];
        }
      }
      if (ballot == 0 && lane == 0) {
        // rounding left the target above this level's mass: keep all of the lowest non-empty bin
        double acc = 0.0;
        int low = 255;
        for (int b = 255; b >= 0; --b) {
          if (kByMass ? sh.mass[b] > 0.0 : sh.count[b] > 0) low = b;
        }
        for (int b = 255; b > low; --b) acc += kByMass ? sh.mass[b] : double(sh.count[b]);
        const double wl = kByMass ? sh.mass[low] : double(sh.count[low]);
        sh.sel_prefix = prefix | (uint32_t(low) << shift);
        sh.sel_target = wl > 0.0 ? wl : 1.0;
        sh.sel_above = above_total + acc;
        sh.sel_neq = sh.count[low];
      }
    }
    __syncthreads();
    prefix = sh.sel_prefix;
    want = sh.sel_target;
    above_total = sh.sel_above;
    neq = sh.sel_neq;
  }
  Boundary b;
  b.key = prefix;
  b.neq = neq;
  if (!kByMass) {
    b.j = static_cast<uint32_t>(want + 0.5);
  } else {
    const double p = static_cast<double>(expf(key_value(prefix) - m));
    double j = p > 0.0 ? ceil(want / p) : static_cast<double>(neq);
    if (j < 1.0) j = 1.0;
    if (j > static_cast<double>(neq)) j = static_cast<double>(neq);
    b.j = static_cast<uint32_t>(j);
  }
  if (b.j > neq) b.j = neq;
  return b;
}

struct Kept {
  bool bounded;
  bool partial;  // only the first j of the boundary's equals are kept
  uint32_t key, j;
  float m, min_p;
};

// The kept probability of s[i] (0 when dropped); rank: this token's rank among the boundary's
// equals (valid when partial).
__device__ __forceinline__ float kept_prob(float x, const Kept& kp, uint32_t rank, bool& is_eq) {
  const uint32_t k = order_key(x);
  is_eq = kp.bounded && k == kp.key;
  const bool in = !kp.bounded || k > kp.key || (is_eq && (!kp.partial || rank < kp.j));
  const float p = expf(x - kp.m);
  return (in && p >= kp.min_p) ? p : 0.0f;
}

struct Args {
  const float* logits;
  int32_t vocab;
  const DeviceSampleRequest* requests;
  const PenaltyToken* penalties;
  const int32_t* masked;
  float* scratch;
  DeviceSample* results;
};

__global__ void __launch_bounds__(kThreads) sample_rows_kernel(Args a) {
  __shared__ Shared sh;
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const DeviceSampleRequest req = a.requests[blockIdx.x];
  const int vocab = a.vocab;
  const float* __restrict__ raw = a.logits + size_t(req.logit_row) * vocab;
  float* __restrict__ s = a.scratch + size_t(blockIdx.x) * vocab;
  const bool greedy = req.temperature == 0.0f;
  const float inv_t = greedy ? 1.0f : 1.0f / req.temperature;
  const bool edits = req.penalty_count > 0 || req.mask_count > 0;

  // A: log_z of the raw row; scratch
  float rm = neg_inf(), rs = 0.0f;
#pragma unroll 4
  for (int i = tid; i < vocab; i += kThreads) {
    const float x = raw[i];
    if (x == x && x != neg_inf()) {
      if (x <= rm) {
        rs += expf(x - rm);
      } else {
        rs = (rm == neg_inf() ? 0.0f : rs * expf(rm - x)) + 1.0f;
        rm = x;
      }
    }
    s[i] = edits ? x : clean(x * inv_t);
  }
  block_lse(rm, rs, sh);
  const float log_z = rm + logf(rs);

  // B: penalties (distinct ids, so no two threads write one entry), masks, temperature
  if (edits) {
    __syncthreads();
    for (int e = tid; e < req.penalty_count; e += kThreads) {
      const PenaltyToken pt = a.penalties[req.penalty_begin + e];
      float l = s[pt.token_id];
      if (req.repetition_penalty != 1.0f) {
        l = l > 0.0f ? l / req.repetition_penalty : l * req.repetition_penalty;
      }
      if (pt.output_count > 0 && (req.presence_penalty != 0.0f || req.frequency_penalty != 0.0f)) {
        l -= req.presence_penalty + req.frequency_penalty * static_cast<float>(pt.output_count);
      }
      s[pt.token_id] = l;
    }
    __syncthreads();
    for (int e = tid; e < req.mask_count; e += kThreads)
      s[a.masked[req.mask_begin + e]] = neg_inf();
    __syncthreads();
    for (int i = tid; i < vocab; i += kThreads) s[i] = clean(s[i] * inv_t);
  }
  __syncthreads();

  // C: max and argmax of the processed row
  float best = neg_inf();
  int best_i = INT_MAX;
#pragma unroll 4
  for (int i = tid; i < vocab; i += kThreads) {
    const float x = s[i];
    if (x > best || (best_i == INT_MAX)) best = x, best_i = i;
  }
  block_argmax(best, best_i, sh);
  if (best_i == INT_MAX) best_i = 0;
  int token = best_i;
  const float m = best;

  if (!greedy && m != neg_inf()) {
    Kept kp;
    kp.bounded = false;
    kp.partial = false;
    kp.key = 0;
    kp.j = 0;
    kp.m = m;
    kp.min_p = req.min_p;
    Boundary bound = {0u, 0u, 0u};
    // D: top-k
    if (req.top_k > 0 && req.top_k < vocab) {
      bound = radix_select<false>(s, vocab, m, static_cast<double>(req.top_k), sh);
      kp.bounded = true;
    }
    // E: top-p over the top-k set (its most likely tokens come first in both orders)
    if (req.top_p < 1.0f) {
      double part = 0.0;
#pragma unroll 4
      for (int i = tid; i < vocab; i += kThreads) {
        const float x = s[i];
        if (!kp.bounded || order_key(x) > bound.key) part += static_cast<double>(expf(x - m));
      }
      double total = block_sum(part, sh);
      if (kp.bounded)
        total += double(bound.j) * static_cast<double>(expf(key_value(bound.key) - m));
      const double target = static_cast<double>(req.top_p) * total;
      const Boundary bp = radix_select<true>(s, vocab, m, target, sh);
      if (!kp.bounded || bp.key > bound.key || (bp.key == bound.key && bp.j < bound.j)) {
        bound = bp;
      }
      kp.bounded = true;
    }
    if (kp.bounded) {
      kp.key = bound.key;
      kp.j = bound.j;
      kp.partial = bound.j < bound.neq;
    }

    // F: per-warp contiguous segments (id order), their kept mass, then the walk
    const int seg = ((vocab + kWarps - 1) / kWarps + 31) / 32 * 32;
    const int beg = warp * seg;
    const int end = min(vocab, beg + seg);
    if (kp.partial) {  // the boundary's equals before each segment
      uint32_t n = 0;
      for (int i0 = beg; i0 < end; i0 += 32) {
        const int i = i0 + lane;
        n += __popc(__ballot_sync(0xffffffffu, i < end && order_key(s[i]) == kp.key));
      }
      if (lane == 0) sh.eq_base[warp] = static_cast<int32_t>(n);
      __syncthreads();
      if (tid == 0) {
        int32_t acc = 0;
        for (int w = 0; w < kWarps; ++w) {
          const int32_t c = sh.eq_base[w];
          sh.eq_base[w] = acc;
          acc += c;
        }
      }
      __syncthreads();
    }
    {
      uint32_t rank = kp.partial ? uint32_t(sh.eq_base[warp]) : 0u;
      float part = 0.0f;
      for (int i0 = beg; i0 < end; i0 += 32) {
        const int i = i0 + lane;
        const float x = i < end ? s[i] : neg_inf();
        const uint32_t lt = (1u << lane) - 1u;
        const unsigned eqm =
            __ballot_sync(0xffffffffu, i < end && kp.bounded && order_key(x) == kp.key);
        bool is_eq;
        const float p = i < end ? kept_prob(x, kp, rank + __popc(eqm & lt), is_eq) : 0.0f;
        part += p;
        rank += __popc(eqm);
      }
      part = warp_sum_f(part);
      if (lane == 0) sh.warp_mass[warp] = static_cast<double>(part);
    }
    __syncthreads();
    if (tid == 0) {
      double total = 0.0;
      for (int w = 0; w < kWarps; ++w) total += sh.warp_mass[w];
      const double target = req.u * total;
      double base = 0.0;
      int chosen = -1, last = -1;
      for (int w = 0; w < kWarps; ++w) {
        if (sh.warp_mass[w] > 0.0) {
          last = w;
          if (chosen < 0 && target < base + sh.warp_mass[w]) {
            chosen = w;
            break;
          }
        }
        base += sh.warp_mass[w];
      }
      if (chosen < 0 && last >= 0) {
        chosen = last;
        base = 0.0;
        for (int w = 0; w < last; ++w) base += sh.warp_mass[w];
      }
      sh.chosen_warp = chosen;
      sh.chosen_base = base;
      sh.chosen_target = target;
    }
    __syncthreads();
    if (warp == sh.chosen_warp) {
      const double target = sh.chosen_target;
      double carry = sh.chosen_base;
      uint32_t rank = kp.partial ? uint32_t(sh.eq_base[warp]) : 0u;
      int found = -1, last_kept = -1;
      for (int i0 = beg; i0 < end; i0 += 32) {
        const int i = i0 + lane;
        const float x = i < end ? s[i] : neg_inf();
        const uint32_t lt = (1u << lane) - 1u;
        const unsigned eqm =
            __ballot_sync(0xffffffffu, i < end && kp.bounded && order_key(x) == kp.key);
        bool is_eq;
        const float p = i < end ? kept_prob(x, kp, rank + __popc(eqm & lt), is_eq) : 0.0f;
        rank += __popc(eqm);
        float c = p;
        for (int off = 1; off < 32; off <<= 1) {
          const float n = __shfl_up_sync(0xffffffffu, c, off);
          if (lane >= off) c += n;
        }
        const unsigned hit = __ballot_sync(0xffffffffu, p > 0.0f && target < carry + double(c));
        if (hit != 0u) {
          found = i0 + __ffs(hit) - 1;
          break;
        }
        const unsigned kept = __ballot_sync(0xffffffffu, p > 0.0f);
        if (kept != 0u) last_kept = i0 + 31 - __clz(kept);
        carry += static_cast<double>(__shfl_sync(0xffffffffu, c, 31));
      }
      if (found < 0) found = last_kept;
      if (lane == 0) sh.i[0] = found >= 0 ? found : token;
    }
    __syncthreads();
    if (sh.chosen_warp >= 0) token = sh.i[0];
    __syncthreads();
  }

  // G: the chosen token's raw logprob and the top-n raw logprobs
  DeviceSample* out = a.results + blockIdx.x;
  if (tid == 0) {
    out->token_id = token;
    out->logprob = raw[token] - log_z;
  }
  float prev_v = __int_as_float(0x7f800000);
  int prev_i = -1;
  int n = 0;
  const int want = min(req.num_logprobs, min(vocab, kMaxDeviceLogprobs));
  for (; n < want; ++n) {
    float bv = neg_inf();
    int bi = INT_MAX;
#pragma unroll 4
    for (int i = tid; i < vocab; i += kThreads) {
      const float x = raw[i];
      if (x != x) continue;
      const bool after = x < prev_v || (x == prev_v && i > prev_i);
      if (after && (bi == INT_MAX || x > bv || (x == bv && i < bi))) bv = x, bi = i;
    }
    block_argmax(bv, bi, sh);
    if (bi == INT_MAX) break;
    if (tid == 0) {
      out->top_ids[n] = bi;
      out->top_logprobs[n] = bv - log_z;
    }
    prev_v = bv;
    prev_i = bi;
  }
  if (tid == 0) out->num_top = n;
}

}  // namespace

cudaError_t launch_sample_rows(const float* logits, int32_t vocab,
                               const DeviceSampleRequest* requests, int32_t num_requests,
                               const PenaltyToken* penalties, const int32_t* masked, float* scratch,
                               DeviceSample* results, cudaStream_t stream) {
  if (num_requests <= 0) return cudaSuccess;
  if (vocab <= 0) return cudaErrorInvalidValue;
  Args a{logits, vocab, requests, penalties, masked, scratch, results};
  sample_rows_kernel<<<num_requests, kThreads, 0, stream>>>(a);
  return cudaGetLastError();
}

}  // namespace kvp::cuda::detail
