// The fixtures on the CUDA backend against what Hugging Face transformers computed, and
// the batching engine on the GPU against the same engine on the CPU. Skipped, and saying so,
// where no GPU is present.
//
// Tolerance: prompts longer than 8 tokens run their products through cuBLASLt, which rounds
// activations to bf16 (8 significant bits), so logits are held to 2% of the largest reference
// logit of the case (max abs difference), and greedy tokens are compared up to the first step
// whose recorded margin is within twice that bound. Decode-sized steps keep f32 activations.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>

#include "engine/engine.h"
#include "engine/sequence_runner.h"
#include "kernels/cuda/cuda_kernels.h"
#include "kernels/cuda/cuda_ops.h"
#include "model/make_model.h"
#include "model/model.h"
#include "structured/structured.h"
#include "support/test_support.h"

namespace deepinfer {
namespace {

using testing::as_floats;
using testing::as_ids;
using testing::fixture_model;
using testing::max_abs_difference;

constexpr float kRelativeLogitTolerance = 2e-2f;

float largest_magnitude(const std::vector<float>& values) {
  float largest = 0.0f;
  for (float v : values) largest = std::max(largest, std::abs(v));
  return largest;
}

class CudaFixture : public testing::FixtureTest {
 protected:
  void SetUp() override {
    if (cuda::device_count() == 0) GTEST_SKIP() << "no CUDA device on this machine";
    ModelLoadOptions options;
    options.mode = LoadMode::kRead;
    load(GetParam(), cuda::make_cuda_ops(), options);
  }
};

TEST_P(CudaFixture, LogitsMatchTransformers) {
  for (const std::string& name : cases()) {
    std::vector<int32_t> ids = as_ids(ref(name + ".input_ids"));
    SequenceRunner runner(*model_, static_cast<int64_t>(ids.size()));
    std::vector<float> logits = runner.feed(ids, true);
    std::vector<float> expected = as_floats(ref(name + ".logits"));
    ASSERT_EQ(logits.size(), expected.size());
    float difference = max_abs_difference(logits.data(), expected.data(), logits.size());
    float bound = kRelativeLogitTolerance * largest_magnitude(expected);
    EXPECT_LE(difference, bound) << name << " (" << ids.size() << " tokens)";
    std::printf("%s: %zu tokens, max |logit difference| %.2e (bound %.2e)\n", name.c_str(),
                ids.size(), difference, bound);
  }
  EXPECT_FALSE(cases().empty());
}

TEST_P(CudaFixture, GreedyTokensMatchUpToTheMargin) {
  std::vector<int32_t> prompt = as_ids(ref("greedy.prompt"));
  std::vector<int32_t> expected = as_ids(ref("greedy.tokens"));
  std::vector<float> margins = as_floats(ref("greedy.margin"));
  std::vector<float> logits = as_floats(ref("case0.logits"));
  float margin_needed = 2 * kRelativeLogitTolerance * largest_magnitude(logits);
  GreedyOptions options;
  options.max_new_tokens = static_cast<int>(expected.size());
  options.stop_at_eos = false;
  std::vector<int32_t> generated = generate_greedy(*model_, prompt, options);
  ASSERT_EQ(generated.size(), expected.size());
  size_t compared = 0;
  for (; compared < expected.size() && margins[compared] >= margin_needed; ++compared)
    ASSERT_EQ(generated[compared], expected[compared]) << "step " << compared;
  std::printf("%zu of %zu greedy tokens compared (margin >= %.3f)\n", compared, expected.size(),
              margin_needed);
  // The same steps drawn on the device (bench's batch-1 decode): the same tokens.
  SequenceRunner runner(*model_, static_cast<int64_t>(prompt.size() + expected.size()));
  std::vector<float> first = runner.feed(prompt, false);
  std::vector<int32_t> drawn = {argmax(first.data(), model_->config().vocab_size)};
  while (drawn.size() < generated.size()) drawn.push_back(runner.feed_greedy(drawn.back()));
  EXPECT_EQ(drawn, generated);
}

TEST_P(CudaFixture, HiddenStatesAndChunkedPrefill) {
  std::vector<int32_t> ids = as_ids(ref("case0.input_ids"));
  std::vector<float> one_shot;
  {
    SequenceRunner runner(*model_, static_cast<int64_t>(ids.size()));
    int reported = 0;
    one_shot = runner.feed(ids, true, [&](int, const Tensor& hidden) {
      EXPECT_EQ(hidden.device, Device::kCpu);
      EXPECT_TRUE(std::isfinite(hidden.as<const float>()[0]));
      ++reported;
    });
    EXPECT_EQ(reported, model_->config().num_layers + 1);
  }
  SequenceRunner runner(*model_, static_cast<int64_t>(ids.size()), 4);
  size_t start = 0;
  auto vocab = static_cast<size_t>(model_->config().vocab_size);
  float bound = kRelativeLogitTolerance * largest_magnitude(one_shot);
  for (size_t chunk = 1; start < ids.size(); chunk = chunk * 2 + 1) {
    size_t end = std::min(ids.size(), start + chunk);
    std::vector<int32_t> piece(ids.begin() + static_cast<std::ptrdiff_t>(start),
                               ids.begin() + static_cast<std::ptrdiff_t>(end));
    std::vector<float> logits = runner.feed(piece, true);
    EXPECT_LE(max_abs_difference(logits.data(), one_shot.data() + start * vocab, logits.size()),
              bound)
        << "chunk at " << start;
    start = end;
  }
}

INSTANTIATE_TEST_SUITE_P(DenseFamilies, CudaFixture,
                         ::testing::Values("llama-gqa", "llama3-rope-tied", "qwen2-mqa-bias-f32",
                                           "qwen3-qknorm", "qwen3-hybrid-swa", "mistral-swa",
                                           "tiny-qwen3-chat", "tiny-llama3-chat",
                                           "demo-code-target"),
                         testing::fixture_test_name);

// Every submitted request run to the end, by id.
std::map<std::string, GenerationResult> results_by_id(Engine& engine) {
  std::map<std::string, GenerationResult> results;
  for (GenerationResult& result : engine.run_to_completion()) results[result.id] = result;
  return results;
}

// The same tokens for every request, and logprobs within `tolerance`.
void expect_same_outputs(std::map<std::string, GenerationResult>& want,
                         std::map<std::string, GenerationResult>& got, double tolerance) {
  for (auto& [id, result] : want) {
    ASSERT_EQ(got[id].tokens, result.tokens) << id;
    for (size_t i = 0; i < result.logprobs.size(); ++i)
      EXPECT_NEAR(got[id].logprobs[i].logprob, result.logprobs[i].logprob, tolerance)
          << id << " " << i;
  }
}

// The engine's batches (mixed prefill chunks and decodes, several sequences) on the GPU pick
// the same greedy tokens as on the CPU while the CPU's margin allows.
TEST(CudaEngine, BatchedGreedyMatchesTheCpu) {
  if (cuda::device_count() == 0) GTEST_SKIP() << "no CUDA device on this machine";
  auto run = [](Ops& ops) {
    auto model = load_model(fixture_model("qwen3-hybrid-swa"), LoadMode::kRead, ops);
    EngineConfig config;
    config.kv_bytes = size_t{64} << 20;
    config.max_batched_tokens = 24;
    Engine engine(*model, config);
    for (int r = 0; r < 6; ++r) {
      GenerationRequest request;
      request.id = std::to_string(r);
      for (int t = 0; t < 10 + 7 * r; ++t) request.prompt.push_back((t * 31 + r * 7) % 500 + 3);
      request.sampling.temperature = 0.0f;
      request.max_tokens = 12;
      request.ignore_eos = true;
      engine.submit(request);
    }
    std::map<std::string, std::vector<int32_t>> tokens;
    for (GenerationResult& result : engine.run_to_completion()) tokens[result.id] = result.tokens;
    return tokens;
  };
  auto cpu = make_cpu_ops();
  auto gpu = cuda::make_cuda_ops();
  auto want = run(*cpu);
  auto got = run(*gpu);
  int equal = 0;
  for (auto& [id, tokens] : want) equal += got[id] == tokens;
  // Random-weight fixture logits are close together, so a bf16 rounding may flip a late
  // token; most sequences must still agree in full.
  EXPECT_GE(equal, 4) << "sequences with identical greedy output";
}

// Seeded sampling drawn on the GPU (sample_rows) gives the tokens and logprobs that host
// sampling gives over the same logits: a zero logit bias sends the same requests through the
// host path. top_k = 1 at temperature 1 is greedy (temperature 0).
TEST(CudaEngine, DeviceSamplingEqualsHostSampling) {
  if (cuda::device_count() == 0) GTEST_SKIP() << "no CUDA device on this machine";
  auto gpu = cuda::make_cuda_ops();
  auto model = load_model(fixture_model("qwen3-hybrid-swa"), LoadMode::kRead, *gpu);
  EngineConfig config;
  config.kv_bytes = size_t{64} << 20;
  enum class Way { kDrawn, kThroughHost, kTopOne, kGreedy };
  auto run = [&](Way way) {
    Engine engine(*model, config);
    for (int r = 0; r < 6; ++r) {
      GenerationRequest request;
      request.id = std::to_string(r);
      for (int t = 0; t < 12 + 5 * r; ++t) request.prompt.push_back((t * 17 + r * 3) % 500 + 3);
      sampling::SamplingParams& p = request.sampling;
      p.seed = 1000 + r;
      p.logprobs = true;
      if (way == Way::kTopOne || way == Way::kGreedy) {
        p.temperature = way == Way::kGreedy ? 0.0f : 1.0f;
        p.top_k = 1;
      } else {
        p.temperature = 0.8f + 0.1f * static_cast<float>(r % 3);
        p.top_k = r % 2 == 0 ? 0 : 40;
        p.top_p = r < 3 ? 1.0f : 0.9f;
        p.min_p = r == 5 ? 0.05f : 0.0f;
        if (way == Way::kThroughHost) p.logit_bias = {{0, 0.0f}};
      }
      request.max_tokens = 16;
      request.ignore_eos = true;
      engine.submit(request);
    }
    return results_by_id(engine);
  };
  auto device = run(Way::kDrawn);
  auto host = run(Way::kThroughHost);
  expect_same_outputs(host, device, 1e-4);
  auto top_one = run(Way::kTopOne);
  auto greedy = run(Way::kGreedy);
  for (auto& [id, result] : greedy) EXPECT_EQ(top_one[id].tokens, result.tokens) << id;
}

// Rows under a grammar are masked and drawn on the GPU unless they ask for logprobs (then
// masked and drawn on the host): the same tokens both ways, greedy and seeded, in turn and
// overlapped.
TEST(CudaEngine, GrammarRowsDrawnOnTheDeviceEqualTheHostDraws) {
  if (cuda::device_count() == 0) GTEST_SKIP() << "no CUDA device on this machine";
  auto gpu = cuda::make_cuda_ops();
  auto model = load_model(fixture_model("qwen3-hybrid-swa"), LoadMode::kRead, *gpu);
  const int32_t vocab = model->config().vocab_size;
  auto table = testing::json_piece_table(vocab);
  const std::string schema = R"({"type": "object", "required": ["a"],
      "properties": {"a": {"type": "array", "items": {"type": "integer"}, "minItems": 2}}})";
  for (bool async : {false, true}) {
    EngineConfig config;
    config.kv_bytes = size_t{64} << 20;
    config.async_scheduling = async;
    auto run = [&](bool logprobs) {
      Engine engine(*model, config);
      for (int r = 0; r < 5; ++r) {
        GenerationRequest request;
        request.id = std::to_string(r);
        for (int t = 0; t < 9 + 4 * r; ++t) request.prompt.push_back((t * 13 + r * 5) % 400 + 3);
        request.constraint = structured::json_schema_constraint(table, schema);
        request.stop_token_ids = {0};
        request.sampling.temperature = r == 0 ? 0.0f : 0.8f;
        request.sampling.top_p = r == 3 ? 0.9f : 1.0f;
        request.sampling.seed = 500 + static_cast<uint64_t>(r);
        request.sampling.logprobs = logprobs;
        request.max_tokens = 40;
        engine.submit(request);
      }
      return results_by_id(engine);
    };
    auto device = run(false);
    auto host = run(true);
    ASSERT_EQ(device.size(), 5u);
    for (auto& [id, result] : device) EXPECT_EQ(host[id].tokens, result.tokens) << id;
  }
}

