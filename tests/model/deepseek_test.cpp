// DeepSeek specifics beyond fixture parity: the absorbed decode against the expanded form,
// the latent cache's size, MTP modules, expert routing, and FP8 checkpoint errors.
#include <gtest/gtest.h>

#include <fstream>
#include <nlohmann/json.hpp>

#include "core/error.h"
#include "engine/sequence_runner.h"
#include "kernels/ops.h"
#include "model/make_model.h"
#include "model/model.h"
#include "model/moe.h"
#include "support/test_support.h"

namespace deepinfer {
namespace {

using testing::fixture_model;
using testing::max_abs_difference;
using testing::small_deepseek_v3;
using testing::TempDir;

std::string load_error(const std::filesystem::path& folder, Ops& ops) {
  try {
    load_model(folder, LoadMode::kMmap, ops);
  } catch (const Error& error) {
    return error.what();
  }
  return "";
}

// 40 greedy steps with the latent cache (every step absorbed) and with the expanded cache:
// the same tokens and, step by step, the same logits.
void expect_absorbed_equals_expanded(const std::filesystem::path& folder) {
  auto ops = make_cpu_ops();
  ModelLoadOptions latent, expanded;
  latent.mla_expand_min_tokens = 1 << 30;
  expanded.mla_cache = MlaCache::kExpanded;
  auto latent_model = load_model(folder, latent, *ops);
  auto expanded_model = load_model(folder, expanded, *ops);
  constexpr int kSteps = 40;
  std::vector<int32_t> prompt = {3, 17, 5, 42, 9};
  SequenceRunner latent_runner(*latent_model, static_cast<int64_t>(prompt.size()) + kSteps);
  SequenceRunner expanded_runner(*expanded_model, static_cast<int64_t>(prompt.size()) + kSteps);
  std::vector<int32_t> next = prompt;
  int64_t vocab = latent_model->config().vocab_size;
  for (int step = 0; step < kSteps; ++step) {
    std::vector<float> a = latent_runner.feed(next, false);
    std::vector<float> b = expanded_runner.feed(next, false);
    ASSERT_EQ(a.size(), static_cast<size_t>(vocab));
    EXPECT_LE(max_abs_difference(a.data(), b.data(), a.size()), 1e-4f) << "step " << step;
    int32_t token_a = argmax(a.data(), vocab);
    ASSERT_EQ(token_a, argmax(b.data(), vocab)) << "step " << step;
    next = {token_a};
  }
}

TEST(DeepseekMla, AbsorbedDecodeMatchesExpandedFormOver40Tokens) {
  expect_absorbed_equals_expanded(fixture_model("deepseek-v3-mla-moe"));
  expect_absorbed_equals_expanded(fixture_model("deepseek-v2-lite-style"));
}

TEST(DeepseekMla, AbsorbedDecodeMatchesExpandedFormWithFp8Weights) {
  expect_absorbed_equals_expanded(fixture_model("deepseek-v3-fp8"));
}

TEST(DeepseekMla, LatentCacheHoldsRankPlusRopeValuesPerToken) {
  TempDir dir;
  make_random_model(small_deepseek_v3(), dir.path());
  auto ops = make_cpu_ops();
  ModelLoadOptions expanded;
  expanded.mla_cache = MlaCache::kExpanded;
  KvCacheShape latent = load_model(dir.path(), ModelLoadOptions{}, *ops)->kv_shape(16);
  KvCacheShape heads = load_model(dir.path(), expanded, *ops)->kv_shape(16);
  EXPECT_EQ(latent.floats_per_token_layer(), 32 + 8);
  EXPECT_EQ(latent.bytes_per_token(), sizeof(float) * 3 * (32 + 8));
  EXPECT_EQ(heads.floats_per_token_layer(), 4 * ((16 + 8) + 16));
}

TEST(DeepseekMtp, ModulesLoadAndTheirWeightsAreAddressable) {
  TempDir dir;
  MakeModelOptions o = small_deepseek_v3();
  o.num_mtp_layers = 1;
  o.dtype = DType::kF8E4M3;
  make_random_model(o, dir.path());
  auto ops = make_cpu_ops();
  auto model = load_model(dir.path(), LoadMode::kMmap, *ops);
  ASSERT_EQ(model->num_mtp_modules(), 1);
  auto weights = model->mtp_module_weights(0);
  for (const char* name :
       {"enorm.weight", "hnorm.weight", "eh_proj.weight", "embed_tokens.weight",
        "shared_head.norm.weight", "shared_head.head.weight", "self_attn.kv_b_proj.weight",
        "mlp.experts.7.down_proj.weight", "mlp.gate.e_score_correction_bias"}) {
    EXPECT_TRUE(weights.count(name)) << name;
  }
  const Tensor& eh_proj = *weights.at("eh_proj.weight");
  EXPECT_EQ(eh_proj.dim(0), 64);
  EXPECT_EQ(eh_proj.dim(1), 128);
  EXPECT_EQ(eh_proj.dtype, DType::kF8E4M3);
  EXPECT_NE(eh_proj.block_scales, nullptr);
  // The main model is unaffected by the extra layer: generation still runs.
  GreedyOptions greedy;
  greedy.max_new_tokens = 4;
  EXPECT_EQ(generate_greedy(*model, {1, 2, 3}, greedy).size(), 4u);

  // A config promising more MTP modules than the checkpoint holds names the missing tensor.
  nlohmann::json config;
  std::ifstream(dir.path() / "config.json") >> config;
  config["num_nextn_predict_layers"] = 2;
  std::ofstream(dir.path() / "config.json") << config.dump();
  EXPECT_NE(load_error(dir.path(), *ops).find("model.layers.4.input_layernorm.weight"),
            std::string::npos);
}

TEST(DeepseekFp8, MissingOrMisshapenScalesAreNamed) {
  TempDir dir;
  MakeModelOptions o = small_deepseek_v3();
  o.dtype = DType::kF8E4M3;
  make_random_model(o, dir.path());
  auto ops = make_cpu_ops();
  nlohmann::json config;
  std::ifstream(dir.path() / "config.json") >> config;
  // 64-wide blocks would need twice as many scales as the 128-wide ones stored.
  config["quantization_config"]["weight_block_size"] = {64, 64};
  std::ofstream(dir.path() / "config.json") << config.dump();
  std::string error = load_error(dir.path(), *ops);
  EXPECT_NE(error.find("_scale_inv\" has shape"), std::string::npos) << error;
  config.erase("quantization_config");
  std::ofstream(dir.path() / "config.json") << config.dump();
  error = load_error(dir.path(), *ops);
  EXPECT_NE(error.find("block-scaled F8_E4M3"), std::string::npos) << error;
}

ExpertChoice route(const MoeConfig& moe, std::vector<float> logits,
                   const std::vector<float>& bias) {
  auto ops = make_cpu_ops();
  Tensor view =
      Tensor::contiguous(logits.data(), DType::kF32,
                         {static_cast<int64_t>(logits.size()) / moe.num_experts, moe.num_experts});
  return route_tokens(*ops, moe, view, bias);
}

MoeConfig routing_config(ExpertSelection selection, ExpertScoring scoring) {
  MoeConfig moe;
  moe.num_experts = 8;
  moe.experts_per_token = 2;
  moe.num_groups = 4;
  moe.topk_groups = 2;
  moe.selection = selection;
  moe.scoring = scoring;
  return moe;
}

TEST(MoeRouting, NoauxTcChoosesByBiasedGroupsButWeighsUnbiasedScores) {
  MoeConfig moe = routing_config(ExpertSelection::kNoAuxTc, ExpertScoring::kSigmoid);
  moe.normalize_weights = true;
  moe.routed_scaling_factor = 2.5;
  // Expert 0 has the best logit, but its group (0, 1) sums lowest with the bias; groups
  // (4, 5) and (6, 7) win, and inside them the biased scores pick 5 and 6.
  std::vector<float> logits = {3.0f, -3.0f, 0.0f, 0.0f, 0.5f, 1.0f, 1.0f, 0.2f};
  std::vector<float> bias = {0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.3f, 0.0f};
  ExpertChoice choice = route(moe, logits, bias);
  ASSERT_EQ(choice.experts.size(), 2u);
  EXPECT_EQ(choice.experts[0], 6);
  EXPECT_EQ(choice.experts[1], 5);
  // Both unbiased scores are sigmoid(1): normalised to 1/2 each, times 2.5.
  EXPECT_NEAR(choice.weights[0], 1.25f, 1e-6f);
  EXPECT_NEAR(choice.weights[1], 1.25f, 1e-6f);
}

TEST(MoeRouting, GroupLimitedGreedyRanksGroupsByTheirBestExpert) {
  MoeConfig moe = routing_config(ExpertSelection::kGroupLimitedGreedy, ExpertScoring::kSoftmax);
  moe.routed_scaling_factor = 16.0;
  // Greedy would take experts 2 and 3 (group 1); groups are ranked by their best expert, so
  // groups 1 (best 2.0) and 3 (best 1.9) stay and the second choice is 7.
  std::vector<float> logits = {0.0f, 0.0f, 2.0f, 1.95f, 0.0f, 0.0f, 0.0f, 1.9f};
  ExpertChoice greedy_choice =
      route(routing_config(ExpertSelection::kGreedy, ExpertScoring::kSoftmax), logits, {});
  EXPECT_EQ(greedy_choice.experts, (std::vector<int32_t>{2, 3}));
  moe.topk_groups = 1;
  ExpertChoice choice = route(moe, logits, {});
  EXPECT_EQ(choice.experts, (std::vector<int32_t>{2, 3}));
  moe.topk_groups = 2;
  std::vector<float> spread = {0.0f, 0.0f, 2.0f, 1.85f, 0.0f, 0.0f, 1.9f, 0.0f};
  choice = route(moe, spread, {});
  EXPECT_EQ(choice.experts, (std::vector<int32_t>{2, 6}));
  float total = 0.0f;
  for (float logit : spread) total += std::exp(logit);
  EXPECT_NEAR(choice.weights[0], 16.0f * std::exp(2.0f) / total, 1e-5f);
}

}  // namespace
}  // namespace deepinfer
