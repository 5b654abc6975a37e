// Speculative decoding with n-gram drafts: greedy and seeded sampled requests produce exactly
// the tokens (and logprobs) they produce without it, alongside other requests, in chunked prefill,
// under preemption, and the prefix cache keeps serving the right blocks after rejected drafts.
#include <gtest/gtest.h>

#include <map>

#include "core/error.h"
#include "engine/engine.h"
#include "structured/structured.h"
#include "support/test_support.h"

namespace deepinfer {
namespace {

using testing::fixture_model;
using testing::greedy_request;
using testing::serve;
using testing::Served;

// A prompt that repeats a phrase of 40 tokens: n-gram lookup has something to propose, and a
// random model's outputs often recur in it.
std::vector<int32_t> repetitive_prompt(int length, int salt, int32_t vocab) {
  std::vector<int32_t> prompt;
  for (int i = 0; i < length; ++i)
    prompt.push_back(static_cast<int32_t>(((i % 40) * 37 + salt * 11 + 3) % vocab));
  return prompt;
}

// Every draft verified, so that every path runs whatever the machine's step costs are.
EngineConfig speculating(EngineConfig config, int tokens = 5) {
  config.speculative.method = "ngram";
  config.speculative.num_speculative_tokens = tokens;
  config.speculative.verification = "always";
  return config;
}

void expect_same(const Served& want, const Served& got) {
  ASSERT_EQ(want.results.size(), got.results.size());
  for (const auto& [id, result] : want.results) {
    const GenerationResult& other = got.results.at(id);
    EXPECT_EQ(other.tokens, result.tokens) << id;
    EXPECT_EQ(other.finish_reason, result.finish_reason) << id;
    ASSERT_EQ(other.logprobs.size(), result.logprobs.size()) << id;
    for (size_t i = 0; i < result.logprobs.size(); ++i)
      EXPECT_NEAR(other.logprobs[i].logprob, result.logprobs[i].logprob, 1e-4) << id << " " << i;
  }
}

class Speculative : public ::testing::TestWithParam<std::string> {};

TEST_P(Speculative, OutputIsTheSameAsWithoutIt) {
  auto ops = make_cpu_ops();
  auto model = load_model(fixture_model(GetParam()), LoadMode::kMmap, *ops);
  const int32_t vocab = model->config().vocab_size;
  std::vector<GenerationRequest> requests;
  for (int r = 0; r < 3; ++r)
    requests.push_back(
        greedy_request("g" + std::to_string(r), repetitive_prompt(30 + 9 * r, r, vocab), 24));
  requests[1].sampling.logprobs = true;
  requests[1].sampling.top_logprobs = 2;
  requests[2].sampling.repetition_penalty = 1.3f;
  GenerationRequest sampled = greedy_request("sampled", repetitive_prompt(25, 4, vocab), 12);
  sampled.sampling.temperature = 0.8f;
  sampled.sampling.seed = 7;
  requests.push_back(sampled);
  for (int seed = 0; seed < 8; ++seed) {
    GenerationRequest more =
        greedy_request("seeded" + std::to_string(seed), repetitive_prompt(20 + seed, 5, vocab), 10);
    more.sampling.temperature = 1.0f;
    more.sampling.top_p = 0.9f;
    more.sampling.presence_penalty = 0.5f * static_cast<float>(seed % 2);
    more.sampling.seed = static_cast<uint64_t>(seed);
    requests.push_back(more);
  }

  EngineConfig config;
  config.block_size = 4;
  config.num_blocks = 512;
  config.max_batched_tokens = 16;  // prompts arrive in chunks beside speculating decodes
  Served plain = serve(*model, config, requests);
  Served fast = serve(*model, speculating(config), requests);
  expect_same(plain, fast);
  EXPECT_GT(fast.stats.draft_tokens, 0);
  EXPECT_LE(fast.stats.accepted_draft_tokens, fast.stats.draft_tokens);
  EXPECT_EQ(fast.stats.generated_tokens, plain.stats.generated_tokens);
  // Async scheduling plans each step before the one in flight is verified, as if all its
  // drafts were accepted, and chooses its drafts when that step's tokens arrive.
  EngineConfig overlapped = speculating(config);
  overlapped.async_scheduling = true;
  Served async = serve(*model, overlapped, requests);
  expect_same(plain, async);
  EXPECT_GT(async.stats.draft_tokens, 0);

  // A pool that holds the longest request and little more: sequences are preempted.
  for (config.num_blocks = 4;; config.num_blocks += 2) {
    try {
      Engine probe(*model, config);
      probe.submit(requests[2]);
      break;
    } catch (const Error&) {
    }
  }
  config.num_blocks += 2;
  Served tight = serve(*model, speculating(config, 3), requests);
  expect_same(plain, tight);
  EngineConfig plain_async = config;  // a sliding window's blocks go back before the commit
  plain_async.async_scheduling = true;
  expect_same(plain, serve(*model, plain_async, requests));
  EngineConfig tight_async = speculating(config, 3);
  tight_async.async_scheduling = true;
  Served tight_overlapped = serve(*model, tight_async, requests);
  expect_same(plain, tight_overlapped);
  EngineConfig adaptive = speculating(config);
  adaptive.speculative.verification = "adaptive";
  expect_same(plain, serve(*model, adaptive, requests));
  if (model->kv_shape(4).block_size == 4) {
    EXPECT_GT(tight.stats.preemptions, 0);
    EXPECT_GT(tight_overlapped.stats.preemptions, 0);
  }
}

INSTANTIATE_TEST_SUITE_P(Fixtures, Speculative,
                         ::testing::Values("llama-gqa", "qwen3-hybrid-swa", "mistral-swa",
                                           "deepseek-v3-mla-moe", "deepseek-v4-flash-style",
                                           "demo-code-target"),
                         testing::fixture_test_name);

// A trained code model repeats itself: most drafts are accepted and one request takes far
// fewer steps for the same tokens.
TEST(SpeculativeEngine, ATrainedModelAcceptsDraftsAndTakesFewerSteps) {
  auto ops = make_cpu_ops();
  auto model = load_model(fixture_model("demo-code-target"), LoadMode::kMmap, *ops);
  GenerationRequest request =
      greedy_request("code", repetitive_prompt(40, 1, model->config().vocab_size), 48);
  EngineConfig config;
  Served plain = serve(*model, config, {request});
  Served fast = serve(*model, speculating(config), {request});
  expect_same(plain, fast);
  EXPECT_GT(fast.stats.accepted_draft_tokens, fast.stats.draft_tokens / 2);
  EXPECT_LT(2 * fast.stats.steps, plain.stats.steps);
  config.async_scheduling = true;
  Served async = serve(*model, speculating(config), {request});
  expect_same(plain, async);
  EXPECT_GT(async.stats.accepted_draft_tokens, async.stats.draft_tokens / 2);
  EXPECT_LT(2 * async.stats.steps, plain.stats.steps);
}

// JSON-constrained requests speculate too: a draft the grammar forbids is never drawn, and the
// output is the plain run's, greedy or seeded.
TEST(SpeculativeEngine, ConstrainedOutputIsTheSameAsWithoutIt) {
  auto ops = make_cpu_ops();
  auto model = load_model(fixture_model("llama-gqa"), LoadMode::kMmap, *ops);
  const int32_t vocab = model->config().vocab_size;
  auto table = testing::json_piece_table(vocab);
  std::vector<GenerationRequest> requests;
  for (int r = 0; r < 3; ++r) {
    GenerationRequest request =
        greedy_request("json" + std::to_string(r), repetitive_prompt(24 + 5 * r, r, vocab), 40);
    request.constraint = structured::json_object_constraint(table);
    request.sampling.temperature = r == 0 ? 0.0f : 0.9f;
    request.sampling.seed = static_cast<uint64_t>(r);
    requests.push_back(request);
  }
  EngineConfig config;
  config.block_size = 4;
  config.num_blocks = 512;
  Served plain = serve(*model, config, requests);
  Served fast = serve(*model, speculating(config), requests);
  expect_same(plain, fast);
  // After the object only the end token may follow: those drafts are all accepted.
  EXPECT_GT(fast.stats.accepted_draft_tokens, 0);
}

// Rejected drafts' KV never reaches the prefix cache: a request continuing a speculated
// conversation hits the cache and gets the cold run's tokens; stop tokens inside an accepted
// run of drafts end the completion there.
TEST(SpeculativeEngine, RollbackKeepsThePrefixCacheRightAndStopsWhereAPlainRunStops) {
  auto ops = make_cpu_ops();
  auto model = load_model(fixture_model("llama-gqa"), LoadMode::kMmap, *ops);
  const int32_t vocab = model->config().vocab_size;
  EngineConfig config;
  config.block_size = 4;
  config.num_blocks = 512;
  GenerationRequest first = greedy_request("first", repetitive_prompt(33, 5, vocab), 20);
  Engine engine(*model, speculating(config));
  engine.submit(first);
  GenerationResult spoken = engine.run_to_completion().at(0);
  GenerationRequest next = first;
  next.id = "next";
  next.prompt.insert(next.prompt.end(), spoken.tokens.begin(), spoken.tokens.end());
  next.prompt.push_back(3);
  engine.submit(next);
  GenerationResult continued = engine.run_to_completion().at(0);
  EXPECT_GE(continued.cached_prompt_tokens, 48);
  EXPECT_EQ(continued.tokens, serve(*model, config, {next}).results.at("next").tokens);

  // Stop at a token the plain run produces in the middle of its output.
  GenerationRequest stopping = first;
  stopping.id = "stopping";
  stopping.stop_token_ids = {spoken.tokens[10]};
  stopping.min_tokens = 4;
  Served plain = serve(*model, config, {stopping});
  Served fast = serve(*model, speculating(config), {stopping});
  expect_same(plain, fast);
  EXPECT_EQ(fast.results.at("stopping").finish_reason, FinishReason::kStop);
}

}  // namespace
}  // namespace deepinfer
