// Rotary position embeddings for every rope type the configs name.
#pragma once

#include <cstdint>
#include <vector>

#include "model/config.h"

namespace deepinfer {

class RotaryEmbedding {
 public:
  // `rotary_dim` is how many of each head's dimensions rotate (the head dim for Llama/Qwen).
  RotaryEmbedding(const RopeConfig& config, int rotary_dim);

  int rotary_dim() const { return rotary_dim_; }
  const std::vector<float>& inverse_frequencies() const { return inverse_frequencies_; }
  // YaRN's magnitude correction, folded into cos and sin as transformers does (1 otherwise).
  float attention_scaling() const { return attention_scaling_; }

  // cos/sin [count, rotary_dim / 2] for the given positions.
  void compute(const int32_t* positions, int64_t count, float* cos, float* sin) const;

 private:
  int rotary_dim_;
  std::vector<float> inverse_frequencies_;
  float attention_scaling_ = 1.0f;
};

// YaRN's mscale: 0.1 * mscale * ln(scale) + 1 for scale > 1, else 1.
double yarn_mscale(double scale, double mscale);

}  // namespace deepinfer
