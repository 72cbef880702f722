// Tensor parallelism (Megatron-style): one model split across N ranks (GPUs of one host, or
// threads standing in for them on the CPU), driven by one engine.
//
//   rank r of N holds             q heads [r·Hq/N, (r+1)·Hq/N), kv heads [r·Hkv/N, …) (their
//                                 sinks too), the MLP's intermediate rows [r·I/N, …), and of
//                                 every expert (and a shared expert) its intermediate rows
//                                 [r·I_e/N, …), and the lm-head's vocabulary rows [r·V/N, …) (whole
//                                 where N does not divide V); embeddings, norms and routers whole;
//                                 biases added after a sum (o_proj's, the experts' down) on
//                                 rank 0 only, zero elsewhere
//   per layer, each rank:         qkv (its heads) → its heads' attention over its KV pool
//                                 → o (its columns: a partial sum) → ALL-REDUCE → residual
//                                 → gate_up (its rows) → down (its columns) → ALL-REDUCE → residual
//   logits:                       each rank its vocabulary share [rows][V/N], joined on the host
//                                 (summaries: combine_row_summaries)
//   the KV pool of rank r:        the same blocks as every other rank (one block table), with its
//                                 kv heads only; a block image (forward_backend.h) holds all heads
//
// What lives here (host code, every build): the shard arithmetic (shard_spec, which rows or
// columns of each weight a rank holds: ShardedWeightSource), TensorParallelBackend (a
// ForwardBackend over N rank backends: runs them side by side, one thread each, and joins and
// splits their block images so cache files do not depend on N), and the CPU ranks' all-reduce
// (make_cpu_tensor_parallel_backend: N ModelRunners on threads, partial outputs summed in rank
// order — the CPU emulation of the CUDA path that CI checks). The CUDA ranks' all-reduce is
// NCCL's (model/cuda/cuda_tensor_parallel.h).
#pragma once

#include <condition_variable>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <span>
#include <string>
#include <thread>
#include <vector>

#include "model/forward_backend.h"
#include "model/model_spec.h"
#include "model/weight_source.h"

namespace kvp {

// Most ranks kvpool splits a model over (GPUs of one host).
constexpr int32_t kMaxTensorParallel = 8;

struct TensorShard {
  int32_t rank = 0;
  int32_t size = 1;
};

// ok when `spec` splits over n ranks: 1 <= n <= kMaxTensorParallel and n divides the attention
// heads, the kv heads, the intermediate size (of a model with dense MLP layers) and the experts'
// and shared expert's intermediate sizes; else invalid_argument naming the numbers.
Status check_tensor_parallel(const ModelSpec& spec, int32_t n);

// The spec a rank runs: heads, kv heads and the intermediate sizes (dense, experts', shared
// expert's) divided by shard.size, and its vocabulary share of the logits (logit_begin /
// logit_count) where shard.size divides the vocabulary (everything else, attention scale
// included, unchanged). requires:
// check_tensor_parallel(spec, size) ok.
ModelSpec shard_spec(const ModelSpec& spec, TensorShard shard);

// How a rank's copy of one weight relates to the whole tensor (Hugging Face names).
struct ShardSlice {
  enum class Kind {
    kWhole,     // every rank holds all of it
    kSlice,     // entries [begin, begin + count) along dimension `axis`
    kLeadOnly,  // a bias added after the sum over ranks: rank 0 holds it, the others zeros
  } kind = Kind::kWhole;
  int32_t axis = 0;  // of the tensor's dimensions; -1: the last
  int64_t begin = 0, count = 0;
};
// The slice of tensor `name` that rank shard.rank holds.
ShardSlice shard_slice(const ModelSpec& spec, TensorShard shard, const std::string& name);

// The weights of one rank, read from the whole model's source: each tensor is read whole and the
// rank's rows or columns kept (as f32 where sliced; unsliced matrices stay in their stored
// format). The loaders ask for shapes of shard_spec(spec, shard); `base` must outlive this.
class ShardedWeightSource final : public WeightSource {
 public:
  ShardedWeightSource(const WeightSource& base, ModelSpec spec, TensorShard shard);