// With no budget given, a GPU engine's KV cache takes most of the free device memory.
TEST(CudaEngine, DefaultKvBudgetIsMostOfTheFreeDeviceMemory) {
  if (cuda::device_count() == 0) GTEST_SKIP() << "no CUDA device on this machine";
  auto gpu = cuda::make_cuda_ops();
  double budget = static_cast<double>(kv_budget_bytes(EngineConfig{}, *gpu));
  double available = static_cast<double>(gpu->available_memory());
  EXPECT_NEAR(budget / available, kDefaultDeviceKvFraction, 0.02);
}

// Three greedy requests (prompts of 100, 160 and 220 tokens below `vocab`) decoding 40 tokens
// each alongside one another, with logprobs.
std::map<std::string, GenerationResult> three_decodes(CausalLM& model, int vocab) {
  EngineConfig config;
  config.kv_bytes = size_t{64} << 20;
  Engine engine(model, config);
  for (int r = 0; r < 3; ++r) {
    GenerationRequest request;
    request.id = std::to_string(r);
    for (int t = 0; t < 100 + 60 * r; ++t) request.prompt.push_back((t * 13 + r) % (vocab - 3) + 3);
    request.sampling.temperature = 0.0f;
    request.sampling.logprobs = true;
    request.max_tokens = 40;
    request.ignore_eos = true;
    engine.submit(request);
  }
  return results_by_id(engine);
}

