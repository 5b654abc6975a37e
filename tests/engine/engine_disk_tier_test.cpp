// The prefix cache's disk tier seen through the engine: an agent's growing context written by
// one engine is served to another that shares the directory, with the cold run's tokens; bad,
// foreign and other tenants' files are never served.
#include <gtest/gtest.h>

#include <fstream>
#include <map>

#include "engine/engine.h"
#include "kv/block_file.h"
#include "support/test_support.h"

namespace deepinfer {
namespace {

using testing::fixture_model;
using testing::greedy_request;
using testing::serve;
using testing::Served;
using testing::TempDir;

constexpr uint64_t kFingerprint = 0x5eed;

std::vector<int32_t> prompt_of(int64_t length, int salt, int32_t vocab) {
  std::vector<int32_t> ids;
  for (int64_t i = 0; i < length; ++i)
    ids.push_back(static_cast<int32_t>((i * 29 + salt * 71 + 2) % vocab));
  return ids;
}

EngineConfig config_with(const std::filesystem::path& dir) {
  EngineConfig config;
  config.block_size = 4;
  config.num_blocks = 512;
  config.max_batched_tokens = 64;
  config.kv_cache_dir = dir.string();
  config.kv_fingerprint = kFingerprint;
  config.swa_replay_tokens = 0;  // windows are stored: every restore is exact
  return config;
}

class DiskTierOnFixture : public ::testing::TestWithParam<std::string> {};

TEST_P(DiskTierOnFixture, AnotherEngineContinuesTheConversationFromDisk) {
  auto ops = make_cpu_ops();
  auto model = load_model(fixture_model(GetParam()), LoadMode::kMmap, *ops);
  const int block_size = model->kv_shape(4).block_size;  // a model may round it up
  const int32_t vocab = model->config().vocab_size;
  GenerationRequest first = greedy_request("first", prompt_of(3 * block_size + 5, 1, vocab), 8);
  EngineConfig cold = config_with({});
  std::vector<int32_t> answer = serve(*model, cold, {first}).results.at("first").tokens;
  std::vector<int32_t> next = first.prompt;
  next.insert(next.end(), answer.begin(), answer.end());
  for (int32_t token : prompt_of(5, 2, vocab)) next.push_back(token);
  GenerationRequest second = greedy_request("second", next, 6);
  GenerationRequest other = greedy_request("other", prompt_of(2 * block_size + 3, 3, vocab), 6);
  Served cold_second = serve(*model, cold, {second, other});

  TempDir dir;
  Served writer = serve(*model, config_with(dir.path()), {first});
  EXPECT_EQ(writer.results.at("first").tokens, answer);
  EXPECT_GT(writer.stats.tiers.offered_blocks, 0);
  // A fresh engine (nothing in memory) on the same directory, beside an unrelated request.
  Served reader = serve(*model, config_with(dir.path()), {second, other});
  EXPECT_EQ(reader.results.at("second").tokens, cold_second.results.at("second").tokens);
  EXPECT_EQ(reader.results.at("other").tokens, cold_second.results.at("other").tokens);
  // Every block the first turn computed in full: its prompt and all but its last token.
  const int64_t computed = static_cast<int64_t>(first.prompt.size() + answer.size()) - 1;
  EXPECT_EQ(reader.results.at("second").cached_prompt_tokens, computed / block_size * block_size);
  EXPECT_EQ(reader.results.at("other").cached_prompt_tokens, 0);
  EXPECT_GT(reader.stats.tiers.found_blocks, 0);
  EXPECT_EQ(reader.stats.tiers.installed_blocks, reader.stats.tiers.found_blocks);
  EXPECT_EQ(reader.stats.tiers.load_seconds.count, 1);
}

INSTANTIATE_TEST_SUITE_P(Fixtures, DiskTierOnFixture,
                         ::testing::Values("llama-gqa", "qwen3-hybrid-swa", "mistral-swa",
                                           "deepseek-v3-mla-moe", "deepseek-v4-flash-style"),
                         testing::fixture_test_name);

// A disk that cannot keep up: the queue is full (here it holds nothing), so every block is
// dropped and counted, and the engine's results are those of a run without a disk tier.
TEST(DiskTierQueue, AFullQueueDropsWritesAndTheEngineGoesOn) {
  auto ops = make_cpu_ops();
  auto model = load_model(fixture_model("llama-gqa"), LoadMode::kMmap, *ops);
  std::vector<GenerationRequest> requests;
  for (int r = 0; r < 6; ++r)
    requests.push_back(
        greedy_request(std::to_string(r), prompt_of(21 + r, r, model->config().vocab_size), 5));
  Served cold = serve(*model, config_with({}), requests);
  TempDir dir;
  EngineConfig config = config_with(dir.path());
  config.kv_disk_queue_blocks = 0;
  Served full = serve(*model, config, requests);
  for (const auto& [id, result] : cold.results)
    EXPECT_EQ(full.results.at(id).tokens, result.tokens) << id;
  EXPECT_EQ(full.stats.tiers.offered_blocks, 0);
  EXPECT_GE(full.stats.tiers.disk.dropped_writes, static_cast<int64_t>(requests.size()));
  EXPECT_EQ(full.stats.tiers.disk.written, 0);
}

// A pool too small for two prompts: the first one's blocks leave it for the host-memory
// tier and come back from there when the conversation continues.
// Blocks written for a short-lived class and then used by a request of a longer one are kept
// for the longer: the reader's engine rewrites their files' retention.
TEST(DiskTierRetention, ALongerClassExtendsBlocksAnotherRequestWrote) {
  auto ops = make_cpu_ops();
  auto model = load_model(fixture_model("llama-gqa"), LoadMode::kMmap, *ops);
  const int32_t vocab = model->config().vocab_size;
  TempDir dir;
  EngineConfig config = config_with(dir.path());
  config.kv_retention_classes = {{"agent", 72 * 3600}, {"chat", 168 * 3600}};
  config.kv_retention_default = "agent";
  GenerationRequest first = greedy_request("first", prompt_of(21, 4, vocab), 2);
  serve(*model, config, {first});
  auto retentions = [&] {
    std::map<uint32_t, int> count;
    for (const auto& entry : std::filesystem::recursive_directory_iterator(dir.path()))
      if (entry.path().extension() == ".kvb") ++count[block_file_retention(entry.path()).value()];
    return count;
  };
  EXPECT_EQ(retentions(), (std::map<uint32_t, int>{{72 * 3600, 5}}));

  GenerationRequest second = first;
  second.id = "second";
  second.cache_retention = "chat";
  Served reader = serve(*model, config, {second});
  EXPECT_EQ(reader.results.at("second").cached_prompt_tokens, 20);
  EXPECT_EQ(retentions(), (std::map<uint32_t, int>{{168 * 3600, 5}}));
  // A shorter class afterwards leaves them as they are.
  GenerationRequest third = first;
  third.id = "third";
  serve(*model, config, {third});
  EXPECT_EQ(retentions(), (std::map<uint32_t, int>{{168 * 3600, 5}}));
}

TEST(HostTier, APromptLeftThePoolAndComesBackFromHostMemory) {
  auto ops = make_cpu_ops();
  auto model = load_model(fixture_model("qwen3-hybrid-swa"), LoadMode::kMmap, *ops);
  const int32_t vocab = model->config().vocab_size;
  GenerationRequest first = greedy_request("first", prompt_of(40, 1, vocab), 4);
  GenerationRequest other = greedy_request("other", prompt_of(60, 2, vocab), 4);
  GenerationRequest again = first;
  again.id = "again";
  for (int32_t token : prompt_of(5, 3, vocab)) again.prompt.push_back(token);
  EngineConfig config = config_with({});
  config.num_blocks = 36;  // the other prompt's blocks take the first one's place
  config.kv_host_bytes = size_t{64} << 20;
  config.swa_replay_tokens = EngineConfig::kReplayExact;
  Engine engine(*model, config);
  std::map<std::string, GenerationResult> results;
  for (const GenerationRequest& request : {first, other, again}) {
    engine.submit(request);
    for (GenerationResult& result : engine.run_to_completion())
      results[result.id] = std::move(result);
  }
  EngineStats stats = engine.stats();
  EXPECT_GT(stats.tiers.host_found_blocks, 0);
  EXPECT_EQ(stats.tiers.found_blocks, stats.tiers.host_found_blocks);
  EXPECT_FALSE(stats.tiers.has_disk);
  EXPECT_GT(results.at("again").cached_prompt_tokens, 0);
  Served cold = serve(*model, config_with({}), {again});
  EXPECT_EQ(results.at("again").tokens, cold.results.at("again").tokens);
}

// Resetting the prefix cache empties memory only: the next request's prefix comes back from
// the host-memory tier, with the cold run's tokens.
TEST(HostTier, AResetPrefixCacheIsRefilledFromHostMemory) {
  auto ops = make_cpu_ops();
  auto model = load_model(fixture_model("llama-gqa"), LoadMode::kMmap, *ops);
  GenerationRequest first =
      greedy_request("first", prompt_of(30, 5, model->config().vocab_size), 3);
  GenerationRequest again = first;
  again.id = "again";
  EngineConfig config = config_with({});
  config.kv_host_bytes = size_t{64} << 20;
  Engine engine(*model, config);
  engine.submit(first);
  engine.run_to_completion();
  EXPECT_GT(engine.reset_prefix_cache(), 0);
  EXPECT_EQ(engine.reset_prefix_cache(), 0);
  engine.submit(again);
  GenerationResult result = engine.run_to_completion().at(0);
  EXPECT_EQ(result.cached_prompt_tokens, 28);
  EXPECT_EQ(engine.stats().tiers.host_found_blocks, 7);
  EXPECT_EQ(result.tokens, serve(*model, config_with({}), {again}).results.at("again").tokens);
}

class DiskTierFiles : public ::testing::Test {
 protected:
  void SetUp() override {
    ops_ = make_cpu_ops();
    model_ = load_model(fixture_model("llama-gqa"), LoadMode::kMmap, *ops_);
    prompt_ = prompt_of(30, 4, model_->config().vocab_size);
    cold_ =
        serve(*model_, config_with({}), {greedy_request("a", prompt_, 6)}).results.at("a").tokens;
    Served writer = serve(*model_, config_with(dir_.path()), {greedy_request("a", prompt_, 6)});
    ASSERT_EQ(writer.results.at("a").tokens, cold_);
  }

