// The CUDA mixture-of-experts kernels (launchers and contracts in moe_kernels.h).
#include <cuda_bf16.h>

#include <algorithm>
#include <climits>

#include "model/cuda/moe_kernels.h"

namespace kvp::cuda::detail {
namespace {

constexpr int kWarpsPerCta = 8;      // expert kernels: one weight row per warp
constexpr int kRouteWarps = 4;       // route kernel: one token per warp
constexpr int kRouteGroupWarps = 8;  // the fused route + group kernel
constexpr int kRouterThreads = 128;  // the small steps' router kernel: a CTA a router row

__device__ float warp_sum(float v) {
  for (int offset = 16; offset > 0; offset >>= 1) v += __shfl_xor_sync(0xffffffffu, v, offset);
  return v;
}

__device__ float warp_max(float v) {
  for (int offset = 16; offset > 0; offset >>= 1) {
    v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, offset));
  }
  return v;
}

__global__ void rms_norm_f32_kernel(const float* __restrict__ x, const float* __restrict__ w,
                                    int32_t hidden, float eps, float* __restrict__ out) {
  __shared__ float scratch[32];
  const int64_t r = blockIdx.x;
  const float* in = x + r * hidden;
  float ss = 0.0f;
  for (int32_t i = threadIdx.x; i < hidden; i += blockDim.x) ss += in[i] * in[i];
  ss = warp_sum(ss);
  if (threadIdx.x % 32 == 0) scratch[threadIdx.x / 32] = ss;
  __syncthreads();
  if (threadIdx.x < 32) {
    ss = warp_sum(threadIdx.x < blockDim.x / 32 ? scratch[threadIdx.x] : 0.0f);
    if (threadIdx.x == 0) scratch[0] = ss;
  }
  __syncthreads();
  const float inv = rsqrtf(scratch[0] / hidden + eps);
  for (int32_t i = threadIdx.x; i < hidden; i += blockDim.x)
    out[r * hidden + i] = in[i] * inv * w[i];
}

// One warp routes token t: its probabilities sit in `probs` (shared memory, num_experts floats)
// while k rounds of a warp arg-max take the largest (ties to the lower id) and knock it out.
// Probabilities are >= 0, so -1 marks a chosen expert. Lane k keeps slot k's choice in registers
// and the lanes below top_k write the token's ids and weights at the end (also to shared_ids
// [top_k] when it is not null).
__device__ void route_token(const float* __restrict__ row, int64_t t, int32_t num_experts,
                            int32_t top_k, bool normalize, float* probs, int lane,
                            int32_t* __restrict__ expert_ids, float* __restrict__ weights,
                            int32_t* shared_ids) {
  float max_logit = -INFINITY;
  for (int32_t e = lane; e < num_experts; e += 32) max_logit = fmaxf(max_logit, row[e]);
  max_logit = warp_max(max_logit);
  float sum = 0.0f;
  for (int32_t e = lane; e < num_experts; e += 32) {
    const float p = expf(row[e] - max_logit);
    probs[e] = p;
    sum += p;
  }
  sum = warp_sum(sum);
  for (int32_t e = lane; e < num_experts; e += 32) probs[e] /= sum;
  __syncwarp();
  float chosen = 0.0f, my_weight = 0.0f;
  int32_t my_id = 0;
  for (int32_t k = 0; k < top_k; ++k) {
    float best = -1.0f;
    int32_t best_id = INT_MAX;
    for (int32_t e = lane; e < num_experts; e += 32) {
      const float p = probs[e];
      if (p > best) {  // lanes visit ids in increasing order: the first maximum is kept
        best = p;
        best_id = e;
      }
    }
    for (int offset = 16; offset > 0; offset >>= 1) {
      const float other = __shfl_xor_sync(0xffffffffu, best, offset);
      const int32_t other_id = __shfl_xor_sync(0xffffffffu, best_id, offset);
      if (other > best || (other == best && other_id < best_id)) {
        best = other;
        best_id = other_id;
      }
    }
    if (best_id == INT_MAX) best_id = 0;  // NaN probabilities: keep the writes in bounds
    chosen += best;
    if (lane == k) {
      my_id = best_id;
      my_weight = best;
    }
    if (lane == 0) probs[best_id] = -1.0f;
    __syncwarp();
  }
  if (lane < top_k) {
    expert_ids[t * top_k + lane] = my_id;
    weights[t * top_k + lane] = normalize ? my_weight / chosen : my_weight;
    if (shared_ids != nullptr) shared_ids[t * top_k + lane] = my_id;
  }
}