// Decode steps replayed from recorded graphs give the same logits as running them op by op,
// across context buckets (the recordings' key-split counts) and for several sequences.
TEST(CudaEngine, RecordedDecodeStepsMatchEagerOnes) {
  if (cuda::device_count() == 0) GTEST_SKIP() << "no CUDA device on this machine";
  auto gpu = cuda::make_cuda_ops();
  ModelLoadOptions eager_options;
  eager_options.mode = LoadMode::kRead;
  eager_options.record_decode_steps = false;
  ModelLoadOptions recorded_options = eager_options;
  recorded_options.record_decode_steps = true;
  auto eager = load_model(fixture_model("qwen3-hybrid-swa"), eager_options, *gpu);
  auto recorded = load_model(fixture_model("qwen3-hybrid-swa"), recorded_options, *gpu);
  auto want = three_decodes(*eager, 500);
  auto got = three_decodes(*recorded, 500);
  expect_same_outputs(want, got, 1e-5);
  EXPECT_GT(recorded->replayed_decode_steps(), 0);
}

// MLA (latent cache: absorbed decode, expanded prompts), MoE routing and FP8 weights.
INSTANTIATE_TEST_SUITE_P(DeepSeek, CudaFixture,
                         ::testing::Values("deepseek-v3-mla-moe", "deepseek-v3-fp8",
                                           "deepseek-v2-lite-style"),
                         testing::fixture_test_name);