  bool contains(const std::string& name) const override { return base_.contains(name); }
  Result<std::vector<float>> read_f32(const std::string& name,
                                      std::span<const int64_t> shape) const override;
  Result<StoredMatrix> read_matrix(const std::string& name, int64_t rows,
                                   int64_t cols) const override;
  // Each expert's share: gate_proj / up_proj rows [r·I_e/N, …) (in the stored format, viewed in
  // place, where the format slices by rows; else f32), down_proj columns (f32).
  Result<std::vector<StoredMatrix>> read_experts(int32_t layer, const std::string& projection,
                                                 int32_t num_experts, int64_t rows,
                                                 int64_t cols) const override;
  std::string describe() const override;

 private:
  const WeightSource& base_;
  ModelSpec spec_;  // the whole model's
  TensorShard shard_;
};

// The summary of whole logit rows from the summaries of their vocabulary shares: parts[r][i] is
// row i's summary over ids [begins[r], …), its argmax relative to begins[r]; the argmax is the
// first largest (the lowest rank's on ties), log_z the log-sum-exp of the parts' log_z.
// requires: parts.size() == begins.size() >= 1, every part holds out.size() rows.
void combine_row_summaries(std::span<const std::vector<LogitRowSummary>> parts,
                           std::span<const int32_t> begins, std::span<LogitRowSummary> out);

// Runs one job per rank side by side: rank 0 on the calling thread, the others on threads of
// their own that live as long as this (a CUDA rank's thread keeps its device current).
class RankThreads {
 public:
  explicit RankThreads(int32_t num_ranks);
  ~RankThreads();
  RankThreads(const RankThreads&) = delete;
  RankThreads& operator=(const RankThreads&) = delete;

  int32_t size() const { return num_ranks_; }
  // job(rank) on every rank at once; returns when all have returned: the lowest rank's error,
  // or ok.
  Status run(const std::function<Status(int32_t)>& job);

 private:
  void worker(int32_t rank);

  int32_t num_ranks_;
  std::mutex mu_;
  std::condition_variable start_cv_, done_cv_;
  const std::function<Status(int32_t)>* job_ = nullptr;
  uint64_t generation_ = 0;
  int32_t pending_ = 0;
  bool stop_ = false;
  std::vector<Status> results_;
  std::vector<std::thread> threads_;
};

// Where the ranks of one step meet (each on its own thread): every rank says whether it is
// ready, and all learn whether all are. Split CUDA runners meet after allocating what a step needs
// and before their first all-reduce (model/cuda/cuda_model_runner.h).
class RankGate {
 public:
  explicit RankGate(int32_t num_ranks) : num_ranks_(num_ranks) {}
  // Blocks until every rank has arrived; true when every rank arrived with ready = true. False at
  // once, for good, after abort().
  bool arrive(bool ready);
  // A rank left its step with an error: no rank may wait for it any more (a split model whose
  // step failed half-way is not used again; its ranks' collectives no longer match).
  void abort();

 private:
  const int32_t num_ranks_;
  std::mutex mu_;
  std::condition_variable cv_;
  int32_t arrived_ = 0;
  bool all_ready_ = true;
  bool result_ = true;  // of the last completed meeting
  uint64_t meeting_ = 0;
  bool aborted_ = false;
};

// A ForwardBackend over N rank backends of one model, rank r built from shard_spec(spec, {r, N})
// with the all-reduce wired in. Layouts, block images and logits are the whole model's: the
// engine, sessions and cache files see one backend (a file written at N ranks loads at 1).
class TensorParallelBackend final : public ForwardBackend {
 public:
  // requires: ranks.size() >= 1, ranks[r]->spec() == shard_spec(spec, {r, ranks.size()}).
  // gate: where the ranks meet inside a step (CUDA), aborted when a rank's step fails so that no
  // other rank waits for it; may be null.
  TensorParallelBackend(ModelSpec spec, std::vector<std::unique_ptr<ForwardBackend>> ranks,
                        std::shared_ptr<RankGate> gate = nullptr);
  ~TensorParallelBackend() override;

