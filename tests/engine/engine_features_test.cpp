// Engine features beyond greedy batching: n completions, output and prompt logprobs, and the
// batch-invariant mode seen through the engine.
#include <gtest/gtest.h>

#include <map>
#include <nlohmann/json.hpp>
#include <set>

#include "core/error.h"
#include "engine/engine.h"
#include "engine/sequence_runner.h"
#include "kernels/ops.h"
#include "structured/structured.h"
#include "support/test_support.h"

namespace deepinfer {
namespace {

using testing::fixture_model;

std::vector<int32_t> prompt_of(int length, int salt, int32_t vocab) {
  std::vector<int32_t> ids;
  for (int i = 0; i < length; ++i) ids.push_back((i * 29 + salt * 71 + 2) % vocab);
  return ids;
}

EngineConfig small_config(int chunk = 2048) {
  EngineConfig config;
  config.block_size = 4;
  config.num_blocks = 256;
  config.max_batched_tokens = chunk;
  return config;
}

std::vector<GenerationResult> run(CausalLM& model, const EngineConfig& config,
                                  const std::vector<GenerationRequest>& requests) {
  Engine engine(model, config);
  for (const GenerationRequest& request : requests) engine.submit(request);
  return engine.run_to_completion();
}

TEST(EngineFeatures, NCompletionsShareThePromptAndTheFirstEqualsASingleRequest) {
  auto ops = make_cpu_ops();
  auto model = load_model(fixture_model("llama-gqa"), LoadMode::kMmap, *ops);
  GenerationRequest request;
  request.id = "many";
  request.prompt = prompt_of(30, 1, model->config().vocab_size);
  request.sampling.temperature = 1.0f;
  request.sampling.seed = 7;
  request.sampling.n = 4;
  request.max_tokens = 8;
  request.ignore_eos = true;
  std::vector<GenerationResult> results = run(*model, small_config(), {request});
  ASSERT_EQ(results.size(), 4u);
  std::map<int, GenerationResult> by_index;
  for (GenerationResult& result : results) by_index[result.index] = result;
  ASSERT_EQ(by_index.size(), 4u);
  std::set<std::vector<int32_t>> distinct;
  for (auto& [index, result] : by_index) {
    EXPECT_EQ(result.tokens.size(), 8u);
    distinct.insert(result.tokens);
    // The later completions reuse the first one's 7 whole prompt blocks.
    if (index > 0) {
      EXPECT_EQ(result.cached_prompt_tokens, 28) << index;
    }
  }
  EXPECT_GE(distinct.size(), 2u);
  GenerationRequest single = request;
  single.sampling.n = 1;
  EXPECT_EQ(run(*model, small_config(), {single})[0].tokens, by_index[0].tokens);
  // Seeded: the same four again, also when chunked and overlapped.
  EngineConfig other = small_config(5);
  other.async_scheduling = true;
  for (GenerationResult& result : run(*model, other, {request}))
    EXPECT_EQ(result.tokens, by_index[result.index].tokens) << result.index;
}

// A vocabulary limit (the tokenizer's size, where the model's embedding is padded past it):
// no draw, host or backend, greedy or sampled, ever returns an id at or above it, and prompts
// and logit_bias naming one are refused.
TEST(EngineFeatures, NoIdAtOrAboveTheVocabularyLimitIsEverSampled) {
  auto ops = make_cpu_ops();
  auto model = load_model(fixture_model("llama-gqa"), LoadMode::kMmap, *ops);
  const int32_t limit = model->config().vocab_size / 4;
  EngineConfig config = small_config();
  config.vocab_limit = limit;
  std::vector<GenerationRequest> requests;
  for (int i = 0; i < 6; ++i) {
    GenerationRequest request;
    request.id = "r" + std::to_string(i);
    request.prompt = prompt_of(12, i, limit);
    request.sampling.temperature = i == 0 ? 0.0f : 3.0f;  // greedy, and near-uniform draws
    request.sampling.seed = static_cast<uint64_t>(i);
    request.sampling.logprobs = i == 5;
    request.sampling.top_logprobs = i == 5 ? 2 : 0;  // drawn on the host
    request.sampling.n = 4;
    request.max_tokens = 24;
    request.ignore_eos = true;
    requests.push_back(request);
  }
  size_t drawn = 0;
  for (const GenerationResult& result : run(*model, config, requests)) {
    for (int32_t token : result.tokens) EXPECT_LT(token, limit);
    drawn += result.tokens.size();
  }
  EXPECT_EQ(drawn, 6u * 4 * 24);
  Engine engine(*model, config);
  GenerationRequest outside = requests[1];
  outside.prompt.push_back(limit);
  EXPECT_THROW(engine.submit(outside), Error);
  GenerationRequest biased = requests[1];
  biased.sampling.logit_bias = {{limit, 100.0f}};
  EXPECT_THROW(engine.submit(biased), Error);
}

TEST(EngineFeatures, PromptLogprobsMatchTheFullForwardEvenAfterACacheHit) {
  auto ops = make_cpu_ops();
  auto model = load_model(fixture_model("qwen3-qknorm"), LoadMode::kMmap, *ops);
  int32_t vocab = model->config().vocab_size;
  std::vector<int32_t> prompt = prompt_of(21, 2, vocab);
  SequenceRunner runner(*model, 32, 4);
  std::vector<float> logits = runner.feed(prompt, true);
  GenerationRequest warm;
  warm.id = "warm";
  warm.prompt = prompt;
  warm.max_tokens = 1;
  GenerationRequest request = warm;
  request.id = "scored";
  request.sampling.prompt_logprobs = 3;
  for (int chunk : {7, 2048}) {
    Engine engine(*model, small_config(chunk));
    engine.submit(warm);  // puts the prompt's blocks in the prefix cache first
    engine.run_to_completion();
    engine.submit(request);
    GenerationResult result = engine.run_to_completion()[0];
    EXPECT_EQ(result.cached_prompt_tokens, 0);
    ASSERT_EQ(result.prompt_logprobs.size(), prompt.size() - 1);
    for (size_t i = 0; i + 1 < prompt.size(); ++i) {
      std::vector<float> expected = sampling::log_softmax(logits.data() + i * vocab, vocab);
      const sampling::Sample& got = result.prompt_logprobs[i];
      EXPECT_EQ(got.token, prompt[i + 1]);
      EXPECT_NEAR(got.logprob, expected[static_cast<size_t>(prompt[i + 1])], 1e-4) << i;
      ASSERT_EQ(got.top.size(), 3u);
      float best = *std::max_element(expected.begin(), expected.end());
      EXPECT_NEAR(got.top[0].logprob, best, 1e-4);
    }
  }
}

TEST(EngineFeatures, OutputLogprobsDescribeTheChosenTokens) {
  auto ops = make_cpu_ops();
  auto model = load_model(fixture_model("llama-gqa"), LoadMode::kMmap, *ops);
  GenerationRequest request;
  request.id = "greedy";
  request.prompt = prompt_of(9, 3, model->config().vocab_size);
  request.sampling.temperature = 0.0f;
  request.sampling.logprobs = true;
  request.sampling.top_logprobs = 2;
  request.max_tokens = 5;
  request.ignore_eos = true;
  GenerationResult result = run(*model, small_config(), {request})[0];
  ASSERT_EQ(result.logprobs.size(), 5u);
  for (size_t i = 0; i < 5; ++i) {
    EXPECT_EQ(result.logprobs[i].token, result.tokens[i]);
    ASSERT_EQ(result.logprobs[i].top.size(), 2u);
    EXPECT_EQ(result.logprobs[i].top[0].token, result.tokens[i]);  // greedy takes the best
    EXPECT_EQ(result.logprobs[i].top[0].logprob, result.logprobs[i].logprob);
  }
}

// A grammar's rows are drawn where the logits are (Ops::mask_rows, then sample_rows) unless
// they ask for logprobs, which come from the unmasked row on the host: both ways give the
// same tokens, greedy or seeded, planned in turn or overlapped, and the text is the schema's.
TEST(EngineFeatures, GrammarRowsDrawnOnTheBackendEqualTheHostDraws) {
  auto ops = make_cpu_ops();
  auto model = load_model(fixture_model("llama-gqa"), LoadMode::kMmap, *ops);
  const int32_t vocab = model->config().vocab_size;
  auto table = testing::json_piece_table(vocab);
  const std::string schema = R"({"type": "object", "required": ["a", "b"],
      "properties": {"a": {"type": "array", "items": {"type": "integer"}, "minItems": 3},
                     "b": {"type": ["boolean", "null"]}}})";
  auto requests = [&](bool logprobs) {
    std::vector<GenerationRequest> all;
    for (int r = 0; r < 4; ++r) {
      GenerationRequest request;
      request.id = std::to_string(r);
      request.prompt = prompt_of(11 + 3 * r, r, vocab);
      request.constraint = structured::json_schema_constraint(table, schema);
      request.stop_token_ids = {0};
      request.sampling.temperature = r == 0 ? 0.0f : 0.7f + 0.1f * static_cast<float>(r);
      request.sampling.top_k = r == 2 ? 5 : 0;
      request.sampling.seed = 40 + static_cast<uint64_t>(r);
      request.sampling.logprobs = logprobs;
      request.max_tokens = 64;
      all.push_back(request);
    }
    return all;
  };
  for (bool async : {false, true}) {
    EngineConfig config = small_config();
    config.async_scheduling = async;
    std::map<std::string, GenerationResult> host, backend;
    for (auto& result : run(*model, config, requests(true))) host[result.id] = result;
    for (auto& result : run(*model, config, requests(false))) backend[result.id] = result;
    ASSERT_EQ(backend.size(), 4u);
    int complete = 0;
    for (const auto& [id, result] : backend) {
      EXPECT_EQ(result.tokens, host.at(id).tokens) << id << (async ? " async" : "");
      complete += result.finish_reason == FinishReason::kStop;
      std::string text;
      for (int32_t token : result.tokens)
        if (!table->is_end(token)) text += table->bytes(token);
      if (result.finish_reason == FinishReason::kStop) {
        EXPECT_TRUE(nlohmann::json::accept(text)) << id << ": " << text;
      }
    }
    EXPECT_GT(complete, 0);
  }
}