// One warp per token.
__global__ void moe_route_kernel(const float* __restrict__ logits, int32_t logits_stride,
                                 int32_t num_tokens, int32_t num_experts, int32_t top_k,
                                 bool normalize, int32_t* __restrict__ expert_ids,
                                 float* __restrict__ weights) {
  extern __shared__ float probs_all[];  // [kRouteWarps][num_experts]
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int64_t t = int64_t{blockIdx.x} * kRouteWarps + warp;
  if (t >= num_tokens) return;
  route_token(logits + t * logits_stride, t, num_experts, top_k, normalize,
              probs_all + warp * num_experts, lane, expert_ids, weights, nullptr);
}

// The counting sort by expert, by the whole CTA; `counts` is 2 * num_experts ints of shared memory.
__device__ void group_pairs(const int32_t* __restrict__ expert_ids, int32_t num_pairs,
                            int32_t num_experts, int32_t* counts, int32_t* __restrict__ offsets,
                            int32_t* __restrict__ pairs, int32_t* __restrict__ active) {
  int32_t* cursor = counts + num_experts;
  for (int32_t e = threadIdx.x; e < num_experts; e += blockDim.x) counts[e] = 0;
  __syncthreads();
  for (int32_t i = threadIdx.x; i < num_pairs; i += blockDim.x)
    atomicAdd(&counts[expert_ids[i]], 1);
  __syncthreads();
  if (threadIdx.x < 32) {
    // warp 0: lane l takes a run of consecutive experts; exclusive scans of the runs' pair and
    // active-expert counts place each run's offsets and active ids
    const int32_t lane = threadIdx.x, per = (num_experts + 31) / 32;
    const int32_t first = min(lane * per, num_experts), last = min(first + per, num_experts);
    int32_t run = 0, run_active = 0;
    for (int32_t e = first; e < last; ++e) {
      run += counts[e];
      run_active += counts[e] > 0 ? 1 : 0;
    }
    int32_t upto = run, upto_active = run_active;
    for (int offset = 1; offset < 32; offset <<= 1) {
      const int32_t n = __shfl_up_sync(0xffffffffu, upto, offset);
      const int32_t n_active = __shfl_up_sync(0xffffffffu, upto_active, offset);
      if (lane >= offset) {
        upto += n;
        upto_active += n_active;
      }
    }
    int32_t running = upto - run, num_active = upto_active - run_active;
    for (int32_t e = first; e < last; ++e) {
      offsets[e] = running;
      cursor[e] = running;
      running += counts[e];
      if (counts[e] > 0) active[1 + num_active++] = e;
    }
    if (lane == 31) {
      offsets[num_experts] = upto;
      active[0] = upto_active;
    }
  }
  __syncthreads();
  // the order within an expert varies from run to run; every pair's result is computed alone and
  // the combine sums in a fixed order, so outputs do not
  for (int32_t i = threadIdx.x; i < num_pairs; i += blockDim.x) {
    pairs[atomicAdd(&cursor[expert_ids[i]], 1)] = i;
  }
}

__global__ void moe_group_kernel(const int32_t* __restrict__ expert_ids, int32_t num_pairs,
                                 int32_t num_experts, int32_t* __restrict__ offsets,
                                 int32_t* __restrict__ pairs, int32_t* __restrict__ active) {
  extern __shared__ int32_t counts[];  // [num_experts], then the cursors [num_experts]
  group_pairs(expert_ids, num_pairs, num_experts, counts, offsets, pairs, active);
}

// Small steps: one CTA routes every token (a warp a token at a time) and then groups the pairs,
// one launch where the two kernels above take two; the expert ids reach the grouping through
// shared memory.
__global__ void __launch_bounds__(kRouteGroupWarps * 32)
    moe_route_group_kernel(const float* __restrict__ logits, int32_t logits_stride,
                           int32_t num_tokens, int32_t num_experts, int32_t top_k, bool normalize,
                           int32_t* __restrict__ expert_ids, float* __restrict__ weights,
                           int32_t* __restrict__ offsets, int32_t* __restrict__ pairs,
                           int32_t* __restrict__ active) {
  // probs [kRouteGroupWarps][num_experts] f32, then counts and cursors [2 * num_experts] and the
  // expert ids [num_tokens * top_k] int32
  extern __shared__ float smem[];
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  int32_t* counts = reinterpret_cast<int32_t*>(smem + kRouteGroupWarps * num_experts);
  int32_t* ids = counts + 2 * num_experts;
  for (int64_t t = warp; t < num_tokens; t += kRouteGroupWarps) {
    route_token(logits + t * logits_stride, t, num_experts, top_k, normalize,
                smem + warp * num_experts, lane, expert_ids, weights, ids);
  }
  __syncthreads();
  group_pairs(ids, num_tokens * top_k, num_experts, counts, offsets, pairs, active);
}

