// The experts of prompt steps as grouped GEMMs (moe_gemm.h).
#include "model/cuda/moe_gemm.h"

#include <vector>

#include "backend/cuda/cuda_status.h"
#include "model/cuda/cublas_status.h"

namespace kvp::cuda {
namespace {

// One projection over the experts with pairs: C_e [n_e][m] bf16 = B_e [n_e][k] bf16 · A_eᵀ, A_e
// [m][k] bf16 (row-major; cuBLAS sees the transposes in column-major), f32 accumulation. bf16
// out: cuBLAS's grouped GEMM takes bf16 inputs only with a bf16 C.
struct Projection {
  int32_t m, k;
  const void* const* a;  // device arrays of the groups' pointers
  const void* const* b;
  void* const* c;
};

Status run_loop(cublasHandle_t handle, const Projection& p, const std::vector<int32_t>& n,
                const std::vector<void*>& a, const std::vector<void*>& b,
                const std::vector<void*>& c) {
  const float alpha = 1.0f, beta = 0.0f;
  for (size_t g = 0; g < n.size(); ++g) {
    KVP_RETURN_IF_ERROR(
        cublas_status(cublasGemmEx(handle, CUBLAS_OP_T, CUBLAS_OP_N, p.m, n[g], p.k, &alpha, a[g],
                                   CUDA_R_16BF, p.k, b[g], CUDA_R_16BF, p.k, &beta, c[g],
                                   CUDA_R_16BF, p.m, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT),
                      "expert GEMM"));
  }
  return Status::ok();
}

cublasStatus_t run_grouped(cublasHandle_t handle, const Projection& p,
                           const std::vector<int32_t>& n) {
  const auto groups = static_cast<int32_t>(n.size());
  const std::vector<cublasOperation_t> ta(groups, CUBLAS_OP_T), tb(groups, CUBLAS_OP_N);
  const std::vector<int32_t> m(groups, p.m), k(groups, p.k), ones(groups, 1);
  const std::vector<float> alpha(groups, 1.0f), beta(groups, 0.0f);
  return cublasGemmGroupedBatchedEx(handle, ta.data(), tb.data(), m.data(), n.data(), k.data(),
                                    alpha.data(), p.a, CUDA_R_16BF, k.data(), p.b, CUDA_R_16BF,
                                    k.data(), beta.data(), p.c, CUDA_R_16BF, m.data(), groups,
                                    ones.data(), CUBLAS_COMPUTE_32F);
}

}  // namespace

Status MoeGemmScratch::allocate(int64_t num_pairs, int32_t num_experts, int32_t hidden,
                                int32_t inter) {
  KVP_ASSIGN_OR_RETURN(gathered, DeviceBuffer::allocate(num_pairs * hidden * 2));
  KVP_ASSIGN_OR_RETURN(rows, DeviceBuffer::allocate(num_pairs * 4));
  KVP_ASSIGN_OR_RETURN(row_expert, DeviceBuffer::allocate(num_pairs * 4));
  KVP_ASSIGN_OR_RETURN(h, DeviceBuffer::allocate(num_pairs * 2 * inter * 2));
  KVP_ASSIGN_OR_RETURN(act, DeviceBuffer::allocate(num_pairs * inter * 2));
  const size_t pointer_bytes = size_t{6} * num_experts * sizeof(void*);
  KVP_ASSIGN_OR_RETURN(pointers, DeviceBuffer::allocate(pointer_bytes));
  KVP_ASSIGN_OR_RETURN(pointers_host, PinnedBuffer::allocate(pointer_bytes));
  KVP_ASSIGN_OR_RETURN(offsets_host, PinnedBuffer::allocate((size_t(num_experts) + 1) * 4));
  capacity_pairs = num_pairs;
  return Status::ok();
}

Status enqueue_moe_experts_gemm(cublasHandle_t handle, const detail::MoeExpertArgs& a,
                                MoeGemmMode mode, MoeGemmScratch* s, cudaStream_t stream) {
  if (mode == MoeGemmMode::kKernels || a.num_pairs > s->capacity_pairs) {
    return Status::internal("cuda moe: GEMM path called with mode {} for {} pairs (capacity {})",
                            static_cast<int>(mode), a.num_pairs, s->capacity_pairs);
  }
  if (a.num_pairs == 0) return Status::ok();
  const int32_t E = a.num_experts, hidden = a.hidden, inter = a.inter;
  auto* counts = s->offsets_host.as<int32_t>();
  KVP_CUDA_RETURN_IF_ERROR(
      cudaMemcpyAsync(counts, a.offsets, (size_t(E) + 1) * 4, cudaMemcpyDeviceToHost, stream));
  KVP_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(stream));
  KVP_RETURN_IF_ERROR(
      cuda_status(detail::launch_moe_gather(a.x, a.pairs, a.expert_ids, a.num_pairs, a.top_k,
                                            hidden, s->gathered.data(), s->rows.as<int32_t>(),
                                            s->row_expert.as<int32_t>(), stream),
                  "moe_gather_kernel"));
  // the groups: experts with pairs, their row ranges of the gathered matrices; per group the
  // pointers A, B, C of GEMM 1, then of GEMM 2
  std::vector<int32_t> n;
  std::vector<void*> ptr[6];
  auto* xg = s->gathered.as<uint16_t>();
  auto* act = s->act.as<uint16_t>();
  auto* gate_up = static_cast<uint16_t*>(const_cast<void*>(a.gate_up));
  auto* down = static_cast<uint16_t*>(const_cast<void*>(a.down));
  for (int32_t e = 0; e < E; ++e) {
    const int64_t begin = counts[e], rows = counts[e + 1] - counts[e];
    if (rows <= 0) continue;
    n.push_back(static_cast<int32_t>(rows));
    ptr[0].push_back(gate_up + int64_t{e} * 2 * inter * hidden);
    ptr[1].push_back(xg + begin * hidden);
    ptr[2].push_back(s->h.as<uint16_t>() + begin * 2 * inter);
    ptr[3].push_back(down + int64_t{e} * hidden * inter);
    ptr[4].push_back(act + begin * inter);
    ptr[5].push_back(reinterpret_cast<uint16_t*>(a.y) + begin * hidden);  // bf16 in y's memory
  }
  const size_t groups = n.size();
  // the grouped calls read their pointers from device memory
  auto** staged = s->pointers_host.as<void*>();
  for (size_t l = 0; l < 6; ++l) {
    for (size_t g = 0; g < groups; ++g) staged[l * groups + g] = ptr[l][g];
  }
  auto** device = s->pointers.as<void*>();
  KVP_CUDA_RETURN_IF_ERROR(
      cudaMemcpyAsync(device, staged, 6 * groups * sizeof(void*), cudaMemcpyHostToDevice, stream));
  const Projection up{2 * inter, hidden, const_cast<const void* const*>(device),
                      const_cast<const void* const*>(device + groups), device + 2 * groups};
  const Projection dn{hidden, inter, const_cast<const void* const*>(device + 3 * groups),
                      const_cast<const void* const*>(device + 4 * groups), device + 5 * groups};
  // experts with many rows each run faster as ordinary GEMMs than through the grouped call
  // (cuBLAS picks an sm80 kernel for it): H200, GPT-OSS-20B prefill of 2048 tokens, 256 rows an
  // expert: 43.2 ms one GEMM per expert, 56.4 ms grouped; Qwen3-30B-A3B, 128 rows: 61.5 against
  // 57.6 ms (docs/perf/model-cuda.md)
  const bool grouped = mode == MoeGemmMode::kGrouped && !s->grouped_refused &&
                       a.num_pairs < kMoeLoopMinRowsPerExpert * static_cast<int64_t>(n.size());
  if (grouped) {
    const cublasStatus_t st = run_grouped(handle, up, n);
    if (st == CUBLAS_STATUS_NOT_SUPPORTED || st == CUBLAS_STATUS_INVALID_VALUE) {
      s->grouped_refused = true;  // this cuBLAS lacks the grouped GEMM for these types: loop
      s->refusal = st;
    } else {
      KVP_RETURN_IF_ERROR(cublas_status(st, "grouped expert GEMM (gate_up)"));
    }
  }
  if (!grouped || s->grouped_refused) {
    KVP_RETURN_IF_ERROR(run_loop(handle, up, n, ptr[0], ptr[1], ptr[2]));
  }
  KVP_RETURN_IF_ERROR(cuda_status(
      detail::launch_moe_gemm_activation(s->h.data(), s->row_expert.as<int32_t>(), a.gate_up_bias,
                                         a.num_pairs, inter, a.activation, a.swiglu_alpha,
                                         a.swiglu_limit, s->act.data(), stream),
      "moe_gemm_activation_kernel"));
  if (grouped && !s->grouped_refused) {
    return cublas_status(run_grouped(handle, dn, n), "grouped expert GEMM (down)");
  }
  return run_loop(handle, dn, n, ptr[3], ptr[4], ptr[5]);
}

}  // namespace kvp::cuda
