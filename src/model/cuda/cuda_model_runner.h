// CudaModelRunner: the forward pass of model/model_runner.h on one CUDA device, same semantics
// (the CPU runner is the oracle), bf16 weights and tensor-core GEMMs.
//
//   per step:  host checks of the batch → one pinned staging buffer → one async upload
//   embed(+scale) → rms_norm ─┐
//   per layer:  GEMM qkv (f32 out) → qkv_post: +bias, q/k norm, rope, → KV dtype, pad head_dim
//               (a copy into the pool ordered layer by layer: wait for this layer's blocks)
//               → cuda::launch_kv_write (int8 / fp8 pool: quantising) → cuda::paged_attention
//               (q bf16 over a bf16, int8 or fp8 pool, f16 over an f16 one; GPT-OSS's sinks) →
//               GEMM o (f32 out) (+ o bias)
//               (→ all-reduce of o when split over GPUs, model/tensor_parallel.h: NCCL, or
//                PeerAllReduce for decode-sized ones)
//               → residual_norm: (+post norm) x += o, xn = norm(x)
//               → GEMM gate_up (bf16 out) → gated activation → GEMM down (f32 out)
//                 (mixture-of-experts layers: router, top-k and the chosen experts instead,
//                  cuda_moe_layer.h; TP-split models have none)
//               (→ NCCL all-reduce of down when split)
//               → residual_norm: (+post norm) x += down, xn = next layer's norm(x)
//   logit rows: gather + final norm → GEMM lm_head (f32 out) → soft cap → host
//
// The residual stream x stays f32; GEMM inputs are bf16 with f32 accumulation (cuBLAS).
// Head dims the attention kernels lack (not 64/128/256) are zero-padded to the next supported
// one inside the runner: q and k pad lanes are zero (q·k unchanged), v pad lanes are dropped by
// zero columns in the padded o matrix. The device pools therefore hold padded_head_dim();
// CudaForwardBackend converts to the model's logical layout at its block image boundary.
#pragma once

#include <cublas_v2.h>
#include <cuda_runtime_api.h>

#include <array>
#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <vector>

#include "backend/cuda/device_buffer.h"
#include "backend/cuda/kv_pool.h"
#include "backend/cuda/paged_attention.h"
#include "model/cuda/cuda_device_sampler.h"
#include "model/cuda/cuda_moe_layer.h"
#include "model/cuda/moe_gemm.h"
#include "model/cuda/nccl_library.h"
#include "model/cuda/peer_all_reduce.h"
#include "model/cuda/skinny_gemm.h"
#include "model/forward_backend.h"
#include "model/model_runner.h"
#include "model/model_spec.h"
#include "model/tensor_parallel.h"
#include "model/weight_source.h"

namespace kvp::cuda {

struct DeviceLayerWeights {
  DeviceBuffer attn_norm;       // [hidden] f32 (Gemma's 1 + w folded in)
  DeviceBuffer qkv;             // [q_dim + 2 kv_dim][hidden] bf16: q rows, k rows, v rows
  DeviceBuffer qkv_bias;        // [q_dim + 2 kv_dim] f32 or empty
  DeviceBuffer q_norm, k_norm;  // [head_dim] f32 or empty
  DeviceBuffer o;               // [hidden][num_q_heads * padded_head_dim] bf16, pad columns 0
  DeviceBuffer o_bias;          // [hidden] f32 or empty (GPT-OSS)
  DeviceBuffer sinks;           // [num_q_heads] f32 attention sinks or empty (GPT-OSS)
  DeviceBuffer post_attn_norm;  // [hidden] f32 or empty
  DeviceBuffer mlp_norm;        // [hidden] f32
  // The dense MLP; in a mixture-of-experts layer the shared expert's (intermediate:
  // shared_expert_intermediate_size), empty where it has none.
  DeviceBuffer gate_up;        // [2 * intermediate][hidden] bf16: gate rows, then up rows
  DeviceBuffer down;           // [hidden][intermediate] bf16
  DeviceBuffer post_mlp_norm;  // [hidden] f32 or empty
  DeviceMoeWeights moe;        // the router and experts of a mixture-of-experts layer, else empty
};

class CudaModelRunner {
 public:
  // Reads each tensor through source.read_f32, converts it to bf16 and uploads it before reading
  // the next, so host memory holds at most one f32 tensor. Errors name the tensor (from the
  // source) or the CUDA call.
  static Result<std::unique_ptr<CudaModelRunner>> load(const ModelSpec& spec,
                                                       const WeightSource& source,
                                                       const LoadProgress& progress, int device);
  // Random bf16 weights made on the device (uniform, scaled by 1/sqrt(fan-in); norms 1), for
  // benchmarks of shapes nobody downloads. With a shard of size > 1 the runner is that rank of
  // `spec` split (model/tensor_parallel.h), its weights exactly its share of the unsplit model's
  // of the same seed.
  static Result<std::unique_ptr<CudaModelRunner>> random(const ModelSpec& spec, uint64_t seed,
                                                         int device, TensorShard shard = {});
  ~CudaModelRunner();
  CudaModelRunner(const CudaModelRunner&) = delete;
  CudaModelRunner& operator=(const CudaModelRunner&) = delete;

