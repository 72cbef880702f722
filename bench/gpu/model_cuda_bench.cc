// GPU benchmark of the CUDA model runner (docs/perf/model-cuda.md holds the numbers).
//
//   model_cuda_bench OUT.csv [--quick]
//   model_cuda_bench OUT.csv --tensor-parallel N   # the 8B shape whole and split over GPUs
//                                                 # 0 … N-1 (model/tensor_parallel.h), NCCL
//                                                 # then peer all-reduces, and the all-reduce
//                                                 # alone (all_reduce_rows)
//   model_cuda_bench OUT.csv --tensor-parallel N --70b   # the 70B shape, split only
//   model_cuda_bench OUT.csv --tensor-parallel N --moe   # the MoE shapes whole and split
//   model_cuda_bench OUT.csv --moe [NAME ...]  # the mixture-of-experts shapes only (or the named)
//   model_cuda_bench OUT.csv --decode-kernels  # 8B graph decode steps with 16-bit decode
//                                               # attention on the tensor-core kernel, then the
//                                               # per-lane one, twice
//   model_cuda_bench OUT.csv --prefill-kernels # 8B prefill of 2048 and 8192 tokens with the
//                                               # Hopper attention kernel, then the portable one
//   model_cuda_bench OUT.csv --gemm            # the decode products at 1…8 rows, cuBLAS against
//                                               # skinny_gemm.h (skinny_rows), nothing else
//   model_cuda_bench OUT.csv --profile-decode   # one eager 8B decode step (batch 1, context
//                                               # 512) between cudaProfilerStart/Stop, for ncu
//   model_cuda_bench OUT.csv --profile-moe-prefill   # one Qwen3-30B-A3B prefill of 2048 tokens
//                                                    # (experts grouped GEMM) likewise
//   model_cuda_bench OUT.csv --profile-moe-decode    # one eager Qwen3-30B-A3B decode step
//                                                    # (batch 1, context 512) likewise
//
// Models with random bf16 weights made on the device (make_random_cuda_backend) and a KV pool
// filled with random values:
//   llama31-8b : 32 layers, hidden 4096, 32 q / 8 KV heads, head dim 128, intermediate 14336,
//                vocab 128256, untied
//   smollm2-135m shape : 30 layers, hidden 576, 9 q / 3 KV heads, head dim 64, intermediate 1536,
//                vocab 49152, tied
//   qwen3-30b-a3b, qwen1.5-moe-a2.7b, gpt-oss-20b (--moe [NAME ...]): model/random_model.h's
//                shapes (all three, or the named ones); decode floors count
//                the attention and shared weights and the experts a step can touch at least
//                (min(experts, batch x top-k) per layer), prefill ceilings the active experts'
//                FLOPs
// Cases: decode steps (one new token per sequence, logits for each) at batch {1, 4, 64} x
// context {512, 4096}, launched eagerly and as CUDA graphs; batch 64 with logits for one row
// (the cost of the 33 MB of logits); prefill of 2048 tokens in one sequence (logits for its last
// token).
// Each step is one ForwardBackend::forward call, timed on the wall clock (host checks, metadata
// upload, every launch, the logits' copy back): median of the timed calls after warm-ups.
// Ceilings measured in the same run:
//   bandwidth : device-to-device copy of a 2 GiB buffer (bytes read + written)
//   matmul    : cuBLAS bf16 GEMM 2048 x 14336 x 4096, f32 accumulation
// Decode floor = (weight bytes read + KV bytes read) / bandwidth; prefill ceiling = model FLOPs
// / matmul rate. One fixed-format line per case on stdout, all of them in OUT.csv.
#include <cublas_v2.h>
#include <cuda_profiler_api.h>
#include <cuda_runtime_api.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <numeric>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "backend/cuda/device_buffer.h"
#include "backend/cuda/kernels.h"
#include "backend/cuda/paged_attention.h"
#include "model/cuda/cuda_forward_backend.h"
#include "model/cuda/nccl_library.h"
#include "model/cuda/peer_all_reduce.h"
#include "model/cuda/skinny_gemm.h"
#include "model/random_model.h"
#include "model/tensor_parallel.h"

