#include "kernels/cpu/routing.h"

#include <algorithm>
#include <cmath>
#include <numeric>

namespace deepinfer::cpu {
namespace {

// Indices of the `count` largest values, largest first; ties keep the lower index first.
std::vector<int> top_indices(const std::vector<float>& values, int count) {
  std::vector<int> order(values.size());
  std::iota(order.begin(), order.end(), 0);
  auto larger = [&](int a, int b) {
    float va = values[static_cast<size_t>(a)];
    float vb = values[static_cast<size_t>(b)];
    return va > vb || (va == vb && a < b);
  };
  std::partial_sort(order.begin(), order.begin() + count, order.end(), larger);
  order.resize(static_cast<size_t>(count));
  return order;
}

std::vector<float> expert_scores(const ExpertRouting& routing, const float* logits) {
  std::vector<float> scores(logits, logits + routing.num_experts);
  if (routing.scoring == ExpertRouting::Scoring::kSigmoid) {
    for (float& score : scores) score = 1.0f / (1.0f + std::exp(-score));
    return scores;
  }
  if (routing.scoring == ExpertRouting::Scoring::kSqrtSoftplus) {
    for (float& score : scores)
      score = std::sqrt(score > 20.0f ? score : std::log1p(std::exp(score)));
    return scores;
  }
  float max_logit = *std::max_element(scores.begin(), scores.end());
  float total = 0.0f;
  for (float& score : scores) total += score = std::exp(score - max_logit);
  for (float& score : scores) score /= total;
  return scores;
}

// Zeroes the candidates of every expert outside the topk_groups best groups.
void keep_best_groups(const ExpertRouting& routing, std::vector<float>& candidates) {
  int per_group = routing.num_experts / routing.num_groups;
  std::vector<float> group_scores(static_cast<size_t>(routing.num_groups));
  for (int g = 0; g < routing.num_groups; ++g) {
    std::vector<float> members(candidates.begin() + g * per_group,
                               candidates.begin() + (g + 1) * per_group);
    float& score = group_scores[static_cast<size_t>(g)];
    if (routing.group_ranking == ExpertRouting::GroupRanking::kTopTwoSum) {
      std::vector<int> best = top_indices(members, 2);
      score = members[static_cast<size_t>(best[0])] + members[static_cast<size_t>(best[1])];
    } else {
      score = *std::max_element(members.begin(), members.end());
    }
  }
  std::vector<bool> keep(static_cast<size_t>(routing.num_groups), false);
  for (int g : top_indices(group_scores, routing.topk_groups)) keep[static_cast<size_t>(g)] = true;
  for (int e = 0; e < routing.num_experts; ++e) {
    if (!keep[static_cast<size_t>(e / per_group)]) candidates[static_cast<size_t>(e)] = 0.0f;
  }
}

}  // namespace

void route_token(const float* logits, const std::vector<float>& correction_bias,
                 const ExpertRouting& routing, const int32_t* fixed, int32_t* experts,
                 float* weights) {
  std::vector<float> scores = expert_scores(routing, logits);
  std::vector<int> chosen;
  if (fixed) {
    chosen.assign(fixed, fixed + routing.experts_per_token);
  } else {
    std::vector<float> candidates = scores;
    for (size_t e = 0; e < correction_bias.size(); ++e) candidates[e] += correction_bias[e];
    if (routing.group_ranking != ExpertRouting::GroupRanking::kNone && routing.num_groups > 1)
      keep_best_groups(routing, candidates);
    chosen = top_indices(candidates, routing.experts_per_token);
  }
  float total = 0.0f;
  for (int e : chosen) total += scores[static_cast<size_t>(e)];
  float factor = routing.scaling;
  if (routing.normalize) factor /= total + 1e-20f;
  for (size_t i = 0; i < chosen.size(); ++i) {
    experts[i] = chosen[i];
    weights[i] = scores[static_cast<size_t>(chosen[i])] * factor;
  }
}

}  // namespace deepinfer::cpu