  const ModelSpec& spec() const { return spec_; }
  int device() const { return device_; }
  cudaStream_t stream() const { return stream_; }
  int32_t padded_head_dim() const { return padded_head_dim_; }
  // Bytes of every weight matrix and vector on the device.
  size_t weight_bytes() const { return weight_bytes_; }

  int32_t num_cache_groups() const { return static_cast<int32_t>(group_layers_.size()); }
  const std::vector<int32_t>& group_layers(int32_t group) const { return group_layers_[group]; }
  bool group_is_sliding(int32_t group) const;

  // Same contract as ModelRunner::forward, with each group's KV in pools[g] (head_dim
  // padded_head_dim(), bf16 or f16). Bad batches → invalid_argument, nothing enqueued.
  // Returns when logits (host) are filled.
  Status forward(const ForwardBatch& batch, std::span<DeviceKvPool> pools, std::span<float> logits);
  // ForwardBackend::forward_summarized's contract: summaries of every logit row (reduced on the
  // device), full logits only of the rows full_rows lists.
  Status forward_summarized(const ForwardBatch& batch, std::span<DeviceKvPool> pools,
                            std::span<const int32_t> full_rows, std::span<float> logits,
                            std::span<LogitRowSummary> summaries);
  // ForwardBackend::forward_into_rows's contract: forward (summaries empty) or
  // forward_summarized, logits row i at logits[i * row_stride].
  Status forward_into_rows(const ForwardBatch& batch, std::span<DeviceKvPool> pools,
                           std::span<const int32_t> full_rows, std::span<float> logits,
                           size_t row_stride, std::span<LogitRowSummary> summaries);
  // ForwardBackend::forward_sampled's contract: as forward_summarized, and samples' requests
  // drawn on the device from the step's logits rows (cuda_device_sampler.h).
  Status forward_sampled(const ForwardBatch& batch, std::span<DeviceKvPool> pools,
                         std::span<const int32_t> full_rows, std::span<float> logits,
                         std::span<LogitRowSummary> summaries, const DeviceSampleBatch& samples,
                         std::span<DeviceSample> results);

  // Copies ordered layer by layer (CudaForwardBackend::order_after_transfers): the next step's
  // layer l of `group` waits for per_slot[its index within the group] before it touches the
  // pool, so the step overlaps the copy (into the pool: it reads what lands; out of it: it
  // writes blocks being read out). A step with waits pending runs eagerly, not as a graph (a
  // graph waits for nothing inside it). Anything else that may touch the pool first waits for
  // all of them (flush_layer_waits): a block copy or image. forget_layer_waits drops waits on
  // events of copies that are done (their events go back to be recorded again).
  void wait_layers_before(int32_t group, std::span<const cudaEvent_t> per_slot);
  Status flush_layer_waits();
  void forget_layer_waits(std::span<const cudaEvent_t> done);

  // Tensor parallelism: this runner is one rank of a split model (loaded with shard_spec's spec
  // and a ShardedWeightSource, or random with its shard); the o and down projections' partial
  // outputs are summed over the ranks with NCCL on the runner's stream (inside graphs too).
  // keep_alive owns the communicator's lifetime. Every step, after allocating what it needs and
  // before its first launch, the rank meets the others at gate (RankGate::arrive(rank, ok)): a
  // cudaFree on one GPU waits for its peers' kernels, and a peer's all-reduce kernel would wait
  // for this rank; and a rank that could not prepare its step stops all of them. Eager steps
  // meet there again before each all-reduce (all_reduce in the .cc says why).
  void set_all_reduce(const NcclLibrary* nccl, ncclComm_t comm, std::function<bool(bool)> gate,
                      std::shared_ptr<const void> keep_alive) {
    nccl_ = nccl;
    comm_ = comm;
    gate_ = std::move(gate);
    comm_keep_alive_ = std::move(keep_alive);
    clear_graphs();
  }

  // Tensor parallelism: all-reduces of at most peer->capacity() floats go through peer (one
  // kernel over NVLink peer memory) instead of NCCL; rank is this runner's.
  void set_peer_all_reduce(std::shared_ptr<const PeerAllReduce> peer, int32_t rank) {
    peer_ = std::move(peer);
    rank_ = rank;
    clear_graphs();
  }

