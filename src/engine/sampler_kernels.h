// The sampler's passes over a whole logits row, vectorised with Highway (dynamic dispatch, as
// backend/cpu_attention_kernel.cc). A row is the vocabulary (up to 256K floats), and a decode
// step samples one per sequence, so these run batch x vocab times per step: scalar double-
// precision exp over 128K logits costs a millisecond a row, more than a GPU decode step's share.
#pragma once

#include <cstdint>
#include <span>

namespace kvp::sampler_kernels {

// The largest value, NaN ignored; -inf if there is none.
float max_value(std::span<const float> values);

// The index of the first largest value (ties go to the lowest index; NaN never wins); 0 if every
// value is NaN or values is empty.
int32_t argmax(std::span<const float> values);

// sum_i exp(values[i] - shift), and out[i] = exp(values[i] - shift) when out is not empty.
// Exponents below -87 count as exp(-87) (~1.6e-38): -inf logits add nothing measurable.
// Lanes add up in float, blocks of 4096 values in double.
// requires: out.empty() || out.size() == values.size(); values - shift <= 88 (shift >= max).
double exp_shifted(std::span<const float> values, float shift, std::span<float> out);

}  // namespace kvp::sampler_kernels
