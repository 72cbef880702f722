// The non-attention operations of a transformer layer on the CPU, in f32: matrix products
// (OpenBLAS), RMS norms, rotary embeddings, gated activations, embedding lookup.
// Row-major throughout. These are the CPU side of the Backend's layer operations; CUDA versions
// take the same shapes.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

namespace kvp::cpu {

// y = x · wᵀ (+ bias): x [num_rows][in_features], w [out_features][in_features],
// bias [out_features] or empty, y [num_rows][out_features]. Overwrites y.
void linear(const float* x, const float* w, std::span<const float> bias, float* y, int64_t num_rows,
            int64_t in_features, int64_t out_features);

enum class NormStyle {
  kPlain,     // x / rms(x) * w            (Llama, Qwen2)
  kOnePlusW,  // x / rms(x) * (1 + w)      (Gemma)
};

// In place over rows: x [num_rows][dim], w [dim]. rms(x) = sqrt(mean(x²) + eps).
void rms_norm(float* x, const float* w, int64_t num_rows, int64_t dim, float eps, NormStyle style);
// out = rms_norm(x), leaving x unchanged.
void rms_norm(const float* x, const float* w, float* out, int64_t num_rows, int64_t dim, float eps,
              NormStyle style);

// Rotary embedding tables: inverse frequencies [head_dim / 2] for a rope variant.
struct RopeScaling {
  enum class Kind { kNone, kLinear, kLlama3, kYarn } kind = Kind::kNone;
  double factor = 1.0;
  double low_freq_factor = 1.0;                 // llama3
  double high_freq_factor = 4.0;                // llama3
  double original_max_position_embeddings = 0;  // llama3, yarn
  // YaRN (transformers' _compute_yarn_parameters): frequencies between the correction dims of
  // beta_fast and beta_slow rotations ramp from extrapolated (kept) to interpolated (/ factor);
  // truncate rounds the correction range outward to whole dims. attention_factor multiplies cos
  // and sin, so q·k by its square (the runner folds that into the attention scale).
  double beta_fast = 32.0;
  double beta_slow = 1.0;
  bool truncate = true;
  double attention_factor = 1.0;
};
std::vector<float> rope_inverse_frequencies(int32_t rotary_dim, double theta,
                                            const RopeScaling& scaling);

enum class RopeStyle {
  kHalves,       // pairs (i, i + d/2): Hugging Face's rotate_half, GGUF "neox" models
  kInterleaved,  // pairs (2i, 2i + 1): GGUF llama-family models (their q/k rows are permuted)
};

// In place: x [num_tokens][num_heads][head_dim], positions [num_tokens]; rotates the first
// 2 * inv_freq.size() dims of each head.
void apply_rope(float* x, std::span<const int32_t> positions, int64_t num_heads, int64_t head_dim,
                std::span<const float> inv_freq, RopeStyle style);

// kClampedSwiglu, GPT-OSS's experts: g = min(gate, 7), u = clamp(up, -7, 7),
// out = (u + 1) * g * sigmoid(1.702 g).
enum class Activation { kSilu, kGeluTanh, kClampedSwiglu };
inline constexpr float kSwigluAlpha = 1.702f;  // GPT-OSS's fixed constants
inline constexpr float kSwigluLimit = 7.0f;
// out[r][i] = act(gate[r][i]) * up[r][i] (kClampedSwiglu: as above); gate_up [num_rows][2 * dim]
// (vectorised in cpu_activations.cc, within a few ULP of the f32 formulas)
// holds gate then up.
void gated_activation(const float* gate_up, float* out, int64_t num_rows, int64_t dim,
                      Activation act);

// out [num_tokens][dim] = table[token_ids[t]] * scale; table [vocab_size][dim].
// requires: every id in [0, vocab_size).
void embedding_lookup(const float* table, std::span<const int32_t> token_ids, float* out,
                      int64_t dim, float scale);

// In place: x = cap * tanh(x / cap).
void soft_cap(float* x, int64_t count, float cap);

}  // namespace kvp::cpu
