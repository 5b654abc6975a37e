#include "model/moe.h"

#include <fmt/format.h>

#include <algorithm>
#include <cstring>
#include <deque>

#include "core/error.h"

namespace deepinfer {
namespace {

ExpertRouting routing_of(const MoeConfig& moe) {
  ExpertRouting routing;
  routing.num_experts = moe.num_experts;
  routing.experts_per_token = moe.experts_per_token;
  routing.scoring = moe.scoring == ExpertScoring::kSigmoid ? ExpertRouting::Scoring::kSigmoid
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
  return routing;
}

}  // namespace

MoeWeights bind_moe(Ops& ops, const TensorStore& store, const std::string& prefix,
                    const ModelConfig& config) {
  const MoeConfig& moe = config.moe;
  MoeWeights weights;
  int64_t hidden = config.hidden_size;
  weights.router = layer_weight(store, prefix + "gate.weight", {moe.num_experts, hidden});
  if (moe.selection == ExpertSelection::kNoAuxTc) {
    const Tensor& bias = store.get(prefix + "gate.e_score_correction_bias", {moe.num_experts});
    if (bias.dtype != DType::kF32 && bias.dtype != DType::kBF16) {
      fail("tensor \"{}gate.e_score_correction_bias\" has dtype {}; expected F32 or BF16", prefix,
           dtype_name(bias.dtype));
    }
    std::vector<std::byte> raw(bias.nbytes());
    ops.to_host(raw.data(), bias.data, raw.size());
    for (int64_t e = 0; e < moe.num_experts; ++e) {
      float value = 0.0f;
      if (bias.dtype == DType::kF32) {
        std::memcpy(&value, raw.data() + e * 4, 4);
      } else {
        uint16_t bits = 0;
        std::memcpy(&bits, raw.data() + e * 2, 2);
        value = bf16_to_f32(bits);
      }
      weights.correction_bias.push_back(value);
    }
  }
  for (int e = 0; e < moe.num_experts; ++e) {
    weights.experts.push_back(bind_gated_mlp(store, fmt::format("{}experts.{}.", prefix, e), hidden,
                                             moe.expert_intermediate_size));
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
  ops.route_experts(router_logits, correction_bias, routing_of(moe), choice.experts.data(),
                    choice.weights.data());
  return choice;
}

void run_moe(Ops& ops, const MoeConfig& moe, const MoeWeights& weights, const Tensor& normed,
             Tensor& out) {
  int64_t tokens = normed.dim(0);
  int64_t hidden = normed.dim(1);
  BackendTensor logits(ops, {tokens, moe.num_experts});
  Tensor logits_view = logits.view();
  ops.matmul(normed, *weights.router, nullptr, logits_view);
  ExpertChoice choice = route_tokens(ops, moe, logits.view(), weights.correction_bias);

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
    BackendTensor input, gate, up, output;
  };
  std::vector<Active> active;
  int64_t inter = moe.expert_intermediate_size;
  for (size_t e = 0; e < experts; ++e) {
    if (rows[e].empty()) continue;
    auto count = static_cast<int64_t>(rows[e].size());
    active.push_back({e, BackendTensor(ops, {count, hidden}), BackendTensor(ops, {count, inter}),
                      BackendTensor(ops, {count, inter}), BackendTensor(ops, {count, hidden})});
    Tensor input = active.back().input.view();
    ops.gather_rows(normed, rows[e], input);
  }
  bool shared = weights.shared.gate != nullptr;
  int64_t shared_inter = shared ? weights.shared.gate->dim(0) : 0;
  BackendTensor shared_gate(ops, {tokens, std::max<int64_t>(shared_inter, 1)});
  BackendTensor shared_up(ops, {tokens, std::max<int64_t>(shared_inter, 1)});
  std::deque<Tensor> views;  // the jobs point into it: a deque keeps elements where they are
  auto view_of = [&](const BackendTensor& tensor) -> Tensor* {
    return &views.emplace_back(tensor.view());
  };

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
  if (!shared) ops.copy(BackendTensor::zeros(ops, {tokens, hidden}).view(), out);
  for (const Active& a : active)
    ops.add_scaled_rows(out, rows[a.expert], scales[a.expert], a.output.view());
}

}  // namespace deepinfer