// Through the engine: a request's prompt and output logprobs (its logits, seen through
// log_softmax) are bitwise the same alone and in a crowd, chunked, overlapped.
TEST(EngineFeatures, BatchInvariantModeGivesBitwiseLogprobsInAnyBatch) {
  for (const char* name : {"llama-gqa", "deepseek-v3-mla-moe"}) {
    auto ops = make_cpu_ops(MatmulPrecision::kF32, true);
    auto model = load_model(fixture_model(name), LoadMode::kMmap, *ops);
    int32_t vocab = model->config().vocab_size;
    GenerationRequest target;
    target.id = "target";
    target.prompt = prompt_of(26, 4, vocab);
    target.sampling.temperature = 0.0f;
    target.sampling.logprobs = true;
    target.sampling.prompt_logprobs = 0;
    target.max_tokens = 6;
    target.ignore_eos = true;
    GenerationResult alone = run(*model, small_config(), {target})[0];
    std::vector<GenerationRequest> crowd = {target};
    for (int r = 0; r < 5; ++r) {
      GenerationRequest other = target;
      other.id = "other" + std::to_string(r);
      other.prompt = prompt_of(5 + 9 * r, 10 + r, vocab);
      crowd.push_back(other);
    }
    EngineConfig config = small_config(7);
    config.async_scheduling = true;
    for (GenerationResult& result : run(*model, config, crowd)) {
      if (result.id != "target") continue;
      EXPECT_EQ(result.tokens, alone.tokens) << name;
      ASSERT_EQ(result.logprobs.size(), alone.logprobs.size());
      ASSERT_EQ(result.prompt_logprobs.size(), alone.prompt_logprobs.size());
      for (size_t i = 0; i < alone.logprobs.size(); ++i)
        EXPECT_EQ(result.logprobs[i].logprob, alone.logprobs[i].logprob) << name << " " << i;
      for (size_t i = 0; i < alone.prompt_logprobs.size(); ++i) {
        EXPECT_EQ(result.prompt_logprobs[i].logprob, alone.prompt_logprobs[i].logprob)
            << name << " prompt " << i;
      }
    }
  }
}

}  // namespace
TEST(EngineFeatures, SequenceRunnerFeedGreedyFollowsTheGreedyTokens) {
  auto ops = make_cpu_ops();
  auto model = load_model(fixture_model("llama-gqa"), LoadMode::kMmap, *ops);
  std::vector<int32_t> prompt = prompt_of(9, 3, model->config().vocab_size);
  GreedyOptions options;
  options.max_new_tokens = 8;
  options.stop_at_eos = false;
  std::vector<int32_t> expected = generate_greedy(*model, prompt, options);
  SequenceRunner runner(*model, 32);
  std::vector<float> logits = runner.feed(prompt, false);
  std::vector<int32_t> drawn = {argmax(logits.data(), model->config().vocab_size)};
  while (drawn.size() < expected.size()) drawn.push_back(runner.feed_greedy(drawn.back()));
  EXPECT_EQ(drawn, expected);
  EXPECT_EQ(runner.length(), static_cast<int64_t>(prompt.size() + expected.size() - 1));
}

}  // namespace deepinfer