  // Whether decode-only batches run as CUDA graphs (default on; the environment variable
  // KVP_CUDA_GRAPHS=0 turns them off, as does this setter, for benchmarks that compare).
  void set_graphs_enabled(bool enabled) {
    graphs_enabled_ = enabled;
    if (!enabled) clear_graphs();
  }
  // How steps of an MoE model with at least KVP_MOE_GEMM_MIN_TOKENS tokens (default 16; such a
  // step, decode too, runs eagerly, never as a graph) run the experts
  // (moe_gemm.h; default kGrouped, or KVP_MOE_GEMM=kernels|loop at creation), for benchmarks
  // that compare.
  void set_moe_gemm_mode(MoeGemmMode mode) { moe_gemm_mode_ = mode; }
  // Captured decode graphs (those whose capture succeeded).
  int32_t num_graphs() const {
    int32_t n = 0;
    for (const GraphEntry& e : graphs_) n += e.exec != nullptr ? 1 : 0;
    return n;
  }

 private:
  // The device shape of one step (padded for graphs) and where its metadata sits in the
  // staging buffer.
  struct StepShape {
    int32_t num_tokens = 0, num_seqs = 0, num_rows = 0, max_q_len = 0, max_kv_len = 0;
    std::array<int32_t, 2> max_blocks{};   // block-table width per group
    std::array<size_t, 2> table_offset{};  // int32 elements
    std::array<size_t, 2> slot_offset{};   // bytes
    size_t bytes = 0;
    DType kv_dtype = DType::BF16;
  };
  struct GraphKey {
    int32_t num_seqs = 0, num_rows = 0, max_kv_len = 0;
    DType kv_dtype = DType::BF16;
    std::array<int32_t, 2> max_blocks{}, num_blocks{}, block_size{};
    std::array<void*, 2> slab{};
    friend bool operator==(const GraphKey&, const GraphKey&) = default;
  };
  struct GraphEntry {
    GraphKey key;
    cudaGraphExec_t exec = nullptr;  // null: capture failed, this shape runs eagerly
  };
  static constexpr size_t kMaxGraphs = 64;

  CudaModelRunner() = default;
  Status init(const ModelSpec& spec, int device);
  size_t count_weight_bytes() const;  // every weight buffer on the device
  // Enqueues one step (metadata upload, every launch, logits download) on stream_.
  Status enqueue_step(const StepShape& shape, std::span<DeviceKvPool> pools);
  // Captures enqueue_step as a graph for `key` (a failed capture leaves the shape eager).
  void capture(const StepShape& shape, std::span<DeviceKvPool> pools, const GraphKey& key);
  void clear_graphs();
  // logits_host_ → the caller's buffer (several threads for large copies).
  // The staged logits rows (num_rows of logits_per_row) to logits, row i at i * row_stride
  // (0: packed).
  void copy_logits_out(std::span<float> logits, size_t num_rows, size_t row_stride) const;
  // full_rows null: every row's logits are wanted.
  Status check_batch(const ForwardBatch& batch, std::span<DeviceKvPool> pools,
                     const std::span<const int32_t>* full_rows, std::span<float> logits,
                     size_t num_summaries, size_t row_stride) const;
  // samples null: nothing sampled on the device.
  Status run(const ForwardBatch& batch, std::span<DeviceKvPool> pools,
             const std::span<const int32_t>* full_rows, std::span<float> logits,
             std::span<LogitRowSummary> summaries, const DeviceSampleBatch* samples = nullptr,
             std::span<DeviceSample> results = {}, size_t row_stride = 0);
  Status reserve(int64_t num_tokens, int64_t num_rows, size_t meta_bytes);
  Status gemm(const void* x, const void* w, void* y, bool y_f32, int64_t rows, int64_t in,
              int64_t out, const char* what);
  // Sums [count] f32 over the ranks in place (nothing when not split).
  Status all_reduce(void* data, int64_t count);
  // proj_ (this rank's part of the o or down projection) summed over the ranks, then
  // launch_residual_norm into x_ and xn_; with peer all-reduces at decode sizes one fused kernel.
  Status reduce_residual_norm(const float* post_w, const float* next_w, int32_t num_tokens,
                              float eps);
  // Runs `launch` (a collective) between the eager steps' drain-and-meet (all_reduce in the .cc).
  Status meet_around(const std::function<Status()>& launch);
  // The mixture-of-experts MLP of `layer` (cuda_moe_layer.cc): xn_ (and x_ for the router) in,
  // proj_ out, as the dense MLP's GEMMs. Clobbers xn_ and gate_up_.
  Status enqueue_moe_mlp(int32_t layer, int32_t num_tokens);
  // Its routing: logits, expert ids and weights, and the pairs grouped by expert into
  // moe_buffers_ (steps of at most detail::kMoeSmallStepTokens tokens in two fused kernels).
  Status enqueue_moe_route(int32_t layer, int32_t num_tokens);
  // Grows the attention workspace to what the step's attention launches need (so that nothing is
  // allocated once launches begin).
  Status reserve_attention_workspace(const StepShape& shape, std::span<DeviceKvPool> pools);

