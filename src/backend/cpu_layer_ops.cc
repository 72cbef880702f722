#include "backend/cpu_layer_ops.h"

#include <cblas.h>

#include <algorithm>
#include <cmath>
#include <numbers>

#include "common/check.h"

namespace kvp::cpu {

void linear(const float* x, const float* w, std::span<const float> bias, float* y, int64_t num_rows,
            int64_t in_features, int64_t out_features) {
  if (num_rows == 0) return;
  KVP_CHECK(bias.empty() || static_cast<int64_t>(bias.size()) == out_features,
            "bias of {} for {} outputs", bias.size(), out_features);
  float beta = 0.0f;
  if (!bias.empty()) {
    for (int64_t r = 0; r < num_rows; ++r) {
      std::copy(bias.begin(), bias.end(), y + r * out_features);
    }
    beta = 1.0f;
  }
  if (num_rows == 1) {
    cblas_sgemv(CblasRowMajor, CblasNoTrans, static_cast<blasint>(out_features),
                static_cast<blasint>(in_features), 1.0f, w, static_cast<blasint>(in_features), x, 1,
                beta, y, 1);
    return;
  }
  cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, static_cast<blasint>(num_rows),
              static_cast<blasint>(out_features), static_cast<blasint>(in_features), 1.0f, x,
              static_cast<blasint>(in_features), w, static_cast<blasint>(in_features), beta, y,
              static_cast<blasint>(out_features));
}

void rms_norm(const float* x, const float* w, float* out, int64_t num_rows, int64_t dim, float eps,
              NormStyle style) {
  for (int64_t r = 0; r < num_rows; ++r) {
    const float* xr = x + r * dim;
    float* o = out + r * dim;
    double sum_squares = 0.0;
    for (int64_t i = 0; i < dim; ++i) sum_squares += double(xr[i]) * xr[i];
    const float inv_rms = 1.0f / std::sqrt(static_cast<float>(sum_squares / dim) + eps);
    if (style == NormStyle::kPlain) {
      for (int64_t i = 0; i < dim; ++i) o[i] = w[i] * (xr[i] * inv_rms);
    } else {
      for (int64_t i = 0; i < dim; ++i) o[i] = (xr[i] * inv_rms) * (1.0f + w[i]);
    }
  }
}

void rms_norm(float* x, const float* w, int64_t num_rows, int64_t dim, float eps, NormStyle style) {
  rms_norm(x, w, x, num_rows, dim, eps, style);
}

namespace {

// As transformers computes YaRN's inverse frequencies: the frequencies in float32, the correction
// range in double (Python floats).
std::vector<float> yarn_inverse_frequencies(int32_t dim, double theta, const RopeScaling& s) {
  const auto correction_dim = [&](double rotations) {
    return dim * std::log(s.original_max_position_embeddings / (rotations * 2 * std::numbers::pi)) /
           (2 * std::log(theta));
  };
  double low = correction_dim(s.beta_fast), high = correction_dim(s.beta_slow);
  if (s.truncate) {
    low = std::floor(low);
    high = std::ceil(high);
  }
  low = std::max(low, 0.0);
  high = std::min(high, double(dim - 1));
  if (low == high) high += 0.001;  // no division by zero
  const auto low_f = static_cast<float>(low), span_f = static_cast<float>(high - low);
  std::vector<float> inv_freq(dim / 2);
  for (int32_t i = 0; i < dim / 2; ++i) {
    const float pos_freq =
        std::pow(static_cast<float>(theta), static_cast<float>(2 * i) / static_cast<float>(dim));
    const float extrapolation = 1.0f / pos_freq;
    const float interpolation = 1.0f / (static_cast<float>(s.factor) * pos_freq);
    const float ramp = std::clamp((static_cast<float>(i) - low_f) / span_f, 0.0f, 1.0f);
    const float keep = 1.0f - ramp;  // share of the extrapolated frequency
    inv_freq[i] = interpolation * (1.0f - keep) + extrapolation * keep;
  }
  return inv_freq;
}

}  // namespace