// Small steps: the f32 norm of the MLP input and the router's products in one kernel. CTA =
// (router row r, token t): its threads go over the row once, summing x[i]^2 and
// x[i] * norm_w[i] * router[r][i] side by side, and the CTA's sums give
// logits[t][r] = rsqrt(mean(x^2) + eps) * sum (+ bias[r] for r < num_bias): the norm's scale is
// taken out of the sum, so no pass waits for it.
__global__ void __launch_bounds__(kRouterThreads)
    moe_router_small_kernel(const float* __restrict__ x, const float* __restrict__ norm_w,
                            const float* __restrict__ router, const float* __restrict__ bias,
                            int32_t num_bias, int32_t hidden, int32_t rows, float eps,
                            float* __restrict__ logits) {
  __shared__ float2 scratch[kRouterThreads / 32];
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int32_t r = blockIdx.x;
  const int64_t t = blockIdx.y;
  const auto* in = reinterpret_cast<const float4*>(x + t * hidden);
  const auto* w = reinterpret_cast<const float4*>(norm_w);
  const auto* m = reinterpret_cast<const float4*>(router + int64_t{r} * hidden);
  const int32_t vecs = hidden / 4;
  float ss = 0.0f, dot = 0.0f;
#pragma unroll 4
  for (int32_t v = threadIdx.x; v < vecs; v += kRouterThreads) {
    const float4 a = in[v], g = w[v], c = m[v];
    ss += a.x * a.x + a.y * a.y + a.z * a.z + a.w * a.w;
    dot += a.x * g.x * c.x + a.y * g.y * c.y + a.z * g.z * c.z + a.w * g.w * c.w;
  }
  ss = warp_sum(ss);
  dot = warp_sum(dot);
  if (lane == 0) scratch[warp] = make_float2(ss, dot);
  __syncthreads();
  if (threadIdx.x == 0) {
    ss = 0.0f;
    dot = 0.0f;
#pragma unroll
    for (int i = 0; i < kRouterThreads / 32; ++i) {
      ss += scratch[i].x;
      dot += scratch[i].y;
    }
    logits[t * rows + r] = rsqrtf(ss / hidden + eps) * dot + (r < num_bias ? bias[r] : 0.0f);
  }
}

__device__ void bf16x8_to_float(uint4 v, float* f) {
  const auto* h = reinterpret_cast<const __nv_bfloat162*>(&v);
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const float2 p = __bfloat1622float2(h[i]);
    f[2 * i] = p.x;
    f[2 * i + 1] = p.y;
  }
}

// act(gate, up) as cpu::gated_activation computes it.
template <MoeActivation kAct>
__device__ float activate(float g, float u, float alpha, float limit) {
  if constexpr (kAct == MoeActivation::kGeluTanh) {
    const float k = 0.7978845608028654f;  // sqrt(2 / pi)
    return 0.5f * g * (1.0f + tanhf(k * (g + 0.044715f * g * g * g))) * u;
  } else if constexpr (kAct == MoeActivation::kClampedSwiglu) {
    g = fminf(g, limit);
    u = fminf(fmaxf(u, -limit), limit);
    return (u + 1.0f) * (g / (1.0f + expf(-alpha * g)));
  } else {
    return g / (1.0f + expf(-g)) * u;
  }
}

// The expert of a CTA's y-th grid row and its pairs [begin, end) of the grouped order; false for
// a row past the experts with pairs. A step of one token (kSingle) takes them from the route's
// ids without the grouping: slot y is pair y, and index loads that waited on each other
// (active, offsets, pairs) become one.
struct ExpertRow {
  int32_t e, begin, end;
};
template <bool kSingle>
__device__ bool expert_row(const int32_t* __restrict__ active, const int32_t* __restrict__ offsets,
                           const int32_t* __restrict__ expert_ids, ExpertRow* r) {
  const auto y = static_cast<int32_t>(blockIdx.y);
  if constexpr (kSingle) {
    *r = {expert_ids[y], y, y + 1};
    return true;
  } else {
    if (y >= active[0]) return false;
    r->e = active[1 + y];
    r->begin = offsets[r->e];
    r->end = offsets[r->e + 1];
    return true;
  }
}

