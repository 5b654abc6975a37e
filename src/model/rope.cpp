#include "model/rope.h"

#include <algorithm>
#include <cmath>

namespace deepinfer {

namespace {

// inv_freq[i] = 1 / base^(2i / dim), evaluated in f32 as transformers does so positions far
// from zero rotate by the same angle.
std::vector<float> default_frequencies(double base, int dim) {
  std::vector<float> frequencies(static_cast<size_t>(dim / 2));
  for (int i = 0; i < dim / 2; ++i) {
    float exponent = static_cast<float>(2 * i) / static_cast<float>(dim);
    frequencies[static_cast<size_t>(i)] = 1.0f / std::pow(static_cast<float>(base), exponent);
  }
  return frequencies;
}

void apply_llama3(const RopeConfig& config, std::vector<float>& frequencies) {
  double old_context = config.original_max_position_embeddings;
  double low_wavelength = old_context / config.low_freq_factor;
  double high_wavelength = old_context / config.high_freq_factor;
  for (float& frequency : frequencies) {
    double wavelength = 2.0 * M_PI / frequency;
    if (wavelength < high_wavelength) continue;
    if (wavelength > low_wavelength) {
      frequency = static_cast<float>(frequency / config.factor);
      continue;
    }
    double smooth = (old_context / wavelength - config.low_freq_factor) /
                    (config.high_freq_factor - config.low_freq_factor);
    frequency = static_cast<float>((1.0 - smooth) * frequency / config.factor + smooth * frequency);
  }
}

double yarn_correction_dim(double rotations, int dim, double base, double max_positions) {
  return dim * std::log(max_positions / (rotations * 2.0 * M_PI)) / (2.0 * std::log(base));
}

float apply_yarn(const RopeConfig& config, int dim, std::vector<float>& frequencies) {
  double base = config.theta;
  double low =
      yarn_correction_dim(config.beta_fast, dim, base, config.original_max_position_embeddings);
  double high =
      yarn_correction_dim(config.beta_slow, dim, base, config.original_max_position_embeddings);
  if (config.truncate) {
    low = std::floor(low);
    high = std::ceil(high);
  }
  low = std::max(low, 0.0);
  high = std::min(high, static_cast<double>(dim - 1));
  if (low == high) high += 0.001;
  for (int i = 0; i < dim / 2; ++i) {
    float extrapolated = frequencies[static_cast<size_t>(i)];
    float interpolated = static_cast<float>(extrapolated / config.factor);
    float ramp = static_cast<float>(std::clamp((i - low) / (high - low), 0.0, 1.0));
    float extrapolation_weight = 1.0f - ramp;
    frequencies[static_cast<size_t>(i)] =
        interpolated * (1.0f - extrapolation_weight) + extrapolated * extrapolation_weight;
  }
  if (config.attention_factor > 0) return static_cast<float>(config.attention_factor);
  if (config.mscale > 0 && config.mscale_all_dim > 0) {
    return static_cast<float>(yarn_mscale(config.factor, config.mscale) /
                              yarn_mscale(config.factor, config.mscale_all_dim));
  }
  return static_cast<float>(yarn_mscale(config.factor, 1.0));
}

}  // namespace

double yarn_mscale(double scale, double mscale) {
  return scale <= 1.0 ? 1.0 : 0.1 * mscale * std::log(scale) + 1.0;
}

RotaryEmbedding::RotaryEmbedding(const RopeConfig& config, int rotary_dim)
    : rotary_dim_(rotary_dim) {
  switch (config.type) {
    case RopeType::kDefault:
      inverse_frequencies_ = default_frequencies(config.theta, rotary_dim);
      break;
    case RopeType::kLinear:
      inverse_frequencies_ = default_frequencies(config.theta, rotary_dim);
      for (float& frequency : inverse_frequencies_)
        frequency = static_cast<float>(frequency / config.factor);
      break;
    case RopeType::kDynamic: {
      // Static NTK scaling sized for the longest context the model serves (as vLLM does), so
      // a token's rotation never depends on how long its batch-mates are.
      double original = config.original_max_position_embeddings;
      double max_positions = original * config.factor;
      double base =
          config.theta * std::pow(config.factor * max_positions / original - (config.factor - 1.0),
                                  static_cast<double>(rotary_dim) / (rotary_dim - 2));
      inverse_frequencies_ = default_frequencies(base, rotary_dim);
      break;
    }
    case RopeType::kLlama3:
      inverse_frequencies_ = default_frequencies(config.theta, rotary_dim);
      apply_llama3(config, inverse_frequencies_);
      break;
    case RopeType::kYarn:
      inverse_frequencies_ = default_frequencies(config.theta, rotary_dim);
      attention_scaling_ = apply_yarn(config, rotary_dim, inverse_frequencies_);
      break;
  }
}

void RotaryEmbedding::compute(const int32_t* positions, int64_t count, float* cos,
                              float* sin) const {
  size_t half = inverse_frequencies_.size();
  for (int64_t t = 0; t < count; ++t) {
    for (size_t i = 0; i < half; ++i) {
      float angle = inverse_frequencies_[i] * static_cast<float>(positions[t]);
      cos[static_cast<size_t>(t) * half + i] =
          static_cast<float>(std::cos(static_cast<double>(angle))) * attention_scaling_;
      sin[static_cast<size_t>(t) * half + i] =
          static_cast<float>(std::sin(static_cast<double>(angle))) * attention_scaling_;
    }
  }
}

}  // namespace deepinfer