// DeepSeek-V4 against transformers with f32 prompt products: its indexer's top-k turns on
// score differences that rounding prompt activations to bf16 makes (the CPU in bf16 mode
// picks other entries on the 290-token case too), so the kernels are checked in f32. The long
// case (290 tokens: the indexer's top-k and HCA entries act) runs one-shot, in chunks of 1, 7
// and 64, and decoded token by token after a 100-token prefill.
class CudaDeepseekV4 : public testing::FixtureTest {
 protected:
  void SetUp() override {
    if (cuda::device_count() == 0) GTEST_SKIP() << "no CUDA device on this machine";
    ModelLoadOptions options;
    options.mode = LoadMode::kRead;
    load("deepseek-v4-flash-style", cuda::make_cuda_ops(0, MatmulPrecision::kF32), options);
  }
};

TEST_F(CudaDeepseekV4, EveryCaseAndGreedyMatchTransformers) {
  for (const std::string& name : cases()) {
    std::vector<int32_t> ids = as_ids(ref(name + ".input_ids"));
    SequenceRunner runner(*model_, static_cast<int64_t>(ids.size()));
    std::vector<float> logits = runner.feed(ids, true);
    std::vector<float> expected = as_floats(ref(name + ".logits"));
    float difference = max_abs_difference(logits.data(), expected.data(), logits.size());
    EXPECT_LE(difference, kRelativeLogitTolerance * largest_magnitude(expected)) << name;
    std::printf("%s: %zu tokens, max |logit difference| %.2e\n", name.c_str(), ids.size(),
                difference);
  }
  std::vector<int32_t> expected = as_ids(ref("greedy.tokens"));
  GreedyOptions options;
  options.max_new_tokens = static_cast<int>(expected.size());
  options.stop_at_eos = false;
  EXPECT_EQ(generate_greedy(*model_, as_ids(ref("greedy.prompt")), options), expected);
}