// CTA = (row tile, y-th expert with pairs): warp w owns row r = tile * kWarpsPerCta + w of the
// expert's gate and the same row of its up projection, and runs it over the expert's pairs
// kChunk at a time, so the two weight rows are read from memory once per chunk (once per step at
// decode). The x rows of a chunk are shared by the CTA's warps through L1. Each lane has kUnroll
// 16-byte loads of each row in flight before it uses them (moe_unroll).
template <MoeActivation kAct, int kChunk, int kUnroll>
__global__ void __launch_bounds__(kWarpsPerCta * 32)
    moe_gate_up_kernel(const __nv_bfloat16* __restrict__ x,
                       const __nv_bfloat16* __restrict__ gate_up,
                       const float* __restrict__ gate_up_bias, const int32_t* __restrict__ offsets,
                       const int32_t* __restrict__ pairs, const int32_t* __restrict__ active,
                       const int32_t* __restrict__ expert_ids, int32_t top_k, int32_t hidden,
                       int32_t inter, float alpha, float limit, float* __restrict__ act) {
  constexpr bool kSingle = kChunk == 1;  // chunks of 1: steps of one token
  ExpertRow er;
  if (!expert_row<kSingle>(active, offsets, expert_ids, &er)) return;
  const int32_t e = er.e, begin = er.begin, end = er.end;
  const auto pair = [&](int32_t i) { return kSingle ? i : pairs[i]; };
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int32_t row = blockIdx.x * kWarpsPerCta + warp;
  if (row >= inter) return;
  const auto* g_row =
      reinterpret_cast<const uint4*>(gate_up + (int64_t{e} * 2 * inter + row) * hidden);
  const auto* u_row = g_row + int64_t{inter} * hidden / 8;
  const int32_t vecs = hidden / 8;
  float g_bias = 0.0f, u_bias = 0.0f;
  if (gate_up_bias != nullptr) {
    g_bias = gate_up_bias[int64_t{e} * 2 * inter + row];
    u_bias = gate_up_bias[int64_t{e} * 2 * inter + inter + row];
  }
  for (int32_t c = begin; c < end; c += kChunk) {
    const int32_t n = min(kChunk, end - c);
    const uint4* xr[kChunk];
    float ga[kChunk], ua[kChunk];
#pragma unroll
    for (int j = 0; j < kChunk; ++j) {
      const int32_t p = pair(c + min(j, n - 1));
      xr[j] = reinterpret_cast<const uint4*>(x + int64_t{p / top_k} * hidden);
      ga[j] = 0.0f;
      ua[j] = 0.0f;
    }
    for (int32_t v0 = lane; v0 < vecs; v0 += 32 * kUnroll) {
      uint4 gv[kUnroll], uv[kUnroll];
#pragma unroll
      for (int u = 0; u < kUnroll; ++u) {
        if (v0 + 32 * u < vecs) {
          gv[u] = g_row[v0 + 32 * u];
          uv[u] = u_row[v0 + 32 * u];
        }
      }
#pragma unroll
      for (int u = 0; u < kUnroll; ++u) {
        const int32_t v = v0 + 32 * u;
        if (v < vecs) {
          float gw[8], uw[8];
          bf16x8_to_float(gv[u], gw);
          bf16x8_to_float(uv[u], uw);
#pragma unroll
          for (int j = 0; j < kChunk; ++j) {
            if (j < n) {
              float xv[8];
              bf16x8_to_float(xr[j][v], xv);
#pragma unroll
              for (int i = 0; i < 8; ++i) {
                ga[j] += gw[i] * xv[i];
                ua[j] += uw[i] * xv[i];
              }
            }
          }
        }
      }
    }
#pragma unroll
    for (int j = 0; j < kChunk; ++j) {
      if (j < n) {  // n is the same for the whole warp
        const float g = warp_sum(ga[j]) + g_bias, u = warp_sum(ua[j]) + u_bias;
        if (lane == 0) {
          act[int64_t{pair(c + j)} * inter + row] = activate<kAct>(g, u, alpha, limit);
        }
      }
    }
  }
}

