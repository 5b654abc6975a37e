#include "model/moe.h"

#include <fmt/format.h>

#include <algorithm>
#include <deque>
#include <cmath>
#include <numeric>

#include "core/error.h"

namespace deepinfer {
namespace {

// Indices of the `count` largest values, largest first; ties keep the lower index first.
std::vector<int> top_indices(const std::vector<float>& values, int count) {
  std::vector<int> order(values.size());
  std::iota(order.begin(), order.end(), 0);
  std::partial_sort(order.begin(), order.begin() + count, order.end(), [&](int a, int b) {
    return values[static_cast<size_t>(a)] > values[static_cast<size_t>(b)] ||
           (values[static_cast<size_t>(a)] == values[static_cast<size_t>(b)] && a < b);
  });
  order.resize(static_cast<size_t>(count));
  return order;
}

std::vector<float> expert_scores(const MoeConfig& moe, const float* logits) {
  auto experts = static_cast<size_t>(moe.num_experts);
  std::vector<float> scores(logits, logits + experts);
  if (moe.scoring == ExpertScoring::kSigmoid) {
    for (float& score : scores) score = 1.0f / (1.0f + std::exp(-score));
    return scores;
  }
  float max_logit = *std::max_element(scores.begin(), scores.end());
  float total = 0.0f;
  for (float& score : scores) total += score = std::exp(score - max_logit);
  for (float& score : scores) score /= total;
  return scores;
}

// Zeroes the choice scores of every expert outside the topk_groups best groups (transformers
// and DeepSeek mask with 0, not -inf).
void keep_best_groups(const MoeConfig& moe, std::vector<float>& choice) {
  int per_group = moe.num_experts / moe.num_groups;
  std::vector<float> group_scores(static_cast<size_t>(moe.num_groups));
  for (int g = 0; g < moe.num_groups; ++g) {
    std::vector<float> members(choice.begin() + g * per_group,
                               choice.begin() + (g + 1) * per_group);
    if (moe.selection == ExpertSelection::kNoAuxTc) {
      std::vector<int> best = top_indices(members, 2);
      group_scores[static_cast<size_t>(g)] =
          members[static_cast<size_t>(best[0])] + members[static_cast<size_t>(best[1])];
    } else {
      group_scores[static_cast<size_t>(g)] = *std::max_element(members.begin(), members.end());
    }
  }
  std::vector<int> kept = top_indices(group_scores, moe.topk_groups);
  std::vector<bool> keep(static_cast<size_t>(moe.num_groups), false);
  for (int g : kept) keep[static_cast<size_t>(g)] = true;
  for (int e = 0; e < moe.num_experts; ++e) {
    if (!keep[static_cast<size_t>(e / per_group)]) choice[static_cast<size_t>(e)] = 0.0f;
  }
}

}  // namespace

MoeWeights bind_moe(const TensorStore& store, const std::string& prefix, const ModelConfig& config) {
  const MoeConfig& moe = config.moe;
  MoeWeights weights;
  int64_t hidden = config.hidden_size;
  weights.router = layer_weight(store, prefix + "gate.weight", {moe.num_experts, hidden});
  if (moe.selection == ExpertSelection::kNoAuxTc) {
    const Tensor& bias = store.get(prefix + "gate.e_score_correction_bias", {moe.num_experts});
    for (int64_t e = 0; e < moe.num_experts; ++e) {
      switch (bias.dtype) {
        case DType::kF32:
          weights.correction_bias.push_back(bias.as<const float>()[e]);
          break;
        case DType::kBF16:
          weights.correction_bias.push_back(bf16_to_f32(bias.as<const uint16_t>()[e]));
          break;
        default:
          fail("tensor \"{}gate.e_score_correction_bias\" has dtype {}; expected F32 or BF16",
               prefix, dtype_name(bias.dtype));
      }
    }
  }
  for (int e = 0; e < moe.num_experts; ++e) {
    weights.experts.push_back(bind_gated_mlp(store, fmt::format("{}experts.{}.", prefix, e), hidden,
                                             moe.expert_intermediate_size));
  }
  if (moe.num_shared_experts > 0) {
    weights.shared =
        bind_gated_mlp(store, prefix + "shared_experts.", hidden,
                       int64_t{moe.expert_intermediate_size} * moe.num_shared_experts);
  }
  return weights;
}

ExpertChoice route_tokens(const MoeConfig& moe, const float* router_logits,
                          const std::vector<float>& correction_bias, int64_t tokens) {
  ExpertChoice choice;
  int k = moe.experts_per_token;
  for (int64_t t = 0; t < tokens; ++t) {
    std::vector<float> scores = expert_scores(moe, router_logits + t * moe.num_experts);
    std::vector<float> candidates = scores;
    for (size_t e = 0; e < correction_bias.size(); ++e) candidates[e] += correction_bias[e];
    if (moe.selection != ExpertSelection::kGreedy && moe.num_groups > 1)
      keep_best_groups(moe, candidates);
    std::vector<int> chosen = top_indices(candidates, k);
    float total = 0.0f;
    for (int e : chosen) total += scores[static_cast<size_t>(e)];
    // DeepSeek-V3 normalises then scales; V2 configs set norm_topk_prob false (scale only).
    float factor = static_cast<float>(moe.routed_scaling_factor);
    if (moe.normalize_weights) factor /= total + 1e-20f;
    for (int e : chosen) {
      choice.experts.push_back(e);
      choice.weights.push_back(scores[static_cast<size_t>(e)] * factor);
    }
  }
  return choice;
}

void run_moe(Ops& ops, const MoeConfig& moe, const MoeWeights& weights, const Tensor& normed,
             Tensor& out) {
  int64_t tokens = normed.dim(0);
  int64_t hidden = normed.dim(1);
  FloatTensor logits({tokens, moe.num_experts});
  Tensor logits_view = logits.view();
  ops.matmul(normed, *weights.router, nullptr, logits_view);
  ExpertChoice choice = route_tokens(moe, logits.data(), weights.correction_bias, tokens);

  // Tokens (and their weights) per expert, in token order.
  auto experts = static_cast<size_t>(moe.num_experts);
  std::vector<std::vector<int32_t>> rows(experts);
  std::vector<std::vector<float>> scales(experts);
  for (size_t i = 0; i < choice.experts.size(); ++i) {
    auto e = static_cast<size_t>(choice.experts[i]);
    rows[e].push_back(static_cast<int32_t>(i / static_cast<size_t>(moe.experts_per_token)));
    scales[e].push_back(choice.weights[i]);
  }
  struct Active {
    size_t expert;
    FloatTensor input, gate, up, output;
  };
  std::vector<Active> active;
  int64_t inter = moe.expert_intermediate_size;
  for (size_t e = 0; e < experts; ++e) {
    if (rows[e].empty()) continue;
    auto count = static_cast<int64_t>(rows[e].size());
    active.push_back({e, FloatTensor({count, hidden}), FloatTensor({count, inter}),
                      FloatTensor({count, inter}), FloatTensor({count, hidden})});
    Tensor input = active.back().input.view();
    ops.gather_rows(normed, rows[e], input);
  }
  bool shared = weights.shared.gate != nullptr;
  int64_t shared_inter = shared ? weights.shared.gate->dim(0) : 0;
  FloatTensor shared_gate({tokens, std::max<int64_t>(shared_inter, 1)});
  FloatTensor shared_up({tokens, std::max<int64_t>(shared_inter, 1)});
  std::deque<Tensor> views;  // the jobs point into it: a deque keeps elements where they are
  auto view_of = [&](const FloatTensor& tensor) -> Tensor* { return &views.emplace_back(tensor.view()); };

  std::vector<MatmulJob> up_jobs;
  for (Active& a : active) {
    const GatedMlp& mlp = weights.experts[a.expert];
    up_jobs.push_back({mlp.gate, nullptr, view_of(a.gate), view_of(a.input)});
    up_jobs.push_back({mlp.up, nullptr, view_of(a.up), view_of(a.input)});
  }
  if (shared) {
    up_jobs.push_back({weights.shared.gate, nullptr, view_of(shared_gate)});
    up_jobs.push_back({weights.shared.up, nullptr, view_of(shared_up)});
  }
  ops.matmuls(normed, up_jobs);

  std::vector<MatmulJob> down_jobs;
  for (Active& a : active) {
    Tensor gate = a.gate.view();
    ops.silu_mul(gate, a.up.view(), gate);
    down_jobs.push_back(
        {weights.experts[a.expert].down, nullptr, view_of(a.output), view_of(a.gate)});
  }
  if (shared) {
    Tensor gate = shared_gate.view();
    ops.silu_mul(gate, shared_up.view(), gate);
    down_jobs.push_back({weights.shared.down, nullptr, &out, view_of(shared_gate)});
  }
  ops.matmuls(normed, down_jobs);
  if (!shared) std::fill_n(out.as<float>(), out.numel(), 0.0f);
  for (const Active& a : active) ops.add_scaled_rows(out, rows[a.expert], scales[a.expert], a.output.view());
}

}  // namespace deepinfer