namespace kvp::cuda {
namespace {

void check_status(const Status& s, const char* what) {
  if (!s.is_ok()) {
    std::fprintf(stderr, "%s: %s\n", what, s.to_string().c_str());
    std::exit(1);
  }
}

void check_cuda(cudaError_t e, const char* what) {
  if (e != cudaSuccess) {
    std::fprintf(stderr, "%s failed: %s\n", what, cudaGetErrorString(e));
    std::exit(1);
  }
}

template <typename T>
T value_or_die(Result<T> r, const char* what) {
  check_status(r.status(), what);
  return std::move(r).value();
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0.0 : v[v.size() / 2];
}

// Bytes per second of a device-to-device copy, counting bytes read and written.
double copy_bandwidth() {
  const size_t bytes = size_t{2} << 30;
  DeviceBuffer a = value_or_die(DeviceBuffer::allocate(bytes), "copy buffer");
  DeviceBuffer b = value_or_die(DeviceBuffer::allocate(bytes), "copy buffer");
  check_cuda(cudaMemset(a.data(), 1, bytes), "cudaMemset");
  cudaEvent_t start, stop;
  cudaEventCreate(&start);
  cudaEventCreate(&stop);
  std::vector<double> rates;
  for (int i = 0; i < 12; ++i) {
    cudaEventRecord(start);
    check_cuda(cudaMemcpyAsync(b.data(), a.data(), bytes, cudaMemcpyDeviceToDevice), "copy");
    cudaEventRecord(stop);
    check_cuda(cudaEventSynchronize(stop), "copy sync");
    float ms = 0;
    cudaEventElapsedTime(&ms, start, stop);
    if (i >= 2) rates.push_back(2.0 * bytes / (ms * 1e-3));
  }
  cudaEventDestroy(start);
  cudaEventDestroy(stop);
  return median(rates);
}

// FLOP/s of a cuBLAS bf16 GEMM [m][k] x [n][k]^T with f32 accumulation and bf16 output.
double gemm_rate(int64_t m, int64_t n, int64_t k) {
  DeviceBuffer x = value_or_die(DeviceBuffer::allocate(m * k * 2), "gemm x");
  DeviceBuffer w = value_or_die(DeviceBuffer::allocate(n * k * 2), "gemm w");
  DeviceBuffer y = value_or_die(DeviceBuffer::allocate(m * n * 2), "gemm y");
  check_cuda(detail::launch_fill_uniform(x.data(), true, m * k, 1, -1, 1, nullptr), "fill");
  check_cuda(detail::launch_fill_uniform(w.data(), true, n * k, 2, -0.02f, 0.02f, nullptr), "fill");
  cublasHandle_t h;
  cublasCreate(&h);
  const float alpha = 1, beta = 0;
  auto run = [&] {
    const cublasStatus_t st =
        cublasGemmEx(h, CUBLAS_OP_T, CUBLAS_OP_N, static_cast<int>(n), static_cast<int>(m),
                     static_cast<int>(k), &alpha, w.data(), CUDA_R_16BF, static_cast<int>(k),
                     x.data(), CUDA_R_16BF, static_cast<int>(k), &beta, y.data(), CUDA_R_16BF,
                     static_cast<int>(n), CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT);
    if (st != CUBLAS_STATUS_SUCCESS) {
      std::fprintf(stderr, "cublasGemmEx failed: %d\n", static_cast<int>(st));
      std::exit(1);
    }
  };
  cudaEvent_t start, stop;
  cudaEventCreate(&start);
  cudaEventCreate(&stop);
  for (int i = 0; i < 5; ++i) run();
  std::vector<double> rates;
  for (int i = 0; i < 10; ++i) {
    cudaEventRecord(start);
    for (int j = 0; j < 10; ++j) run();
    cudaEventRecord(stop);
    check_cuda(cudaEventSynchronize(stop), "gemm sync");
    float ms = 0;
    cudaEventElapsedTime(&ms, start, stop);
    rates.push_back(10.0 * 2.0 * m * n * k / (ms * 1e-3));
  }
  cublasDestroy(h);
  cudaEventDestroy(start);
  cudaEventDestroy(stop);
  return median(rates);
}

ModelSpec llama31_8b() {
  ModelSpec s;
  s.architecture = Architecture::kLlama;
  s.vocab_size = 128256;
  s.hidden_size = 4096;
  s.intermediate_size = 14336;
  s.num_layers = 32;
  s.num_q_heads = 32;
  s.num_kv_heads = 8;
  s.head_dim = 128;
  s.rms_norm_eps = 1e-5f;
  s.attention_scale = 1.0f / std::sqrt(128.0f);
  s.rope_global.theta = 500000.0;
  s.rope_global.scaling.kind = cpu::RopeScaling::Kind::kLlama3;
  s.rope_global.scaling.factor = 8.0;
  s.rope_global.scaling.low_freq_factor = 1.0;
  s.rope_global.scaling.high_freq_factor = 4.0;
  s.rope_global.scaling.original_max_position_embeddings = 8192;
  s.rope_local = s.rope_global;
  s.layer_is_sliding.assign(s.num_layers, false);
  s.eos_token_ids = {128001};
  return s;
}

// Llama-3.1-70B's dimensions (random weights: 141 GB in bf16, so only split over 2+ GPUs)
ModelSpec llama31_70b() {
  ModelSpec s = llama31_8b();
  s.hidden_size = 8192;
  s.intermediate_size = 28672;
  s.num_layers = 80;
  s.num_q_heads = 64;
  s.layer_is_sliding.assign(s.num_layers, false);
  return s;
}

ModelSpec smollm2_135m() {
  ModelSpec s;
  s.architecture = Architecture::kLlama;
  s.vocab_size = 49152;
  s.hidden_size = 576;
  s.intermediate_size = 1536;
  s.num_layers = 30;
  s.num_q_heads = 9;
  s.num_kv_heads = 3;
  s.head_dim = 64;
  s.rms_norm_eps = 1e-5f;
  s.tie_word_embeddings = true;
  s.attention_scale = 1.0f / 8.0f;
  s.rope_global.theta = 100000.0;
  s.rope_local = s.rope_global;
  s.layer_is_sliding.assign(s.num_layers, false);
  s.eos_token_ids = {2};
  return s;
}

// FLOPs of the weight matrices for one token (2 per multiply-add), lm_head excluded.
// Mixture-of-experts layers count the router, the token's top-k experts and a shared expert.
double matmul_flops_per_token(const ModelSpec& s) {
  const double h = s.hidden_size, d = s.head_dim, i = s.intermediate_size;
  const double attention = h * (s.num_q_heads + 2.0 * s.num_kv_heads) * d + s.num_q_heads * d * h;
  const double moe = h * s.num_experts + 3.0 * h * s.moe_intermediate_size * s.num_experts_per_tok +
                     3.0 * h * s.shared_expert_intermediate_size;
  double total = 0;
  for (int32_t l = 0; l < s.num_layers; ++l)
    total += attention + (s.layer_moe(l) ? moe : 3.0 * h * i);
  return 2.0 * total;
}

// Bytes of the routed experts' bf16 weights a decode step of `batch` tokens does not need to
// read even when every token picks other experts (0 for dense models).
double untouched_expert_bytes(const ModelSpec& s, int batch) {
  if (!s.is_moe()) return 0;
  const double per_expert = 3.0 * s.hidden_size * s.moe_intermediate_size * 2.0;
  const int touched = std::min(s.num_experts, batch * s.num_experts_per_tok);
  double bytes = 0;
  for (int32_t l = 0; l < s.num_layers; ++l) {
    if (s.layer_moe(l)) bytes += (s.num_experts - touched) * per_expert;
  }
  return bytes;
}

struct Row {
  std::string model, kind, mode;
  int batch = 0, context = 0, tokens = 0, logit_rows = 0;
  double step_us = 0, tok_per_s = 0, bound_us = 0, ratio = 0;
  std::string bound;
};

class ModelBench {
 public:
  ModelBench(std::string name, const ModelSpec& spec, int32_t max_tokens, double bandwidth,
             double matmul_rate, bool quick, int32_t tensor_parallel = 1)
      : name_(std::move(name)),
        spec_(spec),
        bandwidth_(bandwidth),
        matmul_rate_(matmul_rate),
        quick_(quick) {
    backend_ = value_or_die(make_random_cuda_backend(spec, 1234, 0, tensor_parallel),
                            "make_random_cuda_backend");
    if (tensor_parallel > 1) {
      auto& split = static_cast<TensorParallelBackend&>(*backend_);
      for (int32_t r = 0; r < split.num_ranks(); ++r) {
        ranks_.push_back(&static_cast<CudaForwardBackend&>(split.rank(r)));
      }
      bandwidth_ *= tensor_parallel;  // every GPU reads its share at the copy bandwidth
      matmul_rate_ *= tensor_parallel;
      name_ += "-tp" + std::to_string(tensor_parallel);
    } else {
      ranks_.push_back(&static_cast<CudaForwardBackend&>(*backend_));
    }
    num_blocks_ = (max_tokens + kBlockSize - 1) / kBlockSize + 64;
    // every cache group (GPT-OSS: the global and the sliding-window layers) gets a pool of
    // num_blocks_ and the same block tables; window layers read only their window's blocks
    std::vector<KvLayout> layouts;
    for (int32_t g = 0; g < backend_->num_cache_groups(); ++g) {
      layouts.push_back(backend_->group_layout(g, num_blocks_, kBlockSize, DType::BF16));
    }
    check_status(backend_->allocate_kv(layouts), "allocate_kv");
    double kv_bytes = 0.0;
    for (const KvLayout& layout : layouts) kv_bytes += static_cast<double>(layout.size_bytes());
    for (CudaForwardBackend* rank : ranks_) check_status(rank->fill_kv_random(7), "fill_kv_random");
    // blocks handed out in a shuffled order, as a long-running pool would
    block_order_.resize(num_blocks_);
    std::iota(block_order_.begin(), block_order_.end(), 0);
    std::shuffle(block_order_.begin(), block_order_.end(), std::mt19937_64(42));
    weight_bytes_ = 0;  // split: every GPU's (embedding, norms and lm-head on each)
    for (CudaForwardBackend* rank : ranks_) weight_bytes_ += rank->runner().weight_bytes();
    std::printf("%s: %.2f GB of bf16 weights, KV pool %d blocks of %d tokens (%.2f GB)\n",
                name_.c_str(), weight_bytes_ / 1e9, num_blocks_, kBlockSize, kv_bytes / 1e9);
  }

