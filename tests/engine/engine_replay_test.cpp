// Bounded replay of sliding-window layers: a prefix restored from the full-attention layers'
// cache alone, its last tokens recomputed through every layer. Exact replay is the cold
// prefill, bit for bit with the batch-invariant backend; shorter ones are approximations the
// engine takes only when asked; lower tiers then keep no window KV.
#include <gtest/gtest.h>

#include <map>

#include "engine/engine.h"
#include "engine/replay_error.h"
#include "support/test_support.h"

namespace deepinfer {
namespace {

using testing::fixture_model;
using testing::greedy_request;
using testing::TempDir;

std::vector<int32_t> prompt_of(int64_t length, int salt, int32_t vocab) {
  std::vector<int32_t> ids;
  for (int64_t i = 0; i < length; ++i)
    ids.push_back(static_cast<int32_t>((i * 37 + salt * 53 + 5) % vocab));
  return ids;
}

class ReplayOnFixture : public ::testing::TestWithParam<std::string> {
 protected:
  void SetUp() override {
    ops_ = make_cpu_ops(MatmulPrecision::kF32, /*batch_invariant=*/true);
    model_ = load_model(fixture_model(GetParam()), LoadMode::kMmap, *ops_);
    block_size_ = model_->kv_shape(4).block_size;
    // A prefix longer than an exact replay by two windows, in whole blocks.
    const CausalLM::ReplayBounds bounds = model_->replay_bounds();
    prefix_ = (bounds.exact + 2 * bounds.window + block_size_ - 1) / block_size_ * block_size_;
    prompt_ = prompt_of(prefix_ + block_size_ + 3, 1, model_->config().vocab_size);
  }
  std::unique_ptr<Ops> ops_;
  std::unique_ptr<CausalLM> model_;
  int block_size_ = 0;
  int64_t prefix_ = 0;
  std::vector<int32_t> prompt_;
};

TEST_P(ReplayOnFixture, ExactReplayIsTheColdPrefillBitForBit) {
  const CausalLM::ReplayBounds bounds = model_->replay_bounds();
  ASSERT_GT(bounds.exact, 0);
  const int64_t prefix = prefix_;
  ReplayError error = measure_replay(*model_, prompt_, prefix, bounds.exact, block_size_);
  EXPECT_EQ(error.restored_end, prefix);
  EXPECT_EQ(error.replay_start, std::max<int64_t>(0, prefix - bounds.exact));
  EXPECT_TRUE(error.bitwise_equal) << "max |diff| " << error.max_abs_diff;
  EXPECT_LT(error.stored_bytes_per_token_without_windows, error.stored_bytes_per_token);
}

TEST_P(ReplayOnFixture, AReplayOfOneWindowIsAnApproximation) {
  const CausalLM::ReplayBounds bounds = model_->replay_bounds();
  const int64_t prefix = prefix_;
  ReplayError error =
      measure_replay(*model_, prompt_, prefix, std::max(bounds.window, bounds.least), block_size_);
  EXPECT_EQ(error.restored_end, prefix);
  EXPECT_GT(error.replay_start, 0);
  // Each stacked window reaches one window further back: one window is not enough.
  EXPECT_FALSE(error.bitwise_equal);
  EXPECT_GT(error.max_abs_diff, 0.0);
  EXPECT_LT(error.max_abs_diff, 100.0);
}

INSTANTIATE_TEST_SUITE_P(Fixtures, ReplayOnFixture,
                         ::testing::Values("qwen3-hybrid-swa", "deepseek-v4-flash-style"),
                         testing::fixture_test_name);

TEST(Replay, LayersThatAllSlideReplayFromScratch) {
  auto ops = make_cpu_ops(MatmulPrecision::kF32, true);
  auto model = load_model(fixture_model("mistral-swa"), LoadMode::kMmap, *ops);
  std::vector<int32_t> prompt = prompt_of(40, 2, model->config().vocab_size);
  const CausalLM::ReplayBounds bounds = model->replay_bounds();
  EXPECT_EQ(bounds.exact, int64_t{model->config().num_layers} * bounds.window);
  ReplayError exact = measure_replay(*model, prompt, 32, bounds.exact, 4);
  EXPECT_EQ(exact.replay_start, 32 - bounds.exact);
  EXPECT_TRUE(exact.bitwise_equal) << exact.max_abs_diff;
  EXPECT_EQ(exact.stored_bytes_per_token_without_windows, 0.0);
}

// Through the engine: one engine writes a conversation's blocks, another continues it from the
// directory alone. The second restores only the full-attention layers and replays.
struct Served {
  GenerationResult result;
  EngineStats stats;
};

Served run(CausalLM& model, const EngineConfig& config, const GenerationRequest& request) {
  Engine engine(model, config);
  engine.submit(request);
  Served outcome{engine.run_to_completion().at(0), {}};
  outcome.stats = engine.stats();
  return outcome;
}

EngineConfig replaying(const std::filesystem::path& dir, int64_t replay_tokens) {
  EngineConfig config;
  config.block_size = 4;
  config.num_blocks = 512;
  config.max_batched_tokens = 24;  // the replay itself is chunked
  config.kv_cache_dir = dir.string();
  config.kv_fingerprint = 0x5eed;
  config.swa_replay_tokens = replay_tokens;
  return config;
}

class EngineReplay : public ::testing::TestWithParam<std::string> {};

TEST_P(EngineReplay, AnotherEngineReplaysFromTheFullAttentionBlocksOnDisk) {
  auto ops = make_cpu_ops(MatmulPrecision::kF32, true);
  auto model = load_model(fixture_model(GetParam()), LoadMode::kMmap, *ops);
  const int block_size = model->kv_shape(4).block_size;
  const int64_t exact = model->replay_bounds().exact;
  GenerationRequest first =
      greedy_request("first", prompt_of(exact + block_size + 3, 3, model->config().vocab_size), 4);
  GenerationRequest second = first;
  second.id = "second";
  for (int32_t token : prompt_of(7, 4, model->config().vocab_size)) second.prompt.push_back(token);
  const std::vector<int32_t> cold = run(*model, replaying({}, 0), second).result.tokens;

  TempDir windows, replayed;
  Served kept = run(*model, replaying(windows.path(), 0), first);
  Served written = run(*model, replaying(replayed.path(), EngineConfig::kReplayExact), first);
  // Only the full-attention groups went to disk.
  EXPECT_GT(written.stats.tiers.offered_blocks, 0);
  EXPECT_LT(written.stats.tiers.offered_blocks, kept.stats.tiers.offered_blocks);

  Served reader = run(*model, replaying(replayed.path(), EngineConfig::kReplayExact), second);
  EXPECT_EQ(reader.result.tokens, cold);
  EXPECT_EQ(reader.stats.replays, 1);
  const int64_t restored = static_cast<int64_t>(first.prompt.size()) / block_size * block_size;
  EXPECT_EQ(reader.stats.replayed_tokens, exact);
  EXPECT_EQ(reader.result.cached_prompt_tokens, restored - exact);

  // Without replay the same directory serves nothing: the windows were never stored.
  Served without = run(*model, replaying(replayed.path(), 0), second);
  EXPECT_EQ(without.result.tokens, cold);
  EXPECT_EQ(without.result.cached_prompt_tokens, 0);
}

// A replayed prompt publishes the sliding groups' blocks it rebuilt: the conversation's next
// turn finds every group in memory and computes only its new tokens, with no second replay.
TEST_P(EngineReplay, TheNextTurnAfterAReplayIsAMemoryHit) {
  auto ops = make_cpu_ops(MatmulPrecision::kF32, true);
  auto model = load_model(fixture_model(GetParam()), LoadMode::kMmap, *ops);
  const int block_size = model->kv_shape(4).block_size;
  const int64_t exact = model->replay_bounds().exact;
  const int32_t vocab = model->config().vocab_size;
  GenerationRequest first =
      greedy_request("first", prompt_of(exact + 2 * block_size + 1, 3, vocab), 2);
  TempDir dir;
  run(*model, replaying(dir.path(), EngineConfig::kReplayExact), first);

  GenerationRequest second = first;
  second.id = "second";
  for (int32_t token : prompt_of(block_size + 3, 4, vocab)) second.prompt.push_back(token);
  GenerationRequest third = second;
  third.id = "third";
  for (int32_t token : prompt_of(5, 6, vocab)) third.prompt.push_back(token);
  const std::vector<int32_t> cold = run(*model, replaying({}, 0), third).result.tokens;

  Engine engine(*model, replaying(dir.path(), EngineConfig::kReplayExact));
  engine.submit(second);
  engine.run_to_completion();
  ASSERT_EQ(engine.stats().replays, 1);
  engine.submit(third);
  GenerationResult next = engine.run_to_completion().at(0);
  EXPECT_EQ(next.tokens, cold);
  EXPECT_EQ(engine.stats().replays, 1);
  const auto whole = static_cast<int64_t>(second.prompt.size()) / block_size * block_size;
  EXPECT_GE(next.cached_prompt_tokens, whole);
}

INSTANTIATE_TEST_SUITE_P(Fixtures, EngineReplay,
                         ::testing::Values("qwen3-hybrid-swa", "deepseek-v4-flash-style"),
                         testing::fixture_test_name);

TEST(EngineReplayDefault, IsTheWindowPlusTwelveWithADiskTier) {
  auto ops = make_cpu_ops();
  auto model = load_model(fixture_model("qwen3-hybrid-swa"), LoadMode::kMmap, *ops);
  TempDir dir;
  GenerationRequest request = greedy_request("a", prompt_of(60, 5, model->config().vocab_size), 2);
  run(*model, replaying(dir.path(), EngineConfig::kReplayDefault), request);
  request.prompt.push_back(7);
  Served reader = run(*model, replaying(dir.path(), EngineConfig::kReplayDefault), request);
  EXPECT_EQ(reader.stats.replays, 1);
  EXPECT_EQ(reader.stats.replayed_tokens, model->replay_bounds().window + 12);
  EXPECT_EQ(reader.result.cached_prompt_tokens, 60 - model->replay_bounds().window - 12);
}

}  // namespace
}  // namespace deepinfer