  ModelSpec spec_;
  int device_ = 0;
  int32_t padded_head_dim_ = 0;
  cudaStream_t stream_ = nullptr;
  cublasHandle_t cublas_ = nullptr;
  DeviceBuffer cublas_workspace_;
  size_t weight_bytes_ = 0;

  std::vector<std::vector<int32_t>> group_layers_;  // [group] -> model layer indices
  std::vector<int32_t> layer_group_;                // [layer] -> group
  std::vector<int32_t> layer_slot_;                 // [layer] -> index within its group

  DeviceBuffer embed_;       // [vocab][hidden] bf16
  DeviceBuffer lm_head_;     // [vocab][hidden] bf16, or empty when tied to embed_
  DeviceBuffer final_norm_;  // [hidden] f32
  DeviceBuffer inv_freq_global_, inv_freq_local_;  // [head_dim / 2] f32
  std::vector<DeviceLayerWeights> layers_;

  // Per-step buffers, grown on demand (capacity in tokens / logit rows).
  int64_t token_capacity_ = 0, row_capacity_ = 0;
  PinnedBuffer meta_host_;       // batch metadata staging (layout in forward)
  DeviceBuffer meta_device_;     // its device copy
  DeviceBuffer x_;               // [tokens][hidden] f32 residual stream
  DeviceBuffer xn_;              // [tokens][max(hidden, intermediate)] bf16 GEMM input
  DeviceBuffer qkv_;             // [tokens][q_dim + 2 kv_dim] f32
  DeviceBuffer q_, k_, v_;       // [tokens][heads][padded_head_dim] KV dtype
  DeviceBuffer attn_;            // [tokens][q_heads][padded_head_dim] KV dtype
  DeviceBuffer attn_bf16_;       // the same in bf16 (f16 pools only)
  DeviceBuffer proj_;            // [tokens][hidden] f32
  DeviceBuffer gate_up_;         // [tokens][2 * intermediate] bf16
  DeviceBuffer logits_;          // [rows][vocab] f32
  MoeBuffers moe_buffers_;       // mixture-of-experts models: the experts' per-step buffers
  PinnedBuffer logits_host_;     // [rows][vocab] f32
  DeviceBuffer summaries_;       // [rows] detail::RowSummary
  PinnedBuffer summaries_host_;  // [rows] detail::RowSummary
  DeviceSampler sampler_;        // sampled rows (forward_sampled)
  AttentionWorkspace attention_workspace_;
  const NcclLibrary* nccl_ = nullptr;  // null: not split
  ncclComm_t comm_ = nullptr;
  std::function<bool(bool)> gate_;
  bool capturing_ = false;  // enqueue_step is being captured into a graph
  // [layer]: events the next eager step waits for before the layer touches the pool
  // (wait_layers_before); layer_waits_pending_ when any is set
  std::vector<std::vector<cudaEvent_t>> layer_waits_;
  bool layer_waits_pending_ = false;
  std::shared_ptr<const PeerAllReduce> peer_;  // null: NCCL for every all-reduce
  int32_t rank_ = 0;
  std::shared_ptr<const void> comm_keep_alive_;
  bool graphs_enabled_ = true;
  bool skinny_gemm_ = true;  // products of <= 8 rows through skinny_gemm.h, not cuBLAS
  detail::SkinnyLaunch skinny_launch_;
  std::vector<GraphEntry> graphs_;  // captured decode steps (any buffer reallocation clears them)

  // Mixture-of-experts steps' expert GEMMs (moe_gemm.h): steps of at least moe_gemm_min_tokens_
  // tokens (prompt or decode; never captured) take them, in moe_gemm_mode_, with these buffers.
  MoeGemmScratch moe_gemm_;
  MoeGemmMode moe_gemm_mode_ = MoeGemmMode::kGrouped;
  int32_t moe_gemm_min_tokens_ = 0;
  // Whether a step of num_tokens tokens runs the experts as GEMMs (and so not as a graph).
  bool moe_step_takes_gemms(int64_t num_tokens) const {
    return spec_.is_moe() && moe_gemm_mode_ != MoeGemmMode::kKernels &&
           num_tokens >= moe_gemm_min_tokens_;
  }
};

}  // namespace kvp::cuda
