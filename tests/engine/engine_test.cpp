// Continuous batching: every request in a batch gets exactly the tokens it gets alone, with
// any prefill chunking, under preemption, with prefix caching, and with seeded sampling.
#include "engine/engine.h"

#include <gtest/gtest.h>

#include <map>

#include "core/error.h"
#include "engine/sequence_runner.h"
#include "kernels/ops.h"
#include "support/test_support.h"

namespace deepinfer {
namespace {

using testing::fixture_model;

// Eight requests of different lengths, sharing prefixes in pairs.
std::vector<GenerationRequest> workload(int32_t vocab, int max_tokens) {
  std::vector<GenerationRequest> requests;
  for (int r = 0; r < 8; ++r) {
    GenerationRequest request;
    request.id = "r" + std::to_string(r);
    for (int i = 0; i < 5 + 4 * r; ++i)
      request.prompt.push_back(((r / 2) * 131 + i * 17 + 3) % vocab);
    request.sampling.temperature = 0.0f;
    request.max_tokens = max_tokens;
    request.ignore_eos = true;
    requests.push_back(request);
  }
  return requests;
}

std::map<std::string, std::vector<int32_t>> run_engine(
    CausalLM& model, const EngineConfig& config, const std::vector<GenerationRequest>& requests,
    EngineStats* stats = nullptr) {
  Engine engine(model, config);
  for (const GenerationRequest& request : requests) engine.submit(request);
  std::map<std::string, std::vector<int32_t>> tokens;
  for (GenerationResult& result : engine.run_to_completion()) tokens[result.id] = result.tokens;
  if (stats) *stats = engine.stats();
  return tokens;
}

class EngineOnFixture : public ::testing::TestWithParam<std::string> {};

TEST_P(EngineOnFixture, BatchedGreedyEqualsAloneForEveryChunkSize) {
  auto ops = make_cpu_ops();
  auto model = load_model(fixture_model(GetParam()), LoadMode::kMmap, *ops);
  std::vector<GenerationRequest> requests = workload(model->config().vocab_size, 6);
  std::map<std::string, std::vector<int32_t>> alone;
  for (const GenerationRequest& request : requests) {
    GreedyOptions options;
    options.max_new_tokens = request.max_tokens;
    options.stop_at_eos = false;
    alone[request.id] = generate_greedy(*model, request.prompt, options);
  }
  for (int chunk : {1, 7, 4096}) {
    for (bool overlapped : {false, true}) {
      EngineConfig config;
      config.block_size = 4;
      config.num_blocks = 256;
      config.max_batched_tokens = chunk;
      config.async_scheduling = overlapped;
      EXPECT_EQ(run_engine(*model, config, requests), alone)
          << "chunk " << chunk << (overlapped ? " overlapped" : "");
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Fixtures, EngineOnFixture, ::testing::ValuesIn(testing::kFixtureModels),
                         testing::fixture_test_name);

TEST(Engine, PreemptionUnderATinyCacheStillCompletesEveryRequestIdentically) {
  auto ops = make_cpu_ops();
  auto model = load_model(fixture_model("llama-gqa"), LoadMode::kMmap, *ops);
  std::vector<GenerationRequest> requests = workload(model->config().vocab_size, 12);
  EngineConfig roomy;
  roomy.block_size = 4;
  roomy.num_blocks = 512;
  EngineConfig tiny = roomy;
  tiny.num_blocks = 16;  // the longest request alone needs 12 of the 15 usable blocks
  EngineStats stats;
  std::map<std::string, std::vector<int32_t>> expected = run_engine(*model, roomy, requests);
  EngineConfig tiny_overlapped = tiny;
  tiny_overlapped.async_scheduling = true;
  EngineStats overlapped_stats;
  EXPECT_EQ(run_engine(*model, tiny_overlapped, requests, &overlapped_stats), expected);
  EXPECT_GT(overlapped_stats.preemptions, 0);
  EXPECT_EQ(run_engine(*model, tiny, requests, &stats), expected);
  EXPECT_GT(stats.preemptions, 0);
  // Every request reports a first token, and every later token an inter-token gap.
  EXPECT_EQ(stats.time_to_first_token.count, 8);
  EXPECT_EQ(stats.inter_token_latency.count, 8 * 11);
  EXPECT_EQ(stats.time_to_first_token.cumulative.back(), 8);
  EXPECT_GT(stats.time_to_first_token.sum, 0.0);
  EXPECT_EQ(stats.generated_tokens, 8 * 12);
}

TEST(Engine, PrefixCacheHitsAndSaltsIsolate) {
  auto ops = make_cpu_ops();
  auto model = load_model(fixture_model("qwen3-qknorm"), LoadMode::kMmap, *ops);
  EngineConfig config;
  config.block_size = 4;
  config.num_blocks = 128;
  Engine engine(*model, config);
  GenerationRequest first;
  first.id = "first";
  for (int i = 0; i < 30; ++i) first.prompt.push_back((i * 7 + 1) % model->config().vocab_size);
  first.sampling.temperature = 0.0f;
  first.max_tokens = 3;
  engine.submit(first);
  engine.run_to_completion();
  GenerationRequest again = first;
  again.id = "again";
  GenerationRequest salted = first;
  salted.id = "salted";
  salted.cache_salt = 99;
  engine.submit(again);
  engine.submit(salted);
  std::map<std::string, GenerationResult> results;
  for (GenerationResult& result : engine.run_to_completion()) results[result.id] = result;
  EXPECT_EQ(results["again"].cached_prompt_tokens, 28);  // 7 whole blocks of the 30 tokens
  EXPECT_EQ(results["salted"].cached_prompt_tokens, 0);
  EXPECT_EQ(results["again"].tokens, results["salted"].tokens);
  EXPECT_GT(engine.stats().prefix_hits, 0);
}

TEST(Engine, SeededSamplingIsTheSameInAnyBatch) {
  auto ops = make_cpu_ops();
  auto model = load_model(fixture_model("llama-gqa"), LoadMode::kMmap, *ops);
  std::vector<GenerationRequest> requests = workload(model->config().vocab_size, 10);
  for (size_t i = 0; i < requests.size(); ++i) {
    requests[i].sampling.temperature = 1.0f;
    requests[i].sampling.top_p = 0.9f;
    requests[i].sampling.seed = 1000 + i;
  }
  EngineConfig config;
  config.block_size = 4;
  config.num_blocks = 256;
  auto together = run_engine(*model, config, requests);
  EngineConfig overlapped = config;
  overlapped.async_scheduling = true;
  EXPECT_EQ(run_engine(*model, overlapped, requests), together);
  config.max_batched_tokens = 5;
  for (const GenerationRequest& request : requests) {
    EXPECT_EQ(run_engine(*model, config, {request})[request.id], together[request.id])
        << request.id;
  }
}

// A 40-token prompt and 60 greedy tokens in blocks of 4, prefilled 16 tokens a step: the
// most KV blocks held at once, after checking the tokens equal a run alone.
int64_t peak_blocks_of_long_request(CausalLM& model) {
  GenerationRequest request;
  request.id = "long";
  for (int i = 0; i < 40; ++i) request.prompt.push_back((i * 13 + 5) % model.config().vocab_size);
  request.sampling.temperature = 0.0f;
  request.max_tokens = 60;
  request.ignore_eos = true;
  GreedyOptions options;
  options.max_new_tokens = 60;
  options.stop_at_eos = false;
  std::vector<int32_t> alone = generate_greedy(model, request.prompt, options);
  EngineConfig config;
  config.block_size = 4;
  config.num_blocks = 64;
  config.max_batched_tokens = 16;  // chunked prefill frees as it goes, too
  Engine engine(model, config);
  engine.submit(request);
  std::vector<GenerationResult> finished;
  int64_t most_used = 0;
  while (engine.step(finished)) most_used = std::max(most_used, engine.stats().kv_blocks_used);
  EXPECT_EQ(finished.size(), 1u);
  for (const GenerationResult& result : finished) EXPECT_EQ(result.tokens, alone);
  return most_used;
}

TEST(Engine, SlidingWindowLayersFreeBlocksThatLeftTheWindow) {
  auto ops = make_cpu_ops();
  auto model = load_model(fixture_model("mistral-swa"), LoadMode::kMmap, *ops);  // window 8
  ASSERT_EQ(model->config().layer_window.front(), 8);
  int64_t most_used = peak_blocks_of_long_request(*model);
  // The window (8 tokens) plus the chunk being computed (16) span at most 7 blocks of 4; the
  // 100 tokens would need 25 without freeing.
  EXPECT_LE(most_used, 7);
  EXPECT_GE(most_used, 3);
}

TEST(Engine, HybridModelsFreeSlidingBlocksAndKeepFullOnes) {
  auto ops = make_cpu_ops();
  auto model = load_model(fixture_model("qwen3-hybrid-swa"), LoadMode::kMmap, *ops);
  ASSERT_EQ(model->config().layer_window, (std::vector<int>{8, 0, 8, 0}));
  int64_t most_used = peak_blocks_of_long_request(*model);
  // The full group holds all 25 blocks of the 100 tokens, the sliding group at most 7; one
  // table for both would hold 25 pages of all four layers (50 of these half-size blocks).
  EXPECT_LE(most_used, 25 + 7);
  EXPECT_GE(most_used, 25);
}

TEST(Engine, AdmissionRejectsWhatCanNeverFit) {
  auto ops = make_cpu_ops();
  auto model = load_model(fixture_model("llama-gqa"), LoadMode::kMmap, *ops);
  EngineConfig config;
  config.block_size = 4;
  config.num_blocks = 8;
  Engine engine(*model, config);
  GenerationRequest request;
  request.id = "big";
  request.prompt = std::vector<int32_t>(20, 1);
  request.max_tokens = 20;
  try {
    engine.submit(request);
    FAIL() << "a request larger than the cache was admitted";
  } catch (const Error& error) {
    EXPECT_NE(std::string(error.what()).find("KV blocks but the cache has 7"), std::string::npos)
        << error.what();
  }
  request.prompt = {1, 999999};
  request.max_tokens = 1;
  EXPECT_THROW(engine.submit(request), Error);
  request.prompt = {1};
  request.max_tokens = model->config().max_position_embeddings;
  EXPECT_THROW(engine.submit(request), Error);
}

TEST(Engine, StopTokensAndMinTokens) {
  auto ops = make_cpu_ops();
  auto model = load_model(fixture_model("llama-gqa"), LoadMode::kMmap, *ops);
  GenerationRequest request = workload(model->config().vocab_size, 8)[0];
  EngineConfig config;
  config.block_size = 4;
  config.num_blocks = 64;
  std::vector<int32_t> free_run = run_engine(*model, config, {request})[request.id];
  request.stop_token_ids = {free_run[2]};
  Engine engine(*model, config);
  engine.submit(request);
  GenerationResult stopped = engine.run_to_completion()[0];
  EXPECT_EQ(stopped.finish_reason, FinishReason::kStop);
  EXPECT_EQ(stopped.tokens, std::vector<int32_t>(free_run.begin(), free_run.begin() + 3));
  request.min_tokens = 8;
  Engine patient(*model, config);
  patient.submit(request);
  GenerationResult full = patient.run_to_completion()[0];
  EXPECT_EQ(full.tokens, free_run);
  EXPECT_EQ(full.finish_reason, FinishReason::kLength);
}

}  // namespace
}  // namespace deepinfer