std::vector<float> rope_inverse_frequencies(int32_t rotary_dim, double theta,
                                            const RopeScaling& scaling) {
  KVP_CHECK(rotary_dim > 0 && rotary_dim % 2 == 0, "rotary dim {} must be even", rotary_dim);
  if (scaling.kind == RopeScaling::Kind::kYarn) {
    return yarn_inverse_frequencies(rotary_dim, theta, scaling);
  }
  std::vector<float> inv_freq(rotary_dim / 2);
  for (int32_t i = 0; i < rotary_dim / 2; ++i) {
    // as Hugging Face computes it: in float32, base ** (2i / dim)
    const float exponent = static_cast<float>(2 * i) / static_cast<float>(rotary_dim);
    double f = 1.0 / static_cast<double>(std::pow(static_cast<float>(theta), exponent));
    switch (scaling.kind) {
      case RopeScaling::Kind::kNone:
      case RopeScaling::Kind::kYarn:  // yarn_inverse_frequencies
        break;
      case RopeScaling::Kind::kLinear:
        f /= scaling.factor;
        break;
      case RopeScaling::Kind::kLlama3: {
        const double old_context = scaling.original_max_position_embeddings;
        const double low_freq_wavelen = old_context / scaling.low_freq_factor;
        const double high_freq_wavelen = old_context / scaling.high_freq_factor;
        const double wavelen = 2.0 * std::numbers::pi / f;
        if (wavelen > low_freq_wavelen) {
          f /= scaling.factor;
        } else if (wavelen >= high_freq_wavelen) {  // medium frequencies: interpolate
          const double smooth = (old_context / wavelen - scaling.low_freq_factor) /
                                (scaling.high_freq_factor - scaling.low_freq_factor);
          f = (1.0 - smooth) * f / scaling.factor + smooth * f;
        }
        break;
      }
    }
    inv_freq[i] = static_cast<float>(f);
  }
  return inv_freq;
}

void apply_rope(float* x, std::span<const int32_t> positions, int64_t num_heads, int64_t head_dim,
                std::span<const float> inv_freq, RopeStyle style) {
  const auto half = static_cast<int64_t>(inv_freq.size());
  KVP_CHECK(2 * half <= head_dim, "rotary dims {} exceed head dim {}", 2 * half, head_dim);
  std::vector<float> cos_table(half), sin_table(half);
  for (size_t t = 0; t < positions.size(); ++t) {
    for (int64_t i = 0; i < half; ++i) {
      // the angle is a float32 product, as in Hugging Face's rotary embedding
      const float angle = static_cast<float>(positions[t]) * inv_freq[i];
      cos_table[i] = std::cos(angle);
      sin_table[i] = std::sin(angle);
    }
    for (int64_t h = 0; h < num_heads; ++h) {
      float* v = x + (static_cast<int64_t>(t) * num_heads + h) * head_dim;
      for (int64_t i = 0; i < half; ++i) {
        const int64_t a = style == RopeStyle::kHalves ? i : 2 * i;
        const int64_t b = style == RopeStyle::kHalves ? i + half : 2 * i + 1;
        const float x0 = v[a], x1 = v[b];
        v[a] = x0 * cos_table[i] - x1 * sin_table[i];
        v[b] = x1 * cos_table[i] + x0 * sin_table[i];
      }
    }
  }
}

void embedding_lookup(const float* table, std::span<const int32_t> token_ids, float* out,
                      int64_t dim, float scale) {
  for (size_t t = 0; t < token_ids.size(); ++t) {
    const float* row = table + static_cast<int64_t>(token_ids[t]) * dim;
    float* o = out + static_cast<int64_t>(t) * dim;
    for (int64_t i = 0; i < dim; ++i) o[i] = row[i] * scale;
  }
}

}  // namespace kvp::cpu