  // Decode: `batch` sequences with `context` tokens after the step, logits for `logit_rows` of
  // them (0: all), as CUDA graphs or eagerly launched.
  Row decode(int batch, int context, bool graphs, int logit_rows = 0) {
    set_graphs(graphs);
    if (logit_rows == 0) logit_rows = batch;
    const int32_t blocks_per_seq = (context + kBlockSize - 1) / kBlockSize;
    std::vector<int32_t> tokens(batch), query_start(batch + 1), kv_lens(batch, context),
        rows(batch), tables(static_cast<size_t>(batch) * blocks_per_seq);
    std::vector<int64_t> slots(batch);
    for (int i = 0; i < batch; ++i) {
      tokens[i] = (i * 7919 + 11) % spec_.vocab_size;
      query_start[i + 1] = i + 1;
      rows[i] = i;
      for (int b = 0; b < blocks_per_seq; ++b) {
        tables[static_cast<size_t>(i) * blocks_per_seq + b] = block_order_[i * blocks_per_seq + b];
      }
      const int32_t pos = context - 1;
      slots[i] =
          int64_t{tables[static_cast<size_t>(i) * blocks_per_seq + pos / kBlockSize]} * kBlockSize +
          pos % kBlockSize;
    }
    rows.resize(logit_rows);
    const double us = time_step(tokens, query_start, kv_lens, slots, tables, blocks_per_seq, rows,
                                quick_ ? 5 : 30);
    // bytes one step must read: every weight matrix once (the embedding only for its rows when
    // the lm_head is separate), every cached K and V once
    const double embed_bytes = 2.0 * spec_.vocab_size * spec_.hidden_size;
    const double weights_read =
        spec_.tie_word_embeddings
            ? weight_bytes_
            : weight_bytes_ - ranks_.size() * embed_bytes + 2.0 * batch * spec_.hidden_size;
    const double expert_bytes_skipped = untouched_expert_bytes(spec_, batch);
    // K and V of every cached token a layer attends to: the window's on sliding-window layers
    double kv_tokens = 0.0;
    for (int32_t l = 0; l < spec_.num_layers; ++l) {
      const bool sliding = !spec_.layer_is_sliding.empty() && spec_.layer_is_sliding[l];
      kv_tokens += sliding ? std::min(context, spec_.sliding_window) : context;
    }
    const double kv_read = 2.0 * batch * kv_tokens * 2.0 * spec_.num_kv_heads * spec_.head_dim;
    Row r;
    r.model = name_;
    r.kind = "decode";
    r.mode = graphs ? "graph" : "eager";
    r.logit_rows = logit_rows;
    r.batch = batch;
    r.context = context;
    r.tokens = batch;
    r.step_us = us;
    r.tok_per_s = batch / (us * 1e-6);
    r.bound_us = (weights_read - expert_bytes_skipped + kv_read) / bandwidth_ * 1e6;
    r.ratio = us / r.bound_us;
    r.bound = "floor: (weights + KV bytes) / copy bandwidth";
    return r;
  }