  // The file of the prompt's `block`-th block (cache group 0, salt 0).
  std::filesystem::path file_of(int64_t block) const {
    PrefixKeys keys =
        prefix_keys(KvGroupLayout::of({}, model_->config().num_layers), 4, prompt_, 0);
    return block_file_path(dir_.path(), kFingerprint, keys.keys[0][static_cast<size_t>(block)]);
  }

  std::unique_ptr<Ops> ops_;
  std::unique_ptr<CausalLM> model_;
  TempDir dir_;
  std::vector<int32_t> prompt_;
  std::vector<int32_t> cold_;
};

TEST_F(DiskTierFiles, AFlippedByteEndsThePrefixThere) {
  ASSERT_TRUE(std::filesystem::exists(file_of(3)));
  std::fstream(file_of(3), std::ios::in | std::ios::out | std::ios::binary)
      .seekp(-1, std::ios::end)
      .put('\x7f');
  Served reader = serve(*model_, config_with(dir_.path()), {greedy_request("a", prompt_, 6)});
  EXPECT_EQ(reader.results.at("a").tokens, cold_);
  EXPECT_EQ(reader.results.at("a").cached_prompt_tokens, 3 * 4);
  EXPECT_EQ(reader.stats.tiers.disk.rejected[static_cast<int>(BlockFileStatus::kCorrupt)], 1);
  // Removed, and rewritten by the run that recomputed it.
  Served again = serve(*model_, config_with(dir_.path()), {greedy_request("a", prompt_, 6)});
  EXPECT_EQ(again.results.at("a").cached_prompt_tokens, 28);
  EXPECT_EQ(again.results.at("a").tokens, cold_);
}

TEST_F(DiskTierFiles, ATruncatedFileIsNeverServed) {
  std::filesystem::resize_file(file_of(0), std::filesystem::file_size(file_of(0)) / 2);
  Served reader = serve(*model_, config_with(dir_.path()), {greedy_request("a", prompt_, 6)});
  EXPECT_EQ(reader.results.at("a").tokens, cold_);
  EXPECT_EQ(reader.results.at("a").cached_prompt_tokens, 0);
  EXPECT_EQ(reader.stats.tiers.disk.rejected[static_cast<int>(BlockFileStatus::kTruncated)], 1);
}

TEST_F(DiskTierFiles, AnotherModelOrSaltFindsNothing) {
  EngineConfig foreign = config_with(dir_.path());
  foreign.kv_fingerprint = kFingerprint + 1;
  Served other_model = serve(*model_, foreign, {greedy_request("a", prompt_, 6)});
  EXPECT_EQ(other_model.results.at("a").cached_prompt_tokens, 0);
  EXPECT_EQ(other_model.stats.tiers.found_blocks, 0);
  Served other_tenant =
      serve(*model_, config_with(dir_.path()), {greedy_request("a", prompt_, 6, 99)});
  EXPECT_EQ(other_tenant.results.at("a").cached_prompt_tokens, 0);
  EXPECT_EQ(other_tenant.results.at("a").tokens, cold_);
  Served same = serve(*model_, config_with(dir_.path()), {greedy_request("a", prompt_, 6)});
  EXPECT_EQ(same.results.at("a").cached_prompt_tokens, 28);
}

}  // namespace
}  // namespace deepinfer
