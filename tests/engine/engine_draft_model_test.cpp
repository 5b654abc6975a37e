// Speculative decoding with a draft model: greedy requests produce exactly the tokens they
// produce without it (in chunked prefill, under preemption, beside other requests); sampled
// requests follow the target's distribution (a chi-square test against the exact
// distribution, which rejects the draft's); a seed reproduces a completion; a draft that lacks
// the target's vocabulary is refused.
#include <gtest/gtest.h>

#include <cmath>
#include <map>

#include "core/error.h"
#include "engine/engine.h"
#include "support/test_support.h"

namespace deepinfer {
namespace {

using testing::fixture_model;
using testing::greedy_request;
using testing::serve;
using testing::Served;
using testing::TempDir;

EngineConfig drafting(EngineConfig config, const std::filesystem::path& draft, int tokens = 4) {
  config.speculative.method = "draft_model";
  config.speculative.model = draft.string();
  config.speculative.num_speculative_tokens = tokens;
  config.speculative.verification = "always";
  config.speculative.confidence_threshold = 0.0;
  return config;
}

std::vector<int32_t> prompt_of(int length, int salt, int32_t vocab) {
  std::vector<int32_t> prompt;
  for (int i = 0; i < length; ++i)
    prompt.push_back(static_cast<int32_t>((i * 131 + salt * 17 + 5) % vocab));
  return prompt;
}

std::vector<GenerationRequest> greedy_requests(int32_t vocab) {
  std::vector<GenerationRequest> requests;
  for (int r = 0; r < 4; ++r)
    requests.push_back(
        greedy_request("g" + std::to_string(r), prompt_of(20 + 7 * r, r, vocab), 20));
  requests[1].sampling.logprobs = true;
  requests[2].sampling.repetition_penalty = 1.2f;
  return requests;
}

void expect_same_tokens(const Served& want, const Served& got) {
  ASSERT_EQ(want.results.size(), got.results.size());
  for (const auto& [id, result] : want.results) {
    EXPECT_EQ(got.results.at(id).tokens, result.tokens) << id;
    EXPECT_EQ(got.results.at(id).finish_reason, result.finish_reason) << id;
  }
}

// (target, draft): the trained code pair, and fixtures drafting for themselves (every family's
// cache layout on the draft's side too).
class DraftModelGreedy : public ::testing::TestWithParam<std::pair<std::string, std::string>> {};

TEST_P(DraftModelGreedy, OutputIsTheSameAsWithoutIt) {
  const auto& [target_name, draft_name] = GetParam();
  auto ops = make_cpu_ops();
  auto model = load_model(fixture_model(target_name), LoadMode::kMmap, *ops);
  const std::vector<GenerationRequest> requests = greedy_requests(model->config().vocab_size);
  EngineConfig config;
  config.block_size = 4;
  config.num_blocks = 512;
  config.max_batched_tokens = 16;  // prompts arrive in chunks beside speculating decodes
  Served plain = serve(*model, config, requests);
  Served fast = serve(*model, drafting(config, fixture_model(draft_name)), requests);
  expect_same_tokens(plain, fast);
  EXPECT_GT(fast.stats.draft_tokens, 0);
  EXPECT_GT(fast.stats.accepted_draft_tokens, 0);
  if (target_name == draft_name) {  // a model agrees with itself
    EXPECT_GT(fast.stats.accepted_draft_tokens, fast.stats.draft_tokens * 9 / 10);
  }
  // A pool that holds little more than one request: sequences are preempted and the draft's
  // cache runs short too.
  config.num_blocks = 24;
  Served tight = serve(*model, drafting(config, fixture_model(draft_name), 3), requests);
  expect_same_tokens(plain, tight);
  // Async scheduling: each step keeps rows for its drafts, made once the step before ends.
  EngineConfig tight_async = drafting(config, fixture_model(draft_name), 3);
  tight_async.async_scheduling = true;
  Served overlapped = serve(*model, tight_async, requests);
  expect_same_tokens(plain, overlapped);
  EXPECT_GT(overlapped.stats.accepted_draft_tokens, 0);
  EngineConfig adaptive = drafting(config, fixture_model(draft_name));
  adaptive.speculative.verification = "adaptive";
  adaptive.speculative.confidence_threshold = 0.3;
  expect_same_tokens(plain, serve(*model, adaptive, requests));
}

INSTANTIATE_TEST_SUITE_P(
    Fixtures, DraftModelGreedy,
    ::testing::Values(std::pair<std::string, std::string>{"demo-code-target", "demo-code-draft"},
                      std::pair<std::string, std::string>{"llama-gqa", "llama-gqa"},
                      std::pair<std::string, std::string>{"qwen3-hybrid-swa", "qwen3-hybrid-swa"},
                      std::pair<std::string, std::string>{"deepseek-v3-mla-moe",
                                                          "deepseek-v3-mla-moe"}),
    [](const auto& param_info) {
      std::string name = param_info.param.first + "_" + param_info.param.second;
      for (char& c : name)
        if (c == '-') c = '_';
      return name;
    });

// The trained pair: the draft agrees with the target on most code tokens.
TEST(DraftModel, ATrainedDraftTakesFewerSteps) {
  auto ops = make_cpu_ops();
  auto model = load_model(fixture_model("demo-code-target"), LoadMode::kMmap, *ops);
  GenerationRequest request = greedy_request("code", prompt_of(24, 3, 8192), 48);
  EngineConfig config;
  Served plain = serve(*model, config, {request});
  Served fast = serve(*model, drafting(config, fixture_model("demo-code-draft")), {request});
  expect_same_tokens(plain, fast);
  EXPECT_LT(fast.stats.steps * 3, plain.stats.steps * 2);
  config.async_scheduling = true;
  Served async = serve(*model, drafting(config, fixture_model("demo-code-draft")), {request});
  expect_same_tokens(plain, async);
  EXPECT_LT(async.stats.steps * 3, plain.stats.steps * 2);
}

// Two tiny random models of one 8-token vocabulary: the draft disagrees often, so
// verification rejects and resamples often.
struct TinyPair {
  TempDir dir;
  std::filesystem::path target = dir.path() / "target", draft = dir.path() / "draft";
  TinyPair() {
    MakeModelOptions options;
    options.vocab_size = 8;
    options.hidden_size = 32;
    options.intermediate_size = 64;
    options.num_layers = 2;
    options.num_heads = 4;
    options.num_kv_heads = 2;
    options.seed = 11;
    make_random_model(options, target);
    options.seed = 12;
    make_random_model(options, draft);
  }
};

std::vector<float> next_logits(CausalLM& model, const std::vector<int32_t>& tokens) {
  KvCache cache(model.kv_shape(16), 8);
  SequenceKv kv;
  kv.reserve(cache, static_cast<int64_t>(tokens.size()));
  ForwardBatch batch;
  batch.add_sequence(tokens, 0, kv, cache.shape().block_size, false);
  std::vector<float> logits(static_cast<size_t>(model.config().vocab_size));
  model.forward(batch, cache, logits.data());
  kv.release_all(cache);
  return logits;
}

// The exact probability of every run of `length` tokens after `prompt` under `model` and
// `params`, indexed in base vocab (first token most significant).
std::vector<double> exact_runs(CausalLM& model, const std::vector<int32_t>& prompt,
                               const sampling::SamplingParams& params, int length) {
  const int32_t vocab = model.config().vocab_size;
  std::vector<double> runs = {1.0};
  std::vector<std::vector<int32_t>> outputs = {{}};
  for (int step = 0; step < length; ++step) {
    std::vector<double> longer;
    std::vector<std::vector<int32_t>> extended;
    for (size_t i = 0; i < runs.size(); ++i) {
      std::vector<int32_t> tokens = prompt;
      tokens.insert(tokens.end(), outputs[i].begin(), outputs[i].end());
      sampling::TokenHistory history;
      history.add_prompt(prompt);
      for (int32_t token : outputs[i]) history.add_output(token);
      std::vector<float> p =
          sampling::distribution(next_logits(model, tokens).data(), vocab, params, history);
      for (int32_t t = 0; t < vocab; ++t) {
        longer.push_back(runs[i] * p[static_cast<size_t>(t)]);
        extended.push_back(outputs[i]);
        extended.back().push_back(t);
      }
    }
    runs = std::move(longer);
    outputs = std::move(extended);
  }
  return runs;
}

// Pearson's statistic of `counts` against `probabilities` (cells expecting fewer than 5
// pooled), and its degrees of freedom.
std::pair<double, int> chi_square(const std::vector<int64_t>& counts,
                                  const std::vector<double>& probabilities, int64_t total) {
  double statistic = 0.0, pooled_expected = 0.0;
  int64_t pooled_count = 0;
  int cells = 0;
  for (size_t i = 0; i < counts.size(); ++i) {
    const double expected = probabilities[i] * static_cast<double>(total);
    if (expected < 5.0) {
      pooled_expected += expected;
      pooled_count += counts[i];
      continue;
    }
    statistic += std::pow(static_cast<double>(counts[i]) - expected, 2) / expected;
    ++cells;
  }
  if (pooled_expected > 0.0) {
    statistic += std::pow(static_cast<double>(pooled_count) - pooled_expected, 2) /
                 std::max(pooled_expected, 1e-9);
    ++cells;
  }
  return {statistic, cells - 1};
}

// The chi-square quantile with `df` degrees of freedom at one-sided p = 1e-4 (Wilson-Hilferty).
double chi_square_critical(int df) {
  const double z = 3.719, a = 2.0 / (9.0 * df);
  return df * std::pow(1.0 - a + z * std::sqrt(a), 3);
}

TEST(DraftModel, SampledOutputFollowsTheTargetsDistribution) {
  TinyPair pair;
  auto ops = make_cpu_ops();
  auto target = load_model(pair.target, LoadMode::kMmap, *ops);
  auto draft = load_model(pair.draft, LoadMode::kMmap, *ops);
  const std::vector<int32_t> prompt = {1, 5, 2, 7, 3};
  constexpr int kLength = 3;
  constexpr int64_t kSamples = 6000;
  sampling::SamplingParams params;
  params.temperature = 0.5f;
  params.top_k = 6;
  params.presence_penalty = 0.3f;
  std::vector<GenerationRequest> requests;
  for (int64_t s = 0; s < kSamples; ++s) {
    GenerationRequest request = greedy_request("s" + std::to_string(s), prompt, kLength + 1);
    request.sampling = params;
    request.sampling.seed = static_cast<uint64_t>(s);
    requests.push_back(std::move(request));
  }
  EngineConfig config;
  config.block_size = 4;
  config.num_blocks = 4096;
  config.max_running = 256;
  Served fast = serve(*target, drafting(config, pair.draft, 3), requests);
  std::vector<int64_t> counts(512, 0);
  for (const auto& [id, result] : fast.results) {
    ASSERT_EQ(result.tokens.size(), static_cast<size_t>(kLength + 1)) << id;
    int run = 0;
    for (int i = 0; i < kLength; ++i) run = run * 8 + result.tokens[static_cast<size_t>(i)];
    ++counts[static_cast<size_t>(run)];
  }
  // The draft is often wrong, so both verdicts are exercised.
  EXPECT_GT(fast.stats.accepted_draft_tokens, fast.stats.draft_tokens / 10);
  EXPECT_LT(fast.stats.accepted_draft_tokens, fast.stats.draft_tokens * 9 / 10);
  const auto [statistic, df] =
      chi_square(counts, exact_runs(*target, prompt, params, kLength), kSamples);
  EXPECT_LT(statistic, chi_square_critical(df)) << "df " << df;
  // The same test tells the draft's own distribution apart.
  const auto [against_draft, draft_df] =
      chi_square(counts, exact_runs(*draft, prompt, params, kLength), kSamples);
  EXPECT_GT(against_draft, chi_square_critical(draft_df)) << "df " << draft_df;
}

// Under a draft model a seeded sampled completion depends on where drafts were verified; its
// verify lengths follow the drafts alone, so the seed gives the same tokens in another run,
// under adaptive verification and beside other requests.
TEST(DraftModel, ASeedReproducesASampledCompletion) {
  auto ops = make_cpu_ops();
  auto model = load_model(fixture_model("demo-code-target"), LoadMode::kMmap, *ops);
  GenerationRequest seeded = greedy_request("seeded", prompt_of(30, 2, 8192), 24);
  seeded.sampling.temperature = 0.8f;
  seeded.sampling.top_p = 0.95f;
  seeded.sampling.seed = 42;
  EngineConfig config = drafting(EngineConfig{}, fixture_model("demo-code-draft"));
  config.speculative.verification = "adaptive";
  config.speculative.confidence_threshold = 0.2;
  Served alone = serve(*model, config, {seeded});
  std::vector<GenerationRequest> crowd = greedy_requests(8192);
  crowd.push_back(seeded);
  Served together = serve(*model, config, crowd);
  EXPECT_EQ(alone.results.at("seeded").tokens, together.results.at("seeded").tokens);
  EXPECT_GT(together.stats.draft_tokens, 0);
  config.async_scheduling = true;  // drafts made between the steps: the same ones
  EXPECT_EQ(alone.results.at("seeded").tokens,
            serve(*model, config, crowd).results.at("seeded").tokens);
}

TEST(DraftModel, ADraftWithoutTheTargetsVocabularyIsRefused) {
  TempDir dir;
  MakeModelOptions options;
  options.vocab_size = 6;
  options.hidden_size = 32;
  options.intermediate_size = 64;
  options.num_layers = 1;
  options.num_heads = 4;
  options.num_kv_heads = 2;
  make_random_model(options, dir.path() / "small");
  auto ops = make_cpu_ops();
  auto model = load_model(fixture_model("llama-gqa"), LoadMode::kMmap, *ops);
  EngineConfig config;
  config.num_blocks = 64;
  try {
    Engine engine(*model, drafting(config, dir.path() / "small"));
    FAIL() << "a 6-token draft was accepted";
  } catch (const Error& error) {
    EXPECT_NE(std::string(error.what()).find("vocabulary of 6 tokens"), std::string::npos)
        << error.what();
  }
  try {
    Engine engine(*model, drafting(config, dir.path() / "missing"));
    FAIL() << "a missing draft folder was accepted";
  } catch (const Error& error) {
    EXPECT_NE(std::string(error.what()).find("draft model"), std::string::npos) << error.what();
  }
}

}  // namespace
}  // namespace deepinfer
