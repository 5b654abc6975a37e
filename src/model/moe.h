// Mixture-of-experts feed-forward (DeepSeek-V2/V3): routing and expert-grouped compute.
#pragma once

#include <cstdint>
#include <vector>

#include "kernels/ops.h"
#include "model/config.h"
#include "model/layers.h"

namespace deepinfer {

struct MoeWeights {
  const Tensor* router = nullptr;  // mlp.gate.weight [experts, hidden]
  // The routing rule, e_score_correction_bias (noaux_tc, widened) and the experts' weights.
  RoutedExperts routed;
  GatedMlp shared;  // all null without shared experts

  GatedMlp expert(size_t e) const { return {routed.gate[e], routed.up[e], routed.down[e]}; }
  // What one token reads of the routed experts, for rooflines: any `count` of them weigh the
  // same, so the first stand in for them.
  void append_routed_weights(int count, std::vector<const Tensor*>& out) const {
    for (size_t e = 0; e < static_cast<size_t>(count) && e < routed.gate.size(); ++e)
      if (routed.gate[e]) out.insert(out.end(), {routed.gate[e], routed.up[e], routed.down[e]});
  }
};

// The routing rule a MoE config describes.
ExpertRouting expert_routing(const MoeConfig& moe);

// `ops` reads the routing bias back when the weights live in its memory.
MoeWeights bind_moe(Ops& ops, const TensorStore& store, const std::string& prefix,
                    const ModelConfig& config);

// The experts each token goes to and their weights: token t's choices are entries
// [t * k, (t + 1) * k) of both vectors, k = experts_per_token.
struct ExpertChoice {
  std::vector<int32_t> experts;
  std::vector<float> weights;
};

// Scores router_logits [tokens, experts] as the config says (softmax or sigmoid; greedy,
// group-limited or noaux_tc choice; normalisation; routed scaling factor).
ExpertChoice route_tokens(Ops& ops, const MoeConfig& moe, const Tensor& router_logits,
                          const std::vector<float>& correction_bias);

// out [T, hidden] = the shared experts' output for normed [T, hidden] plus the routed experts'
// weighted outputs (Ops::routed_experts). `token_ids` (backend memory, [T]) choose the
// experts of a hash-routed layer; unread (may be null) otherwise.
void run_moe(Ops& ops, const MoeConfig& moe, const MoeWeights& weights, const Tensor& normed,
             const int32_t* token_ids, Tensor& out);

}  // namespace deepinfer
