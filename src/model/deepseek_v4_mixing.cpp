// DeepSeek-V4's residual streams (manifold-constrained hyper-connections) and rope tables.
#include <algorithm>
#include <cmath>
#include <numeric>

#include "core/error.h"
#include "model/deepseek_v4.h"

namespace deepinfer::v4 {
namespace {

float sigmoid(float x) {
  return 1.0f / (1.0f + std::exp(-x));
}

// 1 / rms of n values (unweighted RMSNorm's factor).
float inverse_rms(const float* x, int64_t n, double eps) {
  double sum = 0.0;
  for (int64_t i = 0; i < n; ++i) sum += double{x[i]} * x[i];
  return static_cast<float>(1.0 / std::sqrt(sum / static_cast<double>(n) + eps));
}

// rows [count] = fn [count, n] . (x * factor).
void project(const std::vector<float>& fn, int64_t count, const float* x, int64_t n, float factor,
             float* rows) {
  for (int64_t r = 0; r < count; ++r) {
    const float* weights = fn.data() + r * n;
    double sum = 0.0;
    for (int64_t i = 0; i < n; ++i) sum += double{weights[i]} * x[i];
    rows[r] = static_cast<float>(sum) * factor;
  }
}

// Projects the HC x HC logits onto (nearly) doubly stochastic matrices: a row softmax, then
// alternating column and row normalisations, each with eps in the denominator.
void sinkhorn(float* m, int n, int iterations, float eps) {
  for (int j = 0; j < n; ++j) {
    float* row = m + j * n;
    float top = *std::max_element(row, row + n);
    float sum = 0.0f;
    for (int k = 0; k < n; ++k) sum += row[k] = std::exp(row[k] - top);
    for (int k = 0; k < n; ++k) row[k] = row[k] / sum + eps;
  }
  auto normalize_columns = [&] {
    for (int k = 0; k < n; ++k) {
      float sum = 0.0f;
      for (int j = 0; j < n; ++j) sum += m[j * n + k];
      for (int j = 0; j < n; ++j) m[j * n + k] /= sum + eps;
    }
  };
  normalize_columns();
  for (int i = 1; i < iterations; ++i) {
    for (int j = 0; j < n; ++j) {
      float sum = 0.0f;
      for (int k = 0; k < n; ++k) sum += m[j * n + k];
      for (int k = 0; k < n; ++k) m[j * n + k] /= sum + eps;
    }
    normalize_columns();
  }
}

}  // namespace

HcMix hc_pre(const ModelConfig& config, const HyperConnection& hc,
             const std::vector<float>& streams, int64_t tokens, float* collapsed) {
  const int n = config.v4.hc_mult;
  const int64_t d = config.hidden_size;
  const auto eps = static_cast<float>(config.v4.hc_eps);
  const int64_t mixes = int64_t{2 + n} * n;
  HcMix mix;
  mix.pre.resize(static_cast<size_t>(tokens * n));
  mix.post.resize(mix.pre.size());
  mix.comb.resize(static_cast<size_t>(tokens * n * n));
  std::vector<float> logits(static_cast<size_t>(mixes));
  for (int64_t t = 0; t < tokens; ++t) {
    const float* x = streams.data() + t * n * d;
    project(hc.fn, mixes, x, n * d, inverse_rms(x, n * d, config.rms_norm_eps), logits.data());
    float* pre = mix.pre.data() + t * n;
    float* post = mix.post.data() + t * n;
    float* comb = mix.comb.data() + t * n * n;
    for (int j = 0; j < n; ++j) {
      pre[j] = sigmoid(logits[j] * hc.scale[0] + hc.base[j]) + eps;
      post[j] = 2.0f * sigmoid(logits[n + j] * hc.scale[1] + hc.base[n + j]);
    }
    for (int i = 0; i < n * n; ++i) comb[i] = logits[2 * n + i] * hc.scale[2] + hc.base[2 * n + i];
    sinkhorn(comb, n, config.v4.hc_sinkhorn_iters, eps);
    float* c = collapsed + t * d;
    std::fill(c, c + d, 0.0f);
    for (int j = 0; j < n; ++j) {
      for (int64_t i = 0; i < d; ++i) c[i] += pre[j] * x[j * d + i];
    }
  }
  return mix;
}

void hc_post(const ModelConfig& config, const HcMix& mix, const float* out, int64_t tokens,
             std::vector<float>& streams) {
  const int n = config.v4.hc_mult;
  const int64_t d = config.hidden_size;
  std::vector<float> mixed(static_cast<size_t>(n * d));
  for (int64_t t = 0; t < tokens; ++t) {
    float* x = streams.data() + t * n * d;
    const float* post = mix.post.data() + t * n;
    const float* comb = mix.comb.data() + t * n * n;
    const float* y = out + t * d;
    for (int k = 0; k < n; ++k) {
      float* target = mixed.data() + k * d;
      for (int64_t i = 0; i < d; ++i) target[i] = post[k] * y[i];
      // Stream k takes column k of comb: the sum runs over the first index.
      for (int j = 0; j < n; ++j) {
        float weight = comb[j * n + k];
        for (int64_t i = 0; i < d; ++i) target[i] += weight * x[j * d + i];
      }
    }
    std::copy(mixed.begin(), mixed.end(), x);
  }
}

void hc_head(const ModelConfig& config, const HyperConnection& hc,
             const std::vector<float>& streams, int64_t tokens, float* hidden) {
  const int n = config.v4.hc_mult;
  const int64_t d = config.hidden_size;
  const auto eps = static_cast<float>(config.v4.hc_eps);
  std::vector<float> logits(static_cast<size_t>(n));
  for (int64_t t = 0; t < tokens; ++t) {
    const float* x = streams.data() + t * n * d;
    project(hc.fn, n, x, n * d, inverse_rms(x, n * d, config.rms_norm_eps), logits.data());
    float* h = hidden + t * d;
    std::fill(h, h + d, 0.0f);
    for (int j = 0; j < n; ++j) {
      float pre = sigmoid(logits[static_cast<size_t>(j)] * hc.scale[0] + hc.base[j]) + eps;
      for (int64_t i = 0; i < d; ++i) h[i] += pre * x[j * d + i];
    }
  }
}

RopeTables::RopeTables(const ModelConfig& config, const std::vector<int32_t>& positions)
    : compress(config.v4.compress_rope, config.v4.rope_dims) {
  const DeepseekV4Config& v4 = config.v4;
  auto count = static_cast<int64_t>(positions.size());
  auto size = static_cast<size_t>(count * v4.rope_dims / 2);
  main_cos.resize(size);
  main_sin.resize(size);
  compress_cos.resize(size);
  compress_sin.resize(size);
  RotaryEmbedding(v4.main_rope, v4.rope_dims)
      .compute(positions.data(), count, main_cos.data(), main_sin.data());
  compress.compute(positions.data(), count, compress_cos.data(), compress_sin.data());
}

}  // namespace deepinfer::v4