  // One eager decode step inside cudaProfilerStart/Stop (after warm-ups), for ncu.
  void profile_prefill(int length) {
    profile_next_ = true;
    prefill(length);
  }

  void profile_decode(int batch, int context) {
    set_graphs(false);
    profile_next_ = true;
    decode(batch, context, false);
  }

  // Prefill: one sequence of `length` tokens, logits for its last one.
  Row prefill(int length) {
    set_graphs(false);
    const int32_t blocks_per_seq = (length + kBlockSize - 1) / kBlockSize;
    std::vector<int32_t> tokens(length), query_start = {0, length}, kv_lens = {length},
                                         rows = {length - 1}, tables(blocks_per_seq);
    std::vector<int64_t> slots(length);
    for (int b = 0; b < blocks_per_seq; ++b) tables[b] = block_order_[b];
    for (int t = 0; t < length; ++t) {
      tokens[t] = (t * 31 + 5) % spec_.vocab_size;
      slots[t] = int64_t{tables[t / kBlockSize]} * kBlockSize + t % kBlockSize;
    }
    const double us = time_step(tokens, query_start, kv_lens, slots, tables, blocks_per_seq, rows,
                                quick_ ? 3 : 10);
    // causal attention: q·k and p·v over length²/2 pairs per head, or length x window on
    // sliding-window layers
    double attn_pairs = 0.0;
    for (int32_t l = 0; l < spec_.num_layers; ++l) {
      const bool sliding = !spec_.layer_is_sliding.empty() && spec_.layer_is_sliding[l];
      attn_pairs += sliding ? double(length) * std::min(length, spec_.sliding_window)
                            : length * (length / 2.0);
    }
    const double attn_flops = 2.0 * 2.0 * attn_pairs * spec_.num_q_heads * spec_.head_dim;
    const double flops = matmul_flops_per_token(spec_) * length + attn_flops +
                         2.0 * spec_.hidden_size * spec_.vocab_size;
    Row r;
    r.model = name_;
    r.kind = "prefill";
    r.mode = "eager";
    r.logit_rows = 1;
    r.batch = 1;
    r.context = length;
    r.tokens = length;
    r.step_us = us;
    r.tok_per_s = length / (us * 1e-6);
    r.bound_us = flops / matmul_rate_ * 1e6;
    r.ratio = us / r.bound_us;
    r.bound = "ceiling: model FLOPs / cuBLAS bf16 GEMM rate";
    return r;
  }

 private:
  static constexpr int32_t kBlockSize = 16;

  double time_step(const std::vector<int32_t>& tokens, const std::vector<int32_t>& query_start,
                   const std::vector<int32_t>& kv_lens, const std::vector<int64_t>& slots,
                   const std::vector<int32_t>& tables, int32_t max_blocks,
                   const std::vector<int32_t>& rows, int iterations) {
    ForwardBatch batch;
    batch.token_ids = tokens;
    batch.query_start = query_start;
    batch.kv_lens = kv_lens;
    for (int32_t g = 0; g < backend_->num_cache_groups(); ++g) {
      batch.groups.push_back({slots, tables, max_blocks});
    }
    batch.logit_rows = rows;
    std::vector<float> logits(rows.size() * spec_.vocab_size);
    for (int i = 0; i < 3; ++i) check_status(backend_->forward(batch, logits), "forward");
    if (profile_next_) {
      cudaProfilerStart();
      check_status(backend_->forward(batch, logits), "forward");
      cudaProfilerStop();
      profile_next_ = false;
      return 0.0;
    }
    std::vector<double> us;
    for (int i = 0; i < iterations; ++i) {
      const auto t0 = std::chrono::steady_clock::now();
      check_status(backend_->forward(batch, logits), "forward");
      const auto t1 = std::chrono::steady_clock::now();
      us.push_back(std::chrono::duration<double, std::micro>(t1 - t0).count());
    }
    for (float v : logits) {
      if (!std::isfinite(v)) {
        std::fprintf(stderr, "%s: non-finite logit\n", name_.c_str());
        std::exit(1);
      }
    }
    return median(us);
  }

  std::string name_;
  ModelSpec spec_;
  double bandwidth_, matmul_rate_;
  bool quick_;
  bool profile_next_ = false;
  void set_graphs(bool enabled) {
    for (CudaForwardBackend* rank : ranks_) rank->runner().set_graphs_enabled(enabled);
  }