// CTA = (row tile, y-th expert with pairs): warp w owns row r of the expert's down projection and
// runs it over the expert's pairs' activations, kChunk at a time, kUnroll loads in flight a lane.
template <int kChunk, int kUnroll>
__global__ void __launch_bounds__(kWarpsPerCta * 32)
    moe_down_kernel(const __nv_bfloat16* __restrict__ down, const float* __restrict__ down_bias,
                    const int32_t* __restrict__ offsets, const int32_t* __restrict__ pairs,
                    const int32_t* __restrict__ active, const int32_t* __restrict__ expert_ids,
                    int32_t hidden, int32_t inter, const float* __restrict__ act,
                    float* __restrict__ y) {
  constexpr bool kSingle = kChunk == 1;
  ExpertRow er;
  if (!expert_row<kSingle>(active, offsets, expert_ids, &er)) return;
  const int32_t e = er.e, begin = er.begin, end = er.end;
  const auto pair = [&](int32_t i) { return kSingle ? i : pairs[i]; };
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int32_t row = blockIdx.x * kWarpsPerCta + warp;
  if (row >= hidden) return;
  const auto* w_row = reinterpret_cast<const uint4*>(down + (int64_t{e} * hidden + row) * inter);
  const int32_t vecs = inter / 8;
  const float bias = down_bias != nullptr ? down_bias[int64_t{e} * hidden + row] : 0.0f;
  for (int32_t c = begin; c < end; c += kChunk) {
    const int32_t n = min(kChunk, end - c);
    const float4* ar[kChunk];
    float acc[kChunk];
#pragma unroll
    for (int j = 0; j < kChunk; ++j) {
      ar[j] = reinterpret_cast<const float4*>(act + int64_t{pair(c + min(j, n - 1))} * inter);
      acc[j] = 0.0f;
    }
    for (int32_t v0 = lane; v0 < vecs; v0 += 32 * kUnroll) {
      uint4 wv[kUnroll];
#pragma unroll
      for (int u = 0; u < kUnroll; ++u) {
        if (v0 + 32 * u < vecs) wv[u] = w_row[v0 + 32 * u];
      }
#pragma unroll
      for (int u = 0; u < kUnroll; ++u) {
        const int32_t v = v0 + 32 * u;
        if (v < vecs) {
          float w[8];
          bf16x8_to_float(wv[u], w);
#pragma unroll
          for (int j = 0; j < kChunk; ++j) {
            if (j < n) {
              const float4 a0 = ar[j][2 * v], a1 = ar[j][2 * v + 1];
              acc[j] += w[0] * a0.x + w[1] * a0.y + w[2] * a0.z + w[3] * a0.w + w[4] * a1.x +
                        w[5] * a1.y + w[6] * a1.z + w[7] * a1.w;
            }
          }
        }
      }
    }
#pragma unroll
    for (int j = 0; j < kChunk; ++j) {
      if (j < n) {
        const float s = warp_sum(acc[j]) + bias;
        if (lane == 0) y[int64_t{pair(c + j)} * hidden + row] = s;
      }
    }
  }
}

// CTAs (token, part): the token's slots ordered by expert id (top_k <= kMoeMaxTopK), then
// every thread sums its columns of the part in that order. Parts split a token's columns over
// several CTAs where tokens are few (a decode step's one token over one SM took 15 us).
template <typename Y>
__global__ void moe_combine_kernel(const Y* __restrict__ y, const int32_t* __restrict__ rows,
                                   const float* __restrict__ down_bias,
                                   const int32_t* __restrict__ ids,
                                   const float* __restrict__ weights, int32_t top_k, int32_t hidden,
                                   const float* __restrict__ shared,
                                   const float* __restrict__ shared_logits, int32_t shared_stride,
                                   float* __restrict__ out) {
  __shared__ int32_t order[kMoeMaxTopK];
  const int64_t t = blockIdx.x;
  if (threadIdx.x == 0) {
    for (int32_t s = 0; s < top_k; ++s) order[s] = s;
    for (int32_t i = 1; i < top_k; ++i) {  // insertion sort by expert id
      const int32_t s = order[i];
      int32_t j = i;
      for (; j > 0 && ids[t * top_k + order[j - 1]] > ids[t * top_k + s]; --j) {
        order[j] = order[j - 1];
      }
      order[j] = s;
    }
  }
  __syncthreads();
  float scale = 0.0f;
  if (shared != nullptr) scale = 1.0f / (1.0f + expf(-shared_logits[t * shared_stride]));
  for (int32_t i = blockIdx.y * blockDim.x + threadIdx.x; i < hidden; i += blockDim.x * gridDim.y) {
    float sum = 0.0f;
    for (int32_t s = 0; s < top_k; ++s) {
      const int64_t p = t * top_k + order[s];
      const int64_t row = rows != nullptr ? rows[p] : p;
      float v = static_cast<float>(y[row * hidden + i]);
      if (down_bias != nullptr) v += down_bias[int64_t{ids[p]} * hidden + i];
      sum += weights[p] * v;
    }
    if (shared != nullptr) sum += scale * shared[t * hidden + i];
    out[t * hidden + i] = sum;
  }
}

