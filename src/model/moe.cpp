#include "model/moe.h"

#include <fmt/format.h>

#include <algorithm>
#include <cstring>

#include "core/error.h"

namespace deepinfer {
ExpertRouting expert_routing(const MoeConfig& moe) {
  ExpertRouting routing;
  routing.num_experts = moe.num_experts;
  routing.experts_per_token = moe.experts_per_token;
  routing.scoring = moe.scoring == ExpertScoring::kSigmoid ? ExpertRouting::Scoring::kSigmoid
                    : moe.scoring == ExpertScoring::kSqrtSoftplus
                        ? ExpertRouting::Scoring::kSqrtSoftplus
                        : ExpertRouting::Scoring::kSoftmax;
  switch (moe.selection) {
    case ExpertSelection::kGreedy:
      routing.group_ranking = ExpertRouting::GroupRanking::kNone;
      break;
    case ExpertSelection::kGroupLimitedGreedy:
      routing.group_ranking = ExpertRouting::GroupRanking::kBestExpert;
      break;
    case ExpertSelection::kNoAuxTc:
      routing.group_ranking = ExpertRouting::GroupRanking::kTopTwoSum;
      break;
  }
  routing.num_groups = moe.num_groups;
  routing.topk_groups = moe.topk_groups;
  // DeepSeek-V3 normalises then scales; V2 configs set norm_topk_prob false (scale only).
  routing.normalize = moe.normalize_weights;
  routing.scaling = static_cast<float>(moe.routed_scaling_factor);
  routing.swiglu_limit = static_cast<float>(moe.swiglu_limit);
  return routing;
}

namespace {}  // namespace

MoeWeights bind_moe(Ops& ops, const TensorStore& store, const std::string& prefix,
                    const ModelConfig& config) {
  const MoeConfig& moe = config.moe;
  MoeWeights weights;
  weights.routed.routing = expert_routing(moe);
  int64_t hidden = config.hidden_size;
  weights.router = layer_weight(store, prefix + "gate.weight", {moe.num_experts, hidden});
  if (moe.selection == ExpertSelection::kNoAuxTc) {
    weights.routed.correction_bias =
        host_floats(ops, store, prefix + "gate.e_score_correction_bias", {moe.num_experts});
  }
  for (int e = 0; e < moe.num_experts; ++e) {
    GatedMlp expert = bind_gated_mlp(store, fmt::format("{}experts.{}.", prefix, e), hidden,
                                     moe.expert_intermediate_size);
    weights.routed.gate.push_back(expert.gate);
    weights.routed.up.push_back(expert.up);
    weights.routed.down.push_back(expert.down);
  }
  if (moe.num_shared_experts > 0) {
    weights.shared = bind_gated_mlp(store, prefix + "shared_experts.", hidden,
                                    int64_t{moe.expert_intermediate_size} * moe.num_shared_experts);
  }
  return weights;
}

ExpertChoice route_tokens(Ops& ops, const MoeConfig& moe, const Tensor& router_logits,
                          const std::vector<float>& correction_bias) {
  ExpertChoice choice;
  auto entries = static_cast<size_t>(router_logits.dim(0) * moe.experts_per_token);
  choice.experts.resize(entries);
  choice.weights.resize(entries);
  ops.route_experts(router_logits, correction_bias, expert_routing(moe), {}, choice.experts.data(),
                    choice.weights.data());
  return choice;
}

void run_moe(Ops& ops, const MoeConfig& moe, const MoeWeights& weights, const Tensor& normed,
             const int32_t* token_ids, Tensor& out) {
  int64_t tokens = normed.dim(0);
  BackendTensor logits(ops, {tokens, moe.num_experts});
  Tensor logits_view = logits.view();
  ops.matmul(normed, *weights.router, nullptr, logits_view);
  if (weights.shared.gate) {
    run_gated_mlp(ops, weights.shared, normed, out, static_cast<float>(moe.swiglu_limit));
  } else {
    ops.copy(BackendTensor::zeros(ops, {tokens, normed.dim(1)}).view(), out);
  }
  ops.routed_experts(normed, logits.view(), weights.routed, token_ids, out);
}

}  // namespace deepinfer