 public:
  void set_moe_gemm_mode(MoeGemmMode mode) {
    for (CudaForwardBackend* rank : ranks_) rank->runner().set_moe_gemm_mode(mode);
  }

 private:
  std::unique_ptr<ForwardBackend> backend_;
  std::vector<CudaForwardBackend*> ranks_;  // the backend itself, or each rank of it
  int32_t num_blocks_ = 0;
  std::vector<int32_t> block_order_;
  double weight_bytes_ = 0;
};

// The decode step's products at 1…8 rows (the 8B shape's qkv, o, gate_up, down and lm-head),
// cuBLAS against each skinny_gemm.h variant and its default (launched as programmatic
// dependents, so one call's start overlaps the last's end, and not): 32 calls in a CUDA graph
// cycling over enough copies of the weights (>= 256 MB) that L2 (50 MB) holds none of them between
// uses, replayed 10 times; the median per call, and the ratio to weight bytes / copy bandwidth.
void skinny_rows(double bandwidth) {
  struct Product {
    const char* name;
    int64_t in, out;
    bool y_f32;
  };
  const Product products[] = {{"qkv", 4096, 6144, true},
                              {"o", 4096, 4096, true},
                              {"gate_up", 4096, 28672, false},
                              {"down", 14336, 4096, true},
                              {"lm_head", 4096, 128256, true}};
  cudaStream_t stream;
  check_cuda(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), "stream");
  cublasHandle_t h;
  cublasCreate(&h);
  cublasSetStream(h, stream);
  DeviceBuffer workspace = value_or_die(DeviceBuffer::allocate(32 << 20), "workspace");
  cublasSetWorkspace(h, workspace.data(), 32 << 20);
  cudaEvent_t start, stop;
  cudaEventCreate(&start);
  cudaEventCreate(&stop);
  for (const Product& p : products) {
    const int64_t bytes = p.in * p.out * 2;
    const int64_t copies = std::max<int64_t>(2, ((int64_t{256} << 20) + bytes - 1) / bytes);
    std::vector<DeviceBuffer> weights;
    for (int64_t c = 0; c < copies; ++c) {
      weights.push_back(value_or_die(DeviceBuffer::allocate(bytes), "weights"));
      check_cuda(detail::launch_fill_uniform(weights.back().data(), true, p.in * p.out, 3 + c,
                                             -0.02f, 0.02f, stream),
                 "fill");
    }
    DeviceBuffer x = value_or_die(DeviceBuffer::allocate(8 * p.in * 2), "x");
    DeviceBuffer y = value_or_die(DeviceBuffer::allocate(8 * p.out * 4), "y");
    check_cuda(detail::launch_fill_uniform(x.data(), true, 8 * p.in, 1, -1, 1, stream), "fill");
    for (int64_t rows : {1, 2, 4, 8}) {
      // variant -2: cuBLAS; -1: the default choice; 0…: each variant
      const auto time = [&](int variant, bool dependent = true) {
        const auto call = [&](int64_t i) {
          const void* w = weights[size_t(i % copies)].data();
          if (variant == -2) {
            const float alpha = 1, beta = 0;
            const cublasStatus_t st =
                cublasGemmEx(h, CUBLAS_OP_T, CUBLAS_OP_N, static_cast<int>(p.out),
                             static_cast<int>(rows), static_cast<int>(p.in), &alpha, w, CUDA_R_16BF,
                             static_cast<int>(p.in), x.data(), CUDA_R_16BF, static_cast<int>(p.in),
                             &beta, y.data(), p.y_f32 ? CUDA_R_32F : CUDA_R_16BF,
                             static_cast<int>(p.out), CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT);
            if (st != CUBLAS_STATUS_SUCCESS) std::exit(1);
          } else {
            detail::SkinnyLaunch how;
            how.variant = variant;
            how.dependent = dependent;
            check_cuda(detail::launch_skinny_gemm(x.data(), w, y.data(), p.y_f32, rows, p.in, p.out,
                                                  stream, how),
                       "skinny gemm");
          }
        };
        for (int64_t i = 0; i < copies; ++i) call(i);  // eager warm-up (cuBLAS picks here)
        cudaGraph_t g = nullptr;
        cudaGraphExec_t exec = nullptr;
        check_cuda(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal), "capture");
        for (int64_t i = 0; i < 32; ++i) call(i);
        check_cuda(cudaStreamEndCapture(stream, &g), "end capture");
        check_cuda(cudaGraphInstantiate(&exec, g, 0), "instantiate");
        cudaGraphDestroy(g);
        check_cuda(cudaGraphLaunch(exec, stream), "launch");
        std::vector<double> us;
        for (int rep = 0; rep < 10; ++rep) {
          cudaEventRecord(start, stream);
          check_cuda(cudaGraphLaunch(exec, stream), "launch");
          cudaEventRecord(stop, stream);
          check_cuda(cudaEventSynchronize(stop), "sync");
          float ms = 0;
          cudaEventElapsedTime(&ms, start, stop);
          us.push_back(ms * 1e3 / 32);
        }
        cudaGraphExecDestroy(exec);
        return median(us);
      };
      const double floor_us = double(bytes) / bandwidth * 1e6;
      std::printf("gemm %-7s %5lld x %6lld rows %lld: floor %7.2f us  cublas %7.2f", p.name,
                  static_cast<long long>(p.in), static_cast<long long>(p.out),
                  static_cast<long long>(rows), floor_us, time(-2));
      for (int v = 0; v < detail::kSkinnyVariants; ++v) std::printf("  v%d %7.2f", v, time(v));
      const double chosen = time(-1);
      std::printf("  default %7.2f us (%.2f of floor), not dependent %7.2f\n", chosen,
                  chosen / floor_us, time(-1, false));
      std::fflush(stdout);
    }
  }
  cublasDestroy(h);
  cudaEventDestroy(start);
  cudaEventDestroy(stop);
  cudaStreamDestroy(stream);
}