// One CTA per gathered row: x's row of the pair's token, 16 bytes a thread.
__global__ void moe_gather_kernel(const uint4* __restrict__ x, const int32_t* __restrict__ pairs,
                                  const int32_t* __restrict__ expert_ids, int32_t top_k,
                                  int32_t vecs, uint4* __restrict__ xg, int32_t* __restrict__ rows,
                                  int32_t* __restrict__ row_expert) {
  const int64_t i = blockIdx.x;
  const int32_t p = pairs[i];
  if (threadIdx.x == 0) {
    rows[p] = static_cast<int32_t>(i);
    row_expert[i] = expert_ids[p];
  }
  const uint4* src = x + int64_t{p / top_k} * vecs;
  for (int32_t v = threadIdx.x; v < vecs; v += blockDim.x) xg[i * vecs + v] = src[v];
}

template <MoeActivation kAct>
__global__ void moe_gemm_activation_kernel(const __nv_bfloat16* __restrict__ h,
                                           const int32_t* __restrict__ row_expert,
                                           const float* __restrict__ gate_up_bias, int32_t inter,
                                           float alpha, float limit,
                                           __nv_bfloat16* __restrict__ act) {
  const int64_t i = blockIdx.y;
  const int32_t j = blockIdx.x * blockDim.x + threadIdx.x;
  if (j >= inter) return;
  float g = __bfloat162float(h[i * 2 * inter + j]);
  float u = __bfloat162float(h[i * 2 * inter + inter + j]);
  if (gate_up_bias != nullptr) {
    const float* b = gate_up_bias + int64_t{row_expert[i]} * 2 * inter;
    g += b[j];
    u += b[inter + j];
  }
  act[i * inter + j] = __float2bfloat16(activate<kAct>(g, u, alpha, limit));
}

}  // namespace

cudaError_t launch_moe_gather(const void* x, const int32_t* pairs, const int32_t* expert_ids,
                              int32_t num_pairs, int32_t top_k, int32_t hidden, void* xg,
                              int32_t* rows, int32_t* row_expert, cudaStream_t stream) {
  if (hidden % 8 != 0 || top_k <= 0) return cudaErrorInvalidValue;
  if (num_pairs == 0) return cudaGetLastError();
  moe_gather_kernel<<<num_pairs, 128, 0, stream>>>(static_cast<const uint4*>(x), pairs, expert_ids,
                                                   top_k, hidden / 8, static_cast<uint4*>(xg), rows,
                                                   row_expert);
  return cudaGetLastError();
}

cudaError_t launch_moe_gemm_activation(const void* h_bf16, const int32_t* row_expert,
                                       const float* gate_up_bias, int32_t num_pairs, int32_t inter,
                                       MoeActivation activation, float alpha, float limit,
                                       void* act, cudaStream_t stream) {
  if (inter <= 0) return cudaErrorInvalidValue;
  if (num_pairs == 0) return cudaGetLastError();
  const dim3 grid((inter + 255) / 256, num_pairs);
  auto* out = static_cast<__nv_bfloat16*>(act);
  const auto* h = static_cast<const __nv_bfloat16*>(h_bf16);
  switch (activation) {
    case MoeActivation::kSilu:
      moe_gemm_activation_kernel<MoeActivation::kSilu>
          <<<grid, 256, 0, stream>>>(h, row_expert, gate_up_bias, inter, alpha, limit, out);
      break;
    case MoeActivation::kGeluTanh:
      moe_gemm_activation_kernel<MoeActivation::kGeluTanh>
          <<<grid, 256, 0, stream>>>(h, row_expert, gate_up_bias, inter, alpha, limit, out);
      break;
    case MoeActivation::kClampedSwiglu:
      moe_gemm_activation_kernel<MoeActivation::kClampedSwiglu>
          <<<grid, 256, 0, stream>>>(h, row_expert, gate_up_bias, inter, alpha, limit, out);
      break;
    default:
      return cudaErrorInvalidValue;
  }
  return cudaGetLastError();
}

cudaError_t launch_rms_norm_f32(const float* x, const float* w, int32_t num_rows, int32_t hidden,
                                float eps, float* out, cudaStream_t stream) {
  if (num_rows == 0) return cudaGetLastError();
  rms_norm_f32_kernel<<<num_rows, 256, 0, stream>>>(x, w, hidden, eps, out);
  return cudaGetLastError();
}

