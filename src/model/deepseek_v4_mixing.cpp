// DeepSeek-V4's residual streams (manifold-constrained hyper-connections) and its mixture of
// experts (sqrt-softplus scores, biased or token-hashed choice, clamped SwiGLU).
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

namespace {

float sqrt_softplus(float logit) {
  float softplus = logit > 20.0f ? logit : std::log1p(std::exp(logit));
  return std::sqrt(softplus);
}

// The k experts of one token: the highest biased scores (ties to the lower index), or the
// token's row of tid2eid.
void choose_experts(const MoeLayerWeights& moe, const float* scores, int experts, int k,
                    int32_t token, bool hash_routed, int32_t* chosen) {
  if (hash_routed) {
    std::copy_n(moe.token_experts.data() + static_cast<int64_t>(token) * k, k, chosen);
    return;
  }
  std::vector<int32_t> order(static_cast<size_t>(experts));
  std::iota(order.begin(), order.end(), 0);
  auto biased = [&](int32_t e) { return scores[e] + moe.bias[static_cast<size_t>(e)]; };
  std::partial_sort(order.begin(), order.begin() + k, order.end(), [&](int32_t a, int32_t b) {
    return biased(a) > biased(b) || (biased(a) == biased(b) && a < b);
  });
  std::copy_n(order.begin(), k, chosen);
}

// out rows += weight * SwiGLU(x rows), gate clamped from above and up on both sides.
void run_expert(Ops& ops, const ExpertWeights& expert, const Tensor& x, float limit,
                const std::vector<float>& weights, const std::vector<int32_t>& rows, int64_t hidden,
                float* out) {
  int64_t n = x.dim(0);
  int64_t width = expert.gate->dim(0);
  FloatTensor gate({n, width}), up({n, width}), down({n, hidden});
  Tensor gate_view = gate.view(), up_view = up.view(), down_view = down.view();
  ops.matmul(x, *expert.gate, nullptr, gate_view);
  ops.matmul(x, *expert.up, nullptr, up_view);
  float* g = gate.data();
  const float* u = up.data();
  for (int64_t i = 0; i < n * width; ++i) {
    float a = g[i], b = u[i];
    if (limit > 0) {
      a = std::min(a, limit);
      b = std::clamp(b, -limit, limit);
    }
    g[i] = a / (1.0f + std::exp(-a)) * b;
  }
  ops.matmul(gate_view, *expert.down, nullptr, down_view);
  for (int64_t r = 0; r < n; ++r) {
    float* target = out + static_cast<int64_t>(rows[static_cast<size_t>(r)]) * hidden;
    const float* source = down.data() + r * hidden;
    float weight = weights[static_cast<size_t>(r)];
    for (int64_t i = 0; i < hidden; ++i) target[i] += weight * source[i];
  }
}

}  // namespace

void run_moe(Ops& ops, const ModelConfig& config, const MoeLayerWeights& moe, const Tensor& normed,
             const std::vector<int32_t>& token_ids, bool hash_routed, float* out) {
  const int64_t tokens = normed.dim(0);
  const int64_t hidden = config.hidden_size;
  const int experts = config.moe.num_experts;
  const int k = config.moe.experts_per_token;
  const auto limit = static_cast<float>(config.v4.swiglu_limit);
  FloatTensor logits({tokens, experts});
  Tensor logits_view = logits.view();
  ops.matmul(normed, *moe.router, nullptr, logits_view);
  // Per expert: the rows it serves and their weights.
  std::vector<std::vector<int32_t>> rows(static_cast<size_t>(experts));
  std::vector<std::vector<float>> weights(static_cast<size_t>(experts));
  std::vector<float> scores(static_cast<size_t>(experts));
  std::vector<int32_t> chosen(static_cast<size_t>(k));
  for (int64_t t = 0; t < tokens; ++t) {
    for (int e = 0; e < experts; ++e)
      scores[static_cast<size_t>(e)] = sqrt_softplus(logits.data()[t * experts + e]);
    choose_experts(moe, scores.data(), experts, k, token_ids[static_cast<size_t>(t)], hash_routed,
                   chosen.data());
    float sum = 0.0f;
    for (int32_t e : chosen) sum += scores[static_cast<size_t>(e)];
    float factor = static_cast<float>(config.moe.routed_scaling_factor) / (sum + 1e-20f);
    for (int32_t e : chosen) {
      rows[static_cast<size_t>(e)].push_back(static_cast<int32_t>(t));
      weights[static_cast<size_t>(e)].push_back(scores[static_cast<size_t>(e)] * factor);
    }
  }
  std::fill(out, out + tokens * hidden, 0.0f);
  const auto* x = static_cast<const float*>(normed.data);
  for (int e = 0; e < experts; ++e) {
    const std::vector<int32_t>& served = rows[static_cast<size_t>(e)];
    if (served.empty()) continue;
    auto n = static_cast<int64_t>(served.size());
    FloatTensor gathered({n, hidden});
    for (int64_t r = 0; r < n; ++r)
      std::copy_n(x + static_cast<int64_t>(served[static_cast<size_t>(r)]) * hidden, hidden,
                  gathered.data() + r * hidden);
    run_expert(ops, moe.experts[static_cast<size_t>(e)], gathered.view(), limit,
               weights[static_cast<size_t>(e)], served, hidden, out);
  }
  if (moe.shared.gate) {
    std::vector<int32_t> all(static_cast<size_t>(tokens));
    std::iota(all.begin(), all.end(), 0);
    run_expert(ops, moe.shared, normed, limit, std::vector<float>(all.size(), 1.0f), all, hidden,
               out);
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