// One all-reduce's time over GPUs 0..n-1, NCCL and PeerAllReduce: 64 calls of `count` floats
// captured in a CUDA graph per GPU (a decode step's 2 x 32 layers), replayed 20 times after 3
// warm-ups; the median of 5 such timings, per call.
void all_reduce_rows(int32_t n) {
  std::vector<int> devices(n);
  std::iota(devices.begin(), devices.end(), 0);
  const NcclLibrary* nccl = value_or_die(NcclLibrary::get(), "NcclLibrary::get");
  const std::vector<ncclComm_t> comms = value_or_die(nccl->init_all(devices), "init_all");
  constexpr int64_t kMax = 256 * 4096;
  const std::shared_ptr<PeerAllReduce> peer =
      value_or_die(PeerAllReduce::create(devices, kMax), "PeerAllReduce::create");
  std::vector<cudaStream_t> streams(n);
  std::vector<DeviceBuffer> data;
  for (int32_t r = 0; r < n; ++r) {
    check_cuda(cudaSetDevice(r), "cudaSetDevice");
    check_cuda(cudaStreamCreateWithFlags(&streams[r], cudaStreamNonBlocking), "stream");
    data.push_back(value_or_die(DeviceBuffer::allocate(kMax * 4), "allocate"));
    check_cuda(cudaMemset(data.back().data(), 0, kMax * 4), "memset");
  }
  for (const char* mode : {"nccl", "peer"}) {
    for (int64_t count : {int64_t{4096}, int64_t{16384}, int64_t{64 * 4096}}) {
      // a thread per GPU, as the runner has: NCCL's communicators of one process meet inside
      // each call, so one thread calling for every GPU in turn would wait on itself
      const auto on_every_gpu = [&](const auto& body) {
        std::vector<std::thread> threads;
        for (int32_t r = 0; r < n; ++r) {
          threads.emplace_back([&, r] {
            check_cuda(cudaSetDevice(r), "cudaSetDevice");
            body(r);
          });
        }
        for (std::thread& t : threads) t.join();
      };
      const auto all_reduce = [&](int32_t r) {
        float* d = data[r].as<float>();
        check_status(std::string(mode) == "peer"
                         ? peer->run(r, d, count, streams[r])
                         : nccl->all_reduce_sum(d, count, comms[r], streams[r]),
                     mode);
      };
      std::vector<cudaGraphExec_t> execs(n);
      on_every_gpu([&](int32_t r) {
        // one call eagerly first: NCCL connects the GPUs at its first call, which a capture
        // cannot hold
        all_reduce(r);
        check_cuda(cudaStreamSynchronize(streams[r]), "sync");
        cudaGraph_t g = nullptr;
        check_cuda(cudaStreamBeginCapture(streams[r], cudaStreamCaptureModeThreadLocal), "capture");
        for (int call = 0; call < 64; ++call) all_reduce(r);
        check_cuda(cudaStreamEndCapture(streams[r], &g), "end capture");
        check_cuda(cudaGraphInstantiate(&execs[r], g, 0), "instantiate");
        cudaGraphDestroy(g);
      });
      const auto replay = [&](int times) {
        on_every_gpu([&](int32_t r) {
          for (int t = 0; t < times; ++t) {
            check_cuda(cudaGraphLaunch(execs[r], streams[r]), "launch");
          }
          check_cuda(cudaStreamSynchronize(streams[r]), "sync");
        });
      };
      replay(3);
      std::vector<double> us;
      for (int rep = 0; rep < 5; ++rep) {
        const auto t0 = std::chrono::steady_clock::now();
        replay(20);
        us.push_back(
            std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0)
                .count() /
            (20 * 64));
      }
      std::printf("all-reduce %-4s over %d GPUs, %7lld floats (%4lld KB): %7.2f us a call\n", mode,
                  n, static_cast<long long>(count), static_cast<long long>(count * 4 / 1024),
                  median(us));
      std::fflush(stdout);
      for (int32_t r = 0; r < n; ++r) cudaGraphExecDestroy(execs[r]);
    }
  }
  for (int32_t r = 0; r < n; ++r) {
    cudaSetDevice(r);
    cudaStreamDestroy(streams[r]);
    nccl->destroy(comms[r]);
  }
  cudaSetDevice(0);
}