cudaError_t launch_moe_route(const float* logits, int32_t logits_stride, int32_t num_tokens,
                             int32_t num_experts, int32_t top_k, bool normalize,
                             int32_t* expert_ids, float* weights, cudaStream_t stream) {
  if (top_k <= 0 || top_k > num_experts || top_k > kMoeMaxTopK || num_experts > kMoeMaxExperts ||
      logits_stride < num_experts) {
    return cudaErrorInvalidValue;
  }
  if (num_tokens == 0) return cudaGetLastError();
  const unsigned grid = (num_tokens + kRouteWarps - 1) / kRouteWarps;
  const size_t smem = size_t{kRouteWarps} * num_experts * sizeof(float);
  moe_route_kernel<<<grid, kRouteWarps * 32, smem, stream>>>(
      logits, logits_stride, num_tokens, num_experts, top_k, normalize, expert_ids, weights);
  return cudaGetLastError();
}

cudaError_t launch_moe_group(const int32_t* expert_ids, int32_t num_pairs, int32_t num_experts,
                             int32_t* offsets, int32_t* pairs, int32_t* active,
                             cudaStream_t stream) {
  if (num_experts <= 0 || num_experts > kMoeMaxExperts) return cudaErrorInvalidValue;
  const size_t smem = size_t{2} * num_experts * sizeof(int32_t);
  moe_group_kernel<<<1, 1024, smem, stream>>>(expert_ids, num_pairs, num_experts, offsets, pairs,
                                              active);
  return cudaGetLastError();
}

cudaError_t launch_moe_route_group(const float* logits, int32_t logits_stride, int32_t num_tokens,
                                   int32_t num_experts, int32_t top_k, bool normalize,
                                   int32_t* expert_ids, float* weights, int32_t* offsets,
                                   int32_t* pairs, int32_t* active, cudaStream_t stream) {
  if (top_k <= 0 || top_k > num_experts || top_k > kMoeMaxTopK || num_experts > kMoeMaxExperts ||
      logits_stride < num_experts || num_tokens > kMoeSmallStepTokens) {
    return cudaErrorInvalidValue;
  }
  const size_t smem =
      ((size_t{kRouteGroupWarps} + 2) * num_experts + size_t{kMoeSmallStepTokens} * kMoeMaxTopK) *
      sizeof(float);
  moe_route_group_kernel<<<1, kRouteGroupWarps * 32, smem, stream>>>(
      logits, logits_stride, num_tokens, num_experts, top_k, normalize, expert_ids, weights,
      offsets, pairs, active);
  return cudaGetLastError();
}

cudaError_t launch_moe_router_small(const float* x, const float* norm_w, const float* router,
                                    const float* bias, int32_t num_bias, int32_t num_tokens,
                                    int32_t hidden, int32_t rows, float eps, float* logits,
                                    cudaStream_t stream) {
  if (hidden <= 0 || hidden % 4 != 0 || rows <= 0 || num_bias > rows ||
      num_tokens > kMoeSmallStepTokens) {
    return cudaErrorInvalidValue;
  }
  if (num_tokens == 0) return cudaGetLastError();
  const dim3 grid(rows, num_tokens);
  moe_router_small_kernel<<<grid, kRouterThreads, 0, stream>>>(x, norm_w, router, bias, num_bias,
                                                               hidden, rows, eps, logits);
  return cudaGetLastError();
}

bool moe_experts_support(int32_t hidden, int32_t inter) {
  return hidden > 0 && inter > 0 && hidden % 8 == 0 && inter % 8 == 0;
}

