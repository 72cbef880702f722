// Tensor parallelism (tensor_parallel.h): shard arithmetic, the rank threads, the backend over
// ranks and the CPU ranks' all-reduce.
#include "model/tensor_parallel.h"

#include <fmt/format.h>

#include <algorithm>
#include <barrier>
#include <cmath>
#include <cstring>
#include <utility>

#include "model/cpu_forward_backend.h"
#include "model/model_runner.h"

namespace kvp {
namespace {

bool ends_with(const std::string& s, std::string_view suffix) {
  return s.size() >= suffix.size() &&
         s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

// The CPU ranks' all-reduce: each rank publishes its buffer, every rank sums all of them in rank
// order into a copy (so every rank gets the same bits), and the second barrier keeps a rank from
// overwriting its buffer while another still reads it.
class InProcessAllReduce {
 public:
  explicit InProcessAllReduce(int32_t n) : buffers_(n), barrier_(n) {}

  void sum(int32_t rank, std::span<float> values) {
    buffers_[rank] = values;
    barrier_.arrive_and_wait();
    std::vector<float> total(buffers_[0].begin(), buffers_[0].end());
    for (size_t r = 1; r < buffers_.size(); ++r) {
      const std::span<float> b = buffers_[r];
      for (size_t i = 0; i < total.size(); ++i) total[i] += b[i];
    }
    barrier_.arrive_and_wait();
    std::copy(total.begin(), total.end(), values.begin());
  }

 private:
  std::vector<std::span<float>> buffers_;
  std::barrier<> barrier_;
};

}  // namespace

Status check_tensor_parallel(const ModelSpec& spec, int32_t n) {
  if (n < 1 || n > kMaxTensorParallel) {
    return Status::invalid_argument("tensor parallel {}: must be 1 to {}", n, kMaxTensorParallel);
  }
  bool has_dense_mlp = !spec.is_moe();
  for (int32_t l = 0; l < spec.num_layers && !has_dense_mlp; ++l)
    has_dense_mlp = !spec.layer_moe(l);
  const int32_t dense_inter = has_dense_mlp ? spec.intermediate_size : 0;
  if (spec.num_q_heads % n != 0 || spec.num_kv_heads % n != 0 || dense_inter % n != 0) {
    return Status::invalid_argument(
        "tensor parallel {}: the model's {} attention heads, {} kv heads and intermediate size {} "
        "must each divide by {}",
        n, spec.num_q_heads, spec.num_kv_heads, spec.intermediate_size, n);
  }
  if (spec.moe_intermediate_size % n != 0 || spec.shared_expert_intermediate_size % n != 0) {
    return Status::invalid_argument(
        "tensor parallel {}: the {} model's expert intermediate size {} and shared expert "
        "intermediate size {} must each divide by {}",
        n, architecture_name(spec.architecture), spec.moe_intermediate_size,
        spec.shared_expert_intermediate_size, n);
  }
  return Status::ok();
}

ModelSpec shard_spec(const ModelSpec& spec, TensorShard shard) {
  ModelSpec local = spec;
  local.num_q_heads = spec.num_q_heads / shard.size;
  local.num_kv_heads = spec.num_kv_heads / shard.size;
  local.intermediate_size = spec.intermediate_size / shard.size;
  local.moe_intermediate_size = spec.moe_intermediate_size / shard.size;
  local.shared_expert_intermediate_size = spec.shared_expert_intermediate_size / shard.size;
  if (shard.size > 1 && spec.vocab_size % shard.size == 0) {
    local.logit_count = spec.vocab_size / shard.size;
    local.logit_begin = shard.rank * local.logit_count;
  }
  return local;
}

ShardSlice shard_slice(const ModelSpec& spec, TensorShard shard, const std::string& name) {
  const int64_t q_heads = int64_t{spec.num_q_heads} / shard.size;
  const int64_t q_share = q_heads * spec.head_dim;
  const int64_t kv_share = int64_t{spec.num_kv_heads} / shard.size * spec.head_dim;
  const int64_t inter_share = int64_t{spec.intermediate_size} / shard.size;
  const int64_t expert_share = int64_t{spec.moe_intermediate_size} / shard.size;
  const int64_t shared_share = int64_t{spec.shared_expert_intermediate_size} / shard.size;
  const auto along = [&](int32_t axis, int64_t share) {
    return ShardSlice{ShardSlice::Kind::kSlice, axis, shard.rank * share, share};
  };
  const auto rows = [&](int64_t share) { return along(0, share); };
  const auto cols = [&](int64_t share) { return along(1, share); };
  const auto is = [&](std::string_view suffix) { return ends_with(name, suffix); };
  if (shard.size > 1 && name == "lm_head.weight" && spec.vocab_size % shard.size == 0) {
    return rows(spec.vocab_size / shard.size);
  }
  if (shard.size == 1 || !name.starts_with("model.layers.")) return {};
  if (is("self_attn.q_proj.weight") || is("self_attn.q_proj.bias")) return rows(q_share);
  if (is("self_attn.k_proj.weight") || is("self_attn.k_proj.bias") ||
      is("self_attn.v_proj.weight") || is("self_attn.v_proj.bias")) {
    return rows(kv_share);
  }
  if (is("self_attn.o_proj.weight")) return cols(q_share);
  if (is("self_attn.sinks")) return rows(q_heads);
  if (is("mlp.gate_proj.weight") || is("mlp.up_proj.weight")) return rows(inter_share);
  if (is("mlp.down_proj.weight")) return cols(inter_share);
  if (is("mlp.shared_expert.gate_proj.weight") || is("mlp.shared_expert.up_proj.weight")) {
    return rows(shared_share);
  }
  if (is("mlp.shared_expert.down_proj.weight")) return cols(shared_share);
  // GPT-OSS's experts as transformers stores them: gate_up_proj [E][hidden][2 I] with gate and
  // up units interleaved (columns 2i, 2i + 1), so a rank's units are one run of columns;
  // down_proj [E][I][hidden]; or as llama.cpp's GGUF stores their biases, [E][I] per projection
  if (is("mlp.experts.gate_up_proj") || is("mlp.experts.gate_up_proj_bias")) {
    return along(-1, 2 * expert_share);
  }
  if (is("mlp.experts.down_proj")) return along(1, expert_share);
  if (is("mlp.experts.gate_proj.bias") || is("mlp.experts.up_proj.bias")) {
    return along(-1, expert_share);
  }
  if (is("self_attn.o_proj.bias") || is("mlp.experts.down_proj_bias") ||
      is("mlp.experts.down_proj.bias")) {
    return {ShardSlice::Kind::kLeadOnly};
  }
  return {};
}

ShardedWeightSource::ShardedWeightSource(const WeightSource& base, ModelSpec spec,
                                         TensorShard shard)
    : base_(base), spec_(std::move(spec)), shard_(shard) {}

std::string ShardedWeightSource::describe() const {
  return fmt::format("{} (rank {} of {})", base_.describe(), shard_.rank, shard_.size);
}

Result<std::vector<float>> ShardedWeightSource::read_f32(const std::string& name,
                                                         std::span<const int64_t> shape) const {
  const ShardSlice slice = shard_slice(spec_, shard_, name);
  if (slice.kind == ShardSlice::Kind::kWhole) return base_.read_f32(name, shape);
  if (slice.kind == ShardSlice::Kind::kLeadOnly) {
    KVP_ASSIGN_OR_RETURN(std::vector<float> all, base_.read_f32(name, shape));
    if (shard_.rank != 0) std::fill(all.begin(), all.end(), 0.0f);
    return all;
  }
  const auto rank_dims = static_cast<int32_t>(shape.size());
  const int32_t axis = slice.axis < 0 ? rank_dims + slice.axis : slice.axis;
  if (axis < 0 || axis >= rank_dims || shape[axis] != slice.count) {
    return Status::mismatch("{}: tensor '{}' asked with a shape that is not rank {}'s share",
                            describe(), name, shard_.rank);
  }
  std::vector<int64_t> whole(shape.begin(), shape.end());
  whole[axis] *= shard_.size;
  KVP_ASSIGN_OR_RETURN(std::vector<float> all, base_.read_f32(name, whole));
  // [outer][whole[axis]][inner] → [outer][count][inner]
  int64_t outer = 1, inner = 1;
  for (int32_t d = 0; d < axis; ++d) outer *= whole[d];
  for (int32_t d = axis + 1; d < rank_dims; ++d) inner *= whole[d];
  std::vector<float> out(static_cast<size_t>(outer * slice.count * inner));
  for (int64_t o = 0; o < outer; ++o) {
    std::copy_n(all.begin() + (o * whole[axis] + slice.begin) * inner, slice.count * inner,
                out.begin() + o * slice.count * inner);
  }
  return out;
}

Result<StoredMatrix> ShardedWeightSource::read_matrix(const std::string& name, int64_t rows,
                                                      int64_t cols) const {
  if (shard_slice(spec_, shard_, name).kind == ShardSlice::Kind::kWhole) {
    return base_.read_matrix(name, rows, cols);
  }
  const int64_t shape[] = {rows, cols};
  KVP_ASSIGN_OR_RETURN(std::vector<float> values, read_f32(name, shape));
  return owned_f32_matrix(std::move(values), rows, cols);
}

Result<std::vector<StoredMatrix>> ShardedWeightSource::read_experts(int32_t layer,
                                                                    const std::string& projection,
                                                                    int32_t num_experts,
                                                                    int64_t rows,
                                                                    int64_t cols) const {
  if (shard_.size == 1) return base_.read_experts(layer, projection, num_experts, rows, cols);
  const bool by_rows = projection != "down_proj";  // gate_proj, up_proj: [I][hidden]
  const int64_t share = by_rows ? rows : cols;
  KVP_ASSIGN_OR_RETURN(
      std::vector<StoredMatrix> whole,
      base_.read_experts(layer, projection, num_experts, by_rows ? rows * shard_.size : rows,
                         by_rows ? cols : cols * shard_.size));
  const int64_t begin = shard_.rank * share;
  for (StoredMatrix& m : whole) {
    if (by_rows) {  // a run of rows is a view in any stored format
      m.matrix = quant::slice_rows(m.matrix, begin, share);
      continue;
    }
    if (!can_dequantize(m.matrix.type)) {
      return Status::unsupported("{}: layer {} {} is stored as {}, which kvpool cannot split",
                                 describe(), layer, projection, ggml_type_name(m.matrix.type));
    }
    std::vector<float> row(static_cast<size_t>(m.matrix.cols));
    std::vector<float> mine(static_cast<size_t>(rows * share));
    for (int64_t r = 0; r < rows; ++r) {
      quant::dequantize_row(m.matrix, r, row.data());
      std::copy_n(row.begin() + begin, share, mine.begin() + r * share);
    }
    m = owned_f32_matrix(std::move(mine), rows, share);
  }
  return whole;
}

void combine_row_summaries(std::span<const std::vector<LogitRowSummary>> parts,
                           std::span<const int32_t> begins, std::span<LogitRowSummary> out) {
  for (size_t i = 0; i < out.size(); ++i) {
    size_t best = 0;  // strictly larger only: the lowest rank (lowest ids) keeps ties
    float top_z = parts[0][i].log_z;
    for (size_t r = 1; r < parts.size(); ++r) {
      if (parts[r][i].max_logit > parts[best][i].max_logit) best = r;
      top_z = std::max(top_z, parts[r][i].log_z);
    }
    double sum = 0;
    for (const auto& part : parts) sum += std::exp(static_cast<double>(part[i].log_z - top_z));
    out[i].argmax = parts[best][i].argmax + begins[best];
    out[i].max_logit = parts[best][i].max_logit;
    out[i].log_z = top_z + static_cast<float>(std::log(sum));
  }
}

bool RankGate::arrive(bool ready) {
  std::unique_lock lock(mu_);
  if (aborted_) return false;
  all_ready_ = all_ready_ && ready;
  if (++arrived_ == num_ranks_) {
    result_ = all_ready_;
    arrived_ = 0;
    all_ready_ = true;
    ++meeting_;
    cv_.notify_all();
    return result_;
  }
  const uint64_t meeting = meeting_;
  cv_.wait(lock, [&] { return aborted_ || meeting_ != meeting; });
  return !aborted_ && result_;
}

void RankGate::abort() {
  {
    std::lock_guard lock(mu_);
    aborted_ = true;
  }
  cv_.notify_all();
}

RankThreads::RankThreads(int32_t num_ranks) : num_ranks_(num_ranks), results_(num_ranks) {
  for (int32_t r = 1; r < num_ranks; ++r) threads_.emplace_back([this, r] { worker(r); });
}

RankThreads::~RankThreads() {
  {
    std::lock_guard lock(mu_);
    stop_ = true;
  }
  start_cv_.notify_all();
  for (std::thread& t : threads_) t.join();
}

void RankThreads::worker(int32_t rank) {
  uint64_t seen = 0;
  for (;;) {
    const std::function<Status(int32_t)>* job = nullptr;
    {
      std::unique_lock lock(mu_);
      start_cv_.wait(lock, [&] { return stop_ || generation_ != seen; });
      if (stop_) return;
      seen = generation_;
      job = job_;
    }
    Status st = (*job)(rank);
    {
      std::lock_guard lock(mu_);
      results_[rank] = std::move(st);
      if (--pending_ == 0) done_cv_.notify_all();
    }
  }
}

Status RankThreads::run(const std::function<Status(int32_t)>& job) {
  if (num_ranks_ == 1) return job(0);
  {
    std::lock_guard lock(mu_);
    job_ = &job;
    pending_ = num_ranks_ - 1;
    ++generation_;
  }
  start_cv_.notify_all();
  results_[0] = job(0);
  std::unique_lock lock(mu_);
  done_cv_.wait(lock, [&] { return pending_ == 0; });
  job_ = nullptr;
  for (Status& st : results_) {
    if (!st.is_ok()) return std::move(st);
  }
  return Status::ok();
}

TensorParallelBackend::TensorParallelBackend(ModelSpec spec,
                                             std::vector<std::unique_ptr<ForwardBackend>> ranks,
                                             std::shared_ptr<RankGate> gate)
    : spec_(std::move(spec)),
      ranks_(std::move(ranks)),
      gate_(std::move(gate)),
      threads_(std::make_unique<RankThreads>(static_cast<int32_t>(ranks_.size()))),
      rank_images_(ranks_.size()),
      rank_logits_(ranks_.size()),
      rank_summaries_(ranks_.size()) {}

TensorParallelBackend::~TensorParallelBackend() {
  threads_.reset();  // no rank thread may outlive its backend
  ranks_.clear();
}

std::string TensorParallelBackend::device_name() const {
  std::string names;
  for (const auto& r : ranks_) names += (names.empty() ? "" : ", ") + r->device_name();
  return fmt::format("tp{} [{}]", ranks_.size(), names);
}

WeightFootprint TensorParallelBackend::weight_footprint() const {
  WeightFootprint total;
  for (const auto& r : ranks_) {
    const WeightFootprint f = r->weight_footprint();
    total.resident_bytes += f.resident_bytes;
    total.decode_read_bytes += f.decode_read_bytes;
    for (const std::pair<std::string, uint64_t>& part : f.by_format) {
      auto it = std::find_if(total.by_format.begin(), total.by_format.end(),
                             [&](const auto& e) { return e.first == part.first; });
      if (it == total.by_format.end()) {
        total.by_format.push_back(part);
      } else {
        it->second += part.second;
      }
    }
  }
  return total;
}

KvLayout TensorParallelBackend::group_layout(int32_t group, int32_t num_blocks, int32_t block_size,
                                             DType dtype) const {
  KvLayout layout = ranks_[0]->group_layout(group, num_blocks, block_size, dtype);
  layout.num_kv_heads *= num_ranks();
  return layout;
}

Status TensorParallelBackend::allocate_kv(std::span<const KvLayout> layouts) {
  if (static_cast<int32_t>(layouts.size()) != num_cache_groups()) {
    return Status::invalid_argument("allocate_kv: {} layouts for {} cache groups", layouts.size(),
                                    num_cache_groups());
  }
  std::vector<KvLayout> local(layouts.begin(), layouts.end());
  for (size_t g = 0; g < local.size(); ++g) {
    const KvLayout& l = layouts[g];
    if (l != group_layout(static_cast<int32_t>(g), l.num_blocks, l.block_size, l.dtype)) {
      return Status::invalid_argument("allocate_kv: group {}'s layout is not the model's", g);
    }
    local[g].num_kv_heads /= num_ranks();
  }
  layouts_.clear();
  for (const auto& r : ranks_) KVP_RETURN_IF_ERROR(r->allocate_kv(local));
  layouts_.assign(layouts.begin(), layouts.end());
  return Status::ok();
}

Status TensorParallelBackend::forward_all(const ForwardBatch& batch,
                                          const std::function<Status()>& lead) {
  const size_t rows = batch.logit_rows.size();
  return threads_->run([&](int32_t r) -> Status {
    Status st;
    ForwardBackend& b = *ranks_[r];
    if (r == 0) {
      st = lead();
    } else if (b.summarizes_logits()) {
      rank_summaries_[r].resize(rows);
      st = b.forward_summarized(batch, {}, {}, rank_summaries_[r]);
    } else {
      rank_logits_[r].resize(rows * static_cast<size_t>(spec_.vocab_size));
      st = b.forward(batch, rank_logits_[r]);
    }
    if (!st.is_ok() && gate_ != nullptr) gate_->abort();
    return st;
  });
}

// The output checks run here, before any rank starts: a rank that refused its batch while the
// others went on would leave them waiting in the all-reduce. Every rank checks the batch itself
// alike (same tokens, tables and slots).
Status TensorParallelBackend::forward(const ForwardBatch& batch, std::span<float> logits) {
  if (logits.size() != batch.logit_rows.size() * static_cast<size_t>(spec_.vocab_size)) {
    return Status::invalid_argument("forward: logits hold {} floats, {} rows of {} need {}",
                                    logits.size(), batch.logit_rows.size(), spec_.vocab_size,
                                    batch.logit_rows.size() * spec_.vocab_size);
  }
  if (vocab_split()) return forward_vocab_split(batch, {}, logits, {}, false);
  return forward_all(batch, [&] { return ranks_[0]->forward(batch, logits); });
}

Status TensorParallelBackend::forward_summarized(const ForwardBatch& batch,
                                                 std::span<const int32_t> full_rows,
                                                 std::span<float> logits,
                                                 std::span<LogitRowSummary> summaries) {
  const size_t rows = batch.logit_rows.size();
  bool rows_ok = summaries.size() == rows &&
                 logits.size() == full_rows.size() * static_cast<size_t>(spec_.vocab_size);
  for (size_t i = 0; rows_ok && i < full_rows.size(); ++i) {
    rows_ok = full_rows[i] >= 0 && static_cast<size_t>(full_rows[i]) < rows &&
              (i == 0 || full_rows[i] > full_rows[i - 1]);
  }
  if (!rows_ok) {
    return Status::invalid_argument(
        "forward_summarized: {} summaries, {} full rows (increasing, below {}) and {} logits for "
        "{} logit rows",
        summaries.size(), full_rows.size(), rows, logits.size(), rows);
  }
  if (vocab_split()) return forward_vocab_split(batch, full_rows, logits, summaries, true);
  return forward_all(
      batch, [&] { return ranks_[0]->forward_summarized(batch, full_rows, logits, summaries); });
}

Status TensorParallelBackend::forward_vocab_split(const ForwardBatch& batch,
                                                  std::span<const int32_t> full_rows,
                                                  std::span<float> logits,
                                                  std::span<LogitRowSummary> summaries,
                                                  bool summarized) {
  const size_t rows = batch.logit_rows.size();
  const size_t out_rows = summarized ? full_rows.size() : rows;
  // rank r's rows are columns [begin_r, begin_r + V / N) of the joined rows: each rank writes
  // its own straight there, side by side (64 rows of a 128K vocabulary are 33 MB)
  KVP_RETURN_IF_ERROR(threads_->run([&](int32_t r) -> Status {
    ForwardBackend& b = *ranks_[r];
    const auto begin = static_cast<size_t>(b.spec().logit_begin);
    const std::span<float> mine = out_rows == 0 ? std::span<float>() : logits.subspan(begin);
    if (summarized) rank_summaries_[r].resize(rows);
    const Status st = b.forward_into_rows(
        batch, full_rows, mine, size_t(spec_.vocab_size),
        summarized ? std::span(rank_summaries_[r]) : std::span<LogitRowSummary>());
    if (!st.is_ok() && gate_ != nullptr) gate_->abort();
    return st;
  }));
  if (summarized) {
    std::vector<int32_t> begins;
    for (const auto& rank : ranks_) begins.push_back(rank->spec().logit_begin);
    combine_row_summaries(rank_summaries_, begins, summaries);
  }
  return Status::ok();
}

Status TensorParallelBackend::copy_blocks(int32_t group, std::span<const BlockCopy> ops) {
  return threads_->run([&](int32_t r) { return ranks_[r]->copy_blocks(group, ops); });
}

Status TensorParallelBackend::check_image(int32_t group, size_t blocks, size_t image_bytes,
                                          const char* what) const {
  if (layouts_.empty() || group < 0 || group >= num_cache_groups()) {
    return Status::invalid_argument("{}: group {} (of {}; KV {}allocated)", what, group,
                                    num_cache_groups(), layouts_.empty() ? "not " : "");
  }
  if (image_bytes != blocks * layouts_[group].block_size_bytes()) {
    return Status::invalid_argument("{}: an image of {} bytes for {} blocks of {} bytes", what,
                                    image_bytes, blocks, layouts_[group].block_size_bytes());
  }
  return Status::ok();
}

namespace {

// Calls f(rank image offset, whole image offset, bytes) for every run of one rank's kv heads in
// a block image: per block, per layer of the group, K then V, the rank's heads sit at
// rank · (its share) within the whole image's heads.
template <typename F>
void for_each_rank_run(const KvLayout& whole, int32_t num_ranks, int32_t rank, size_t num_blocks,
                       F&& f) {
  const size_t share =
      static_cast<size_t>(whole.block_stride() / num_ranks) * dtype_size_bytes(whole.dtype);
  const size_t runs = num_blocks * static_cast<size_t>(whole.num_layers) * 2;
  for (size_t i = 0; i < runs; ++i) f(i * share, i * share * num_ranks + rank * share, share);
}

}  // namespace

Status TensorParallelBackend::read_blocks(int32_t group, std::span<const BlockId> blocks,
                                          std::span<std::byte> image) const {
  KVP_RETURN_IF_ERROR(check_image(group, blocks.size(), image.size(), "read_blocks"));
  const size_t rank_bytes = image.size() / ranks_.size();
  KVP_RETURN_IF_ERROR(threads_->run([&](int32_t r) -> Status {
    std::vector<std::byte>& mine = rank_images_[r];
    mine.resize(rank_bytes);
    KVP_RETURN_IF_ERROR(ranks_[r]->read_blocks(group, blocks, mine));
    for_each_rank_run(layouts_[group], num_ranks(), r, blocks.size(),
                      [&](size_t from, size_t to, size_t n) {
                        std::memcpy(image.data() + to, mine.data() + from, n);
                      });
    return Status::ok();
  }));
  return Status::ok();
}

Status TensorParallelBackend::write_blocks(int32_t group, std::span<const BlockId> blocks,
                                           std::span<const std::byte> image) {
  KVP_RETURN_IF_ERROR(check_image(group, blocks.size(), image.size(), "write_blocks"));
  const size_t rank_bytes = image.size() / ranks_.size();
  return threads_->run([&](int32_t r) -> Status {
    std::vector<std::byte>& mine = rank_images_[r];
    mine.resize(rank_bytes);
    for_each_rank_run(layouts_[group], num_ranks(), r, blocks.size(),
                      [&](size_t to, size_t from, size_t n) {
                        std::memcpy(mine.data() + to, image.data() + from, n);
                      });
    return ranks_[r]->write_blocks(group, blocks, mine);
  });
}

Result<std::unique_ptr<ForwardBackend>> make_cpu_tensor_parallel_backend(const ModelSpec& spec,
                                                                         const WeightSource& source,
                                                                         int32_t n) {
  KVP_RETURN_IF_ERROR(check_tensor_parallel(spec, n));
  auto all_reduce = std::make_shared<InProcessAllReduce>(n);
  std::vector<std::unique_ptr<ForwardBackend>> ranks;
  for (int32_t r = 0; r < n; ++r) {
    const TensorShard shard{r, n};
    ModelSpec local = shard_spec(spec, shard);
    const ShardedWeightSource sharded(source, spec, shard);
    KVP_ASSIGN_OR_RETURN(ModelWeights weights, load_model_weights(local, sharded));
    auto runner = std::make_shared<ModelRunner>(std::move(local), std::move(weights), nullptr);
    if (n > 1) {
      runner->set_all_reduce(
          [all_reduce, r](std::span<float> values) { all_reduce->sum(r, values); });
    }
    ranks.push_back(std::make_unique<CpuForwardBackend>(std::move(runner)));
  }
  return std::unique_ptr<ForwardBackend>(
      std::make_unique<TensorParallelBackend>(spec, std::move(ranks)));
}

}  // namespace kvp
