// Speculative decoding with DeepSeek's MTP module: the module's drafts do not depend on how
// the positions reached it (one absorb or several), greedy output is the same as without it
// beside prefill chunks and preemption, and a model without the module is refused.
#include "engine/mtp_drafter.h"

#include <gtest/gtest.h>

#include "core/error.h"
#include "engine/engine.h"
#include "support/test_support.h"

namespace deepinfer {
namespace {

using testing::greedy_request;
using testing::serve;
using testing::Served;
using testing::TempDir;

// The small DeepSeek-V3 with one MTP module.
MakeModelOptions deepseek_with_mtp() {
  MakeModelOptions o = testing::small_deepseek_v3();
  o.num_layers = 2;
  o.num_mtp_layers = 1;
  o.seed = 5;
  return o;
}

std::vector<int32_t> prompt_of(int length, int salt) {
  std::vector<int32_t> prompt;
  for (int i = 0; i < length; ++i) prompt.push_back((i * 37 + salt * 11 + 3) % 300);
  return prompt;
}

// The model's final-norm output at every position of `tokens`.
std::vector<float> final_hidden(CausalLM& model, const std::vector<int32_t>& tokens) {
  KvCache cache(model.kv_shape(16), 8);
  SequenceKv kv;
  kv.reserve(cache, static_cast<int64_t>(tokens.size()));
  ForwardBatch batch;
  batch.add_sequence(tokens, 0, kv, cache.shape().block_size, false);
  std::vector<float> logits(static_cast<size_t>(model.config().vocab_size)), hidden;
  model.forward(batch, cache, logits.data(), [&](int index, const Tensor& state) {
    if (index == model.config().num_layers)
      hidden.assign(state.as<const float>(), state.as<const float>() + state.numel());
  });
  kv.release_all(cache);
  return hidden;
}

// The module's greedy proposal of up to `limit` drafts after `tokens`.
DraftProposal greedy_proposal(MtpDrafter& drafter, const std::vector<int32_t>& tokens,
                              int64_t limit) {
  sampling::SamplingParams greedy;
  greedy.temperature = 0.0f;
  sampling::TokenHistory history;
  DraftAsk ask;
  ask.owner = &tokens;
  ask.tokens = tokens;
  ask.limit = limit;
  ask.params = &greedy;
  ask.history = &history;
  return drafter.propose({ask}, 0.0).at(0);
}

std::vector<int32_t> drafts_after(MtpDrafter& drafter, const std::vector<int32_t>& tokens) {
  return greedy_proposal(drafter, tokens, 4).tokens;
}

TEST(MtpDrafter, DraftsDoNotDependOnHowPositionsArrive) {
  TempDir dir;
  make_random_model(deepseek_with_mtp(), dir.path());
  auto ops = make_cpu_ops();
  auto model = load_model(dir.path(), LoadMode::kMmap, *ops);
  const std::vector<int32_t> tokens = prompt_of(40, 1);
  const std::vector<float> hidden = final_hidden(*model, tokens);
  const auto width = static_cast<size_t>(model->config().hidden_size);
  MtpDrafter whole(*model, 300, 16, 64, 4), pieces(*model, 300, 16, 64, 4);
  whole.absorb({{&tokens, tokens, 0, 39, hidden.data()}});
  int64_t start = 0;
  for (int64_t count : {10, 1, 17, 11}) {
    pieces.absorb({{&tokens, tokens, start, count, hidden.data() + start * width}});
    start += count;
  }
  const std::vector<int32_t> drafts = drafts_after(whole, tokens);
  EXPECT_EQ(drafts.size(), 4u);
  EXPECT_EQ(drafts_after(pieces, tokens), drafts);
  // The module attends to the earlier positions: a different first one changes its output.
  std::vector<float> altered = hidden;
  for (size_t i = 0; i < width; ++i) altered[i] = -altered[i];
  MtpDrafter other(*model, 300, 16, 64, 4);
  other.absorb({{&tokens, tokens, 0, 39, altered.data()}});
  EXPECT_NE(greedy_proposal(other, tokens, 1).confidence,
            greedy_proposal(whole, tokens, 1).confidence);
  // A sequence whose last token the module has not absorbed gets none.
  std::vector<int32_t> longer = tokens;
  longer.push_back(7);
  MtpDrafter behind(*model, 300, 16, 64, 4);
  behind.absorb({{&longer, longer, 0, 39, hidden.data()}});
  EXPECT_TRUE(drafts_after(behind, longer).empty());
}

TEST(MtpDrafter, GreedyOutputIsTheSameAsWithoutIt) {
  TempDir dir;
  make_random_model(deepseek_with_mtp(), dir.path());
  auto ops = make_cpu_ops();
  auto model = load_model(dir.path(), LoadMode::kMmap, *ops);
  std::vector<GenerationRequest> requests;
  for (int r = 0; r < 4; ++r)
    requests.push_back(greedy_request("g" + std::to_string(r), prompt_of(20 + 9 * r, r), 16));
  EngineConfig config;
  config.block_size = 4;
  config.num_blocks = 256;
  config.max_batched_tokens = 16;
  Served plain = serve(*model, config, requests);
  EngineConfig mtp = config;
  mtp.speculative.method = "mtp";
  mtp.speculative.num_speculative_tokens = 3;
  mtp.speculative.verification = "always";
  mtp.speculative.confidence_threshold = 0.0;
  Served fast = serve(*model, mtp, requests);
  for (const auto& [id, result] : plain.results)
    EXPECT_EQ(fast.results.at(id).tokens, result.tokens) << id;
  EXPECT_GT(fast.stats.draft_tokens, 0);
  // A pool that holds little more than one request: sequences are preempted.
  mtp.num_blocks = 20;
  Served tight = serve(*model, mtp, requests);
  for (const auto& [id, result] : plain.results)
    EXPECT_EQ(tight.results.at(id).tokens, result.tokens) << id;
  // Async scheduling: the module absorbs a step's positions before drafting for the next.
  for (int64_t blocks : {256, 20}) {
    mtp.num_blocks = blocks;
    mtp.async_scheduling = true;
    Served async = serve(*model, mtp, requests);
    for (const auto& [id, result] : plain.results)
      EXPECT_EQ(async.results.at(id).tokens, result.tokens) << id;
    EXPECT_GT(async.stats.draft_tokens, 0);
  }
}

TEST(MtpDrafter, AModelWithoutTheModuleIsRefused) {
  auto ops = make_cpu_ops();
  auto model = load_model(testing::fixture_model("llama-gqa"), LoadMode::kMmap, *ops);
  EngineConfig config;
  config.num_blocks = 64;
  config.speculative.method = "mtp";
  try {
    Engine engine(*model, config);
    FAIL() << "a model without MTP modules was accepted";
  } catch (const Error& error) {
    EXPECT_NE(std::string(error.what()).find("no multi-token-prediction modules"),
              std::string::npos)
        << error.what();
  }
}

}  // namespace
}  // namespace deepinfer