namespace {

// 16-byte loads of a weight row in flight per lane for a chunk of kChunk pairs: the registers
// that fewer accumulators leave. Measured on an H200 (docs/perf/model-cuda.md): at 1 token 2
// beat 4 and 8 (4 was 2-3 % slower a decode step), at 4 tokens 2 beat 1 (1 was 4-5 % slower),
// at 8 one load (four were slower, 2026-11-27); 4 at 2 tokens is not measured against others.
constexpr int moe_unroll(int chunk) { return chunk == 1 ? 2 : chunk == 2 ? 4 : chunk == 4 ? 2 : 1; }

// The two expert kernels with kChunk pairs a pass.
template <int kChunk>
cudaError_t launch_moe_experts_shaped(const MoeExpertArgs& a, unsigned max_active,
                                      cudaStream_t stream) {
  constexpr int kUnroll = moe_unroll(kChunk);
  const auto* x = static_cast<const __nv_bfloat16*>(a.x);
  const auto* gate_up = static_cast<const __nv_bfloat16*>(a.gate_up);
  const auto* down = static_cast<const __nv_bfloat16*>(a.down);
  const dim3 up_grid((a.inter + kWarpsPerCta - 1) / kWarpsPerCta, max_active);
  const auto launch_gate_up = [&](auto kernel) {
    kernel<<<up_grid, kWarpsPerCta * 32, 0, stream>>>(
        x, gate_up, a.gate_up_bias, a.offsets, a.pairs, a.active, a.expert_ids, a.top_k, a.hidden,
        a.inter, a.swiglu_alpha, a.swiglu_limit, a.act);
  };
  switch (a.activation) {
    case MoeActivation::kSilu:
      launch_gate_up(moe_gate_up_kernel<MoeActivation::kSilu, kChunk, kUnroll>);
      break;
    case MoeActivation::kGeluTanh:
      launch_gate_up(moe_gate_up_kernel<MoeActivation::kGeluTanh, kChunk, kUnroll>);
      break;
    case MoeActivation::kClampedSwiglu:
      launch_gate_up(moe_gate_up_kernel<MoeActivation::kClampedSwiglu, kChunk, kUnroll>);
      break;
    default:
      return cudaErrorInvalidValue;
  }
  const cudaError_t up_status = cudaGetLastError();
  if (up_status != cudaSuccess) return up_status;
  const dim3 down_grid((a.hidden + kWarpsPerCta - 1) / kWarpsPerCta, max_active);
  moe_down_kernel<kChunk, kUnroll><<<down_grid, kWarpsPerCta * 32, 0, stream>>>(
      down, a.down_bias, a.offsets, a.pairs, a.active, a.expert_ids, a.hidden, a.inter, a.act, a.y);
  return cudaGetLastError();
}

}  // namespace

cudaError_t launch_moe_experts(const MoeExpertArgs& a, cudaStream_t stream) {
  if (!moe_experts_support(a.hidden, a.inter) || a.top_k <= 0) return cudaErrorInvalidValue;
  // at most num_pairs experts have pairs: a decode step's grid covers only those that can
  const unsigned max_active = static_cast<unsigned>(std::min(a.num_experts, a.num_pairs));
  if (max_active == 0) return cudaGetLastError();
  // an expert has at most one pair per token: the chunk covers them in one pass, up to
  // kMoeChunkTokens
  const int32_t num_tokens = a.num_pairs / a.top_k;
  if (num_tokens <= 1) return launch_moe_experts_shaped<1>(a, max_active, stream);
  if (num_tokens <= 2) return launch_moe_experts_shaped<2>(a, max_active, stream);
  if (num_tokens <= 4) return launch_moe_experts_shaped<4>(a, max_active, stream);
  return launch_moe_experts_shaped<kMoeChunkTokens>(a, max_active, stream);
}

cudaError_t launch_moe_combine(const void* y, bool y_bf16, const int32_t* rows,
                               const float* down_bias, const int32_t* expert_ids,
                               const float* weights, int32_t num_tokens, int32_t top_k,
                               int32_t hidden, const float* shared, const float* shared_logits,
                               int32_t shared_stride, float* out, cudaStream_t stream) {
  if (top_k <= 0 || top_k > kMoeMaxTopK) return cudaErrorInvalidValue;
  if (num_tokens == 0) return cudaGetLastError();
  // a thread a column while there are fewer than ~2 CTAs per SM of tokens, else a CTA a token
  constexpr int32_t kThreads = 256;
  const int32_t parts =
      num_tokens >= 256
          ? 1
          : std::max(1, std::min((hidden + kThreads - 1) / kThreads, 256 / num_tokens));
  const dim3 grid(num_tokens, parts);
  if (y_bf16) {
    moe_combine_kernel<<<grid, kThreads, 0, stream>>>(static_cast<const __nv_bfloat16*>(y), rows,
                                                      down_bias, expert_ids, weights, top_k, hidden,
                                                      shared, shared_logits, shared_stride, out);
  } else {
    moe_combine_kernel<<<grid, kThreads, 0, stream>>>(static_cast<const float*>(y), rows, down_bias,
                                                      expert_ids, weights, top_k, hidden, shared,
                                                      shared_logits, shared_stride, out);
  }
  return cudaGetLastError();
}

}  // namespace kvp::cuda::detail