// Batched with other requests in the engine (prefix hits, chunks and decodes together), the
// GPU picks the CPU's greedy tokens.
TEST_F(CudaDeepseekV4, EngineBatchesMatchTheCpu) {
  auto run = [&](CausalLM& model) {
    EngineConfig config;
    config.kv_bytes = size_t{256} << 20;
    config.max_batched_tokens = 64;
    Engine engine(model, config);
    std::vector<int32_t> ids = as_ids(ref("case2.input_ids"));
    for (int r = 0; r < 5; ++r) {
      GenerationRequest request;
      request.id = std::to_string(r);
      request.prompt.assign(ids.begin(), ids.begin() + 140 + 30 * r);
      request.prompt.back() = (r * 37 + 5) % 512;
      request.sampling.temperature = 0.0f;
      request.max_tokens = 8;
      request.ignore_eos = true;
      engine.submit(request);
    }
    std::map<std::string, std::vector<int32_t>> tokens;
    for (GenerationResult& result : engine.run_to_completion()) tokens[result.id] = result.tokens;
    return tokens;
  };
  auto cpu = make_cpu_ops();
  auto cpu_model = load_model(fixture_model("deepseek-v4-flash-style"), LoadMode::kRead, *cpu);
  EXPECT_EQ(run(*model_), run(*cpu_model));
}

// Recorded decode steps give the op-by-op logits: compression windows complete inside them
// (windows are listed per row on the device), the first 128 tokens' HCA window among them,
// and contexts cross recording bounds.
TEST_F(CudaDeepseekV4, RecordedDecodeStepsMatchEagerOnes) {
  auto gpu = cuda::make_cuda_ops(0, MatmulPrecision::kF32);
  ModelLoadOptions options;
  options.mode = LoadMode::kRead;
  options.record_decode_steps = false;
  auto eager = load_model(fixture_model("deepseek-v4-flash-style"), options, *gpu);
  options.record_decode_steps = true;
  auto recorded = load_model(fixture_model("deepseek-v4-flash-style"), options, *gpu);
  const int vocab = eager->config().vocab_size;
  auto want = three_decodes(*eager, vocab);
  auto got = three_decodes(*recorded, vocab);
  expect_same_outputs(want, got, 1e-5);
  EXPECT_GT(recorded->replayed_decode_steps(), 0);
}

// FP8 experts of a width the device path does not take (136) route through the host, which
// a recording cannot do: such steps run op by op, with the same results.
TEST(CudaDeepseekV4Checkpoint, UnrecordableStepsRunOpByOp) {
  if (cuda::device_count() == 0) GTEST_SKIP() << "no CUDA device on this machine";
  testing::TempDir dir;
  MakeModelOptions o = testing::small_deepseek_v4();
  o.dtype = DType::kF8E4M3;
  make_random_model(o, dir.path());
  auto gpu = cuda::make_cuda_ops(0, MatmulPrecision::kF32);
  ModelLoadOptions options;
  options.record_decode_steps = false;
  auto eager = load_model(dir.path(), options, *gpu);
  options.record_decode_steps = true;
  auto recorded = load_model(dir.path(), options, *gpu);
  auto want = three_decodes(*eager, o.vocab_size);
  auto got = three_decodes(*recorded, o.vocab_size);
  expect_same_outputs(want, got, 1e-5);
  EXPECT_EQ(recorded->replayed_decode_steps(), 0);
}

TEST_F(CudaDeepseekV4, ChunkedPrefillAndDecodeMatchTransformers) {
  std::vector<int32_t> ids = as_ids(ref("case2.input_ids"));
  std::vector<float> expected = as_floats(ref("case2.logits"));
  const float bound = kRelativeLogitTolerance * largest_magnitude(expected);
  for (size_t chunk : {size_t{1}, size_t{7}, size_t{64}}) {
    float worst = testing::chunked_logit_error(*model_, ids, expected, chunk);
    EXPECT_LE(worst, bound) << "chunks of " << chunk;
    std::printf("chunks of %zu: max |logit difference| %.2e (bound %.2e)\n", chunk, worst, bound);
  }
  float worst = testing::decoded_logit_error(*model_, ids, expected, 100);
  EXPECT_LE(worst, bound) << "decode after a 100-token prefill";
  std::printf("decode: max |logit difference| %.2e\n", worst);
}

}  // namespace
}  // namespace deepinfer