  int32_t num_ranks() const { return static_cast<int32_t>(ranks_.size()); }
  ForwardBackend& rank(int32_t r) { return *ranks_[r]; }

  const ModelSpec& spec() const override { return spec_; }
  // "tp2 [cuda:0 (…), cuda:1 (…)]"
  std::string device_name() const override;
  WeightFootprint weight_footprint() const override;
  int32_t num_cache_groups() const override { return ranks_[0]->num_cache_groups(); }
  int32_t num_group_layers(int32_t group) const override {
    return ranks_[0]->num_group_layers(group);
  }
  bool group_is_sliding(int32_t group) const override { return ranks_[0]->group_is_sliding(group); }
  KvLayout group_layout(int32_t group, int32_t num_blocks, int32_t block_size,
                        DType dtype) const override;
  Status check_kv_dtype(DType dtype) const override { return ranks_[0]->check_kv_dtype(dtype); }
  // Each rank allocates its share (kv heads / N) of every layout.
  Status allocate_kv(std::span<const KvLayout> layouts) override;
  const KvLayout& kv_layout(int32_t group) const override { return layouts_[group]; }
  Status forward(const ForwardBatch& batch, std::span<float> logits) override;
  bool summarizes_logits() const override { return ranks_[0]->summarizes_logits(); }
  Status forward_summarized(const ForwardBatch& batch, std::span<const int32_t> full_rows,
                            std::span<float> logits, std::span<LogitRowSummary> summaries) override;
  Status copy_blocks(int32_t group, std::span<const BlockCopy> ops) override;
  Status read_blocks(int32_t group, std::span<const BlockId> blocks,
                     std::span<std::byte> image) const override;
  Status write_blocks(int32_t group, std::span<const BlockId> blocks,
                      std::span<const std::byte> image) override;

 private:
  // Every rank's forward of one batch; rank 0's with `lead`, the others' with scratch outputs
  // (every rank computes the same logits; only rank 0's leave). The lm-head whole on each rank.
  Status forward_all(const ForwardBatch& batch, const std::function<Status()>& lead);
  // The lm-head split by vocabulary: every rank's forward (summarized when `summarized`) writes
  // its columns of the joined rows straight into `logits` (forward_into_rows), then the ranks'
  // summaries are combined.
  Status forward_vocab_split(const ForwardBatch& batch, std::span<const int32_t> full_rows,
                             std::span<float> logits, std::span<LogitRowSummary> summaries,
                             bool summarized);
  bool vocab_split() const { return ranks_[0]->spec().logit_count > 0; }
  // Block images: rank images ↔ the whole image (kv heads of rank r at r · its share).
  Status check_image(int32_t group, size_t blocks, size_t image_bytes, const char* what) const;

  ModelSpec spec_;
  std::vector<std::unique_ptr<ForwardBackend>> ranks_;
  std::shared_ptr<RankGate> gate_;
  std::unique_ptr<RankThreads> threads_;
  std::vector<KvLayout> layouts_;                            // whole, one per group
  mutable std::vector<std::vector<std::byte>> rank_images_;  // [rank] block image scratch
  std::vector<std::vector<float>> rank_logits_;              // [rank] scratch logits
  std::vector<std::vector<LogitRowSummary>> rank_summaries_;
};

// The CPU emulation: N ModelRunners, rank r's weights read through ShardedWeightSource from
// `source`, each with its own KV pool, run on N threads, their partial outputs summed in rank
// order (deterministic). Errors: check_tensor_parallel's, the loaders'.
Result<std::unique_ptr<ForwardBackend>> make_cpu_tensor_parallel_backend(const ModelSpec& spec,
                                                                         const WeightSource& source,
                                                                         int32_t n);

}  // namespace kvp