int run(int argc, char** argv) {
  if (argc < 2) {
    std::fprintf(stderr,
                 "usage: model_cuda_bench OUT.csv [--quick | --moe | --gemm | --tensor-parallel N "
                 "[--70b | --moe] | --prefill-kernels | --decode-kernels | --profile-decode | "
                 "--profile-moe-prefill | --profile-moe-decode]\n");
    return 2;
  }
  const bool quick = argc > 2 && std::string(argv[2]) == "--quick";
  const bool profile = argc > 2 && std::string(argv[2]) == "--profile-decode";
  const bool moe = argc > 2 && std::string(argv[2]) == "--moe";
  const bool profile_moe = argc > 2 && std::string(argv[2]) == "--profile-moe-prefill";
  const bool profile_moe_decode = argc > 2 && std::string(argv[2]) == "--profile-moe-decode";
  const bool gemm_only = argc > 2 && std::string(argv[2]) == "--gemm";
  const bool prefill_kernels = argc > 2 && std::string(argv[2]) == "--prefill-kernels";
  const bool decode_kernels = argc > 2 && std::string(argv[2]) == "--decode-kernels";
  const int32_t tensor_parallel =
      argc > 3 && std::string(argv[2]) == "--tensor-parallel" ? std::atoi(argv[3]) : 1;
  const bool shape_70b = tensor_parallel > 1 && argc > 4 && std::string(argv[4]) == "--70b";
  const bool moe_split = tensor_parallel > 1 && argc > 4 && std::string(argv[4]) == "--moe";
  int count = 0;
  if (cudaGetDeviceCount(&count) != cudaSuccess || count == 0) {
    std::fprintf(stderr, "model_cuda_bench: no CUDA device\n");
    return 1;
  }
  cudaDeviceProp prop{};
  cudaGetDeviceProperties(&prop, 0);
  if (profile) {
    ModelBench bench("llama31-8b", llama31_8b(), 4096, 1.0, 1.0, true);
    bench.profile_decode(1, 512);
    return 0;
  }
  if (profile_moe || profile_moe_decode) {
    const ModelSpec spec = value_or_die(random_model_spec("qwen3-30b-a3b"), "random_model_spec");
    ModelBench bench("qwen3-30b-a3b", spec, 4096, 1.0, 1.0, true);
    if (profile_moe) {
      bench.profile_prefill(2048);
    } else {
      bench.profile_decode(1, 512);
    }
    return 0;
  }
  const double bandwidth = copy_bandwidth();
  const double matmul = gemm_rate(2048, 14336, 4096);
  std::printf(
      "device: %s\nceilings: copy bandwidth %.0f GB/s (read + written), cuBLAS bf16 GEMM "
      "2048x14336x4096 %.1f TFLOP/s\n",
      prop.name, bandwidth / 1e9, matmul / 1e12);
  std::vector<Row> rows;
  const auto print = [](const Row& r) {
    std::printf(
        "%-17s %-7s %-5s batch %3d ctx %5d rows %3d : %9.1f us %9.0f tok/s  %s %8.1f us  ratio "
        "%.2f\n",
        r.model.c_str(), r.kind.c_str(), r.mode.c_str(), r.batch, r.context, r.logit_rows,
        r.step_us, r.tok_per_s, r.kind == "decode" ? "floor  " : "ceiling", r.bound_us, r.ratio);
    std::fflush(stdout);
  };
  if (gemm_only) {
    skinny_rows(bandwidth);
    return 0;
  }
  if (prefill_kernels) {
    // the same prompts through the attention kernel paged_attention picks (on an H100 the wgmma
    // one) and through the portable mma.sync kernel
    ModelBench bench("llama31-8b", llama31_8b(), 8192 + 2048, bandwidth, matmul, quick);
    for (const PrefillKernel kernel : {PrefillKernel::Auto, PrefillKernel::Portable}) {
      set_prefill_kernel(kernel);
      for (const int length : {2048, 8192}) {
        rows.push_back(bench.prefill(length));
        rows.back().mode =
            kernel == PrefillKernel::Auto ? "eager, attention auto" : "eager, attention portable";
        print(rows.back());
      }
    }
    set_prefill_kernel(PrefillKernel::Auto);
  }
  if (decode_kernels) {
    // 8B graph decode steps with 16-bit decode attention on the library's choice, the
    // tensor-core kernel and the per-lane kernel, alternated twice
    ModelBench bench("llama31-8b", llama31_8b(), 64 * 4096 + 2048, bandwidth, matmul, quick);
    for (int round = 0; round < 2; ++round) {
      for (const DecodeKernel kernel :
           {DecodeKernel::Auto, DecodeKernel::TensorCores, DecodeKernel::Lanes}) {
        set_decode_kernel(kernel);
        for (int batch : {1, 4, 64}) {
          for (int context : {512, 4096}) {
            rows.push_back(bench.decode(batch, context, true));
            rows.back().mode = kernel == DecodeKernel::Auto          ? "graph, decode auto"
                               : kernel == DecodeKernel::TensorCores ? "graph, decode tensor cores"
                                                                     : "graph, decode per-lane";
            print(rows.back());
          }
        }
      }
    }
    set_decode_kernel(DecodeKernel::Auto);
  }
  if (tensor_parallel > 1) all_reduce_rows(tensor_parallel);
  if (shape_70b) {
    // the 70B shape split only (it does not fit one GPU), NCCL then peer all-reduces; a pool of
    // 18K tokens (3 GB a GPU at TP 2) so that it fits 80 GB cards too
    for (const char* mode : {"nccl", "peer"}) {
      setenv("KVP_TP_ALL_REDUCE", mode, 1);
      ModelBench bench(std::string("llama31-70b-") + mode, llama31_70b(), 4 * 4096 + 2048,
                       bandwidth, matmul, false, tensor_parallel);
      for (int batch : {1, 4}) {
        for (int context : {512, 4096}) {
          rows.push_back(bench.decode(batch, context, true));
          print(rows.back());
        }
      }
      rows.push_back(bench.prefill(2048));
      print(rows.back());
    }
  } else if (moe_split) {
    // the mixture-of-experts shapes whole, then every expert split by its intermediate units
    // (peer all-reduces where they apply, NCCL for the rest)
    for (const char* name : {"qwen3-30b-a3b", "qwen1.5-moe-a2.7b"}) {
      const ModelSpec spec = value_or_die(random_model_spec(name), "random_model_spec");
      for (const int32_t n : {1, tensor_parallel}) {
        ModelBench bench(name, spec, 64 * 512 + 2048, bandwidth, matmul, false, n);
        for (int batch : {1, 4, 64}) {
          rows.push_back(bench.decode(batch, 512, true));
          print(rows.back());
        }
        rows.push_back(bench.prefill(2048));
        print(rows.back());
      }
    }
  } else if (tensor_parallel > 1) {
    // whole, then split with NCCL all-reduces, then with decode-sized ones over peer memory
    // (each freed before the next); floors and ceilings scale with the GPUs
    for (const char* mode : {"whole", "nccl", "peer"}) {
      const int32_t n = std::string(mode) == "whole" ? 1 : tensor_parallel;
      setenv("KVP_TP_ALL_REDUCE", mode, 1);
      ModelBench bench(std::string("llama31-8b") + (n > 1 ? std::string("-") + mode : ""),
                       llama31_8b(), 64 * 4096 + 2048, bandwidth, matmul, false, n);
      for (int batch : {1, 4, 64}) {
        for (int context : {512, 4096}) {
          rows.push_back(bench.decode(batch, context, true));
          print(rows.back());
        }
      }
      rows.push_back(bench.prefill(2048));
      print(rows.back());
    }
  }
  if (moe) {
    // --moe [NAME ...]: the named shapes only
    std::vector<std::string> names(argv + 3, argv + argc);
    if (names.empty()) names = {"qwen3-30b-a3b", "qwen1.5-moe-a2.7b", "gpt-oss-20b"};
    for (const std::string& name : names) {
      const ModelSpec spec = value_or_die(random_model_spec(name), "random_model_spec");
      ModelBench bench(name, spec, 64 * 512 + 2048, bandwidth, matmul, quick);
      for (int batch : {1, 4, 64}) {
        rows.push_back(bench.decode(batch, 512, true));
        print(rows.back());
      }
      for (int batch : {1, 4, 64}) {
        rows.push_back(bench.decode(batch, 512, false));
        print(rows.back());
      }
      // prompt steps: the experts' grouped GEMMs (the default), one GEMM per expert, the
      // decode kernels (moe_gemm.h)
      for (const int length : {2048, 512}) {
        for (const MoeGemmMode mode :
             {MoeGemmMode::kGrouped, MoeGemmMode::kLoop, MoeGemmMode::kKernels}) {
          bench.set_moe_gemm_mode(mode);
          rows.push_back(bench.prefill(length));
          rows.back().mode = mode == MoeGemmMode::kGrouped ? "eager, experts grouped GEMM"
                             : mode == MoeGemmMode::kLoop  ? "eager, experts GEMM per expert"
                                                           : "eager, experts decode kernels";
          print(rows.back());
        }
      }
      bench.set_moe_gemm_mode(MoeGemmMode::kGrouped);
    }
  }
  if (tensor_parallel == 1 && !moe && !prefill_kernels && !decode_kernels) {
    ModelBench bench("llama31-8b", llama31_8b(), 64 * 4096 + 2048, bandwidth, matmul, quick);
    for (int batch : {1, 4, 64}) {
      for (int context : {512, 4096}) {
        for (bool graphs : {false, true}) {
          rows.push_back(bench.decode(batch, context, graphs));
          print(rows.back());
        }
      }
    }
    // the same step with one logit row: what copying 64 x 128256 f32 logits to the host costs
    rows.push_back(bench.decode(64, 512, true, 1));
    print(rows.back());
    rows.push_back(bench.prefill(2048));
    print(rows.back());
  }
  if (tensor_parallel == 1 && !moe && !prefill_kernels && !decode_kernels) {
    ModelBench bench("smollm2-135m", smollm2_135m(), 4096, bandwidth, matmul, quick);
    for (bool graphs : {false, true}) {
      rows.push_back(bench.decode(1, 512, graphs));
      print(rows.back());
    }
    rows.push_back(bench.prefill(2048));
    print(rows.back());
  }
  FILE* csv = std::fopen(argv[1], "w");
  if (csv == nullptr) {
    std::fprintf(stderr, "cannot write %s\n", argv[1]);
    return 1;
  }
  std::fprintf(csv,
               "device,model,kind,mode,batch,context,tokens,logit_rows,step_us,tok_per_s,bound_us,"
               "ratio,bound,copy_gbps,gemm_tflops\n");
  // RFC 4180: a text field with a comma or a quote ("graph, decode auto") goes in quotes, its
  // quotes doubled, so a CSV reader sees the columns the header names.
  auto field = [](const std::string& text) {
    if (text.find_first_of(",\"\n") == std::string::npos) return text;
    std::string out = "\"";
    for (char ch : text) out += ch == '"' ? std::string("\"\"") : std::string(1, ch);
    return out + "\"";
  };
  for (const Row& r : rows) {
    std::fprintf(csv, "%s,%s,%s,%s,%d,%d,%d,%d,%.2f,%.1f,%.2f,%.3f,%s,%.1f,%.1f\n",
                 field(prop.name).c_str(), field(r.model).c_str(), field(r.kind).c_str(),
                 field(r.mode).c_str(), r.batch, r.context, r.tokens, r.logit_rows, r.step_us,
                 r.tok_per_s, r.bound_us, r.ratio, field(r.bound).c_str(), bandwidth / 1e9,
                 matmul / 1e12);
  }
  std::fclose(csv);
  return 0;
}

}  // namespace
}  // namespace kvp::cuda

int main(int argc, char** argv) { return kvp::cuda::run(argc, argv); }
