// DeepSeek-V4 beyond the shared fixture suite: every chunking of the long case and decoding
// after a prefill against transformers, both config styles, config and weight errors, the
// cache's block size, and the batching engine with prefix hits and preemption.
#include <gtest/gtest.h>

#include <algorithm>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>

#include "core/error.h"
#include "engine/engine.h"
#include "engine/sequence_runner.h"
#include "kernels/ops.h"
#include "model/config.h"
#include "model/make_model.h"
#include "model/model.h"
#include "model/safetensors.h"
#include "support/test_support.h"

namespace deepinfer {
namespace {

using nlohmann::json;
using testing::as_floats;
using testing::as_ids;
using testing::chunked_logit_error;
using testing::decoded_logit_error;
using testing::fixture_model;
using testing::max_abs_difference;
using testing::TempDir;

constexpr char kFixture[] = "deepseek-v4-flash-style";
constexpr float kLogitTolerance = 1e-3f;

json fixture_config() {
  std::ifstream stream(fixture_model(kFixture) / "config.json");
  return json::parse(stream);
}

// A model folder with the fixture's weights and the given config.
void write_folder(const std::filesystem::path& folder, const json& config) {
  std::filesystem::create_directories(folder);
  std::filesystem::create_symlink(fixture_model(kFixture) / "model.safetensors",
                                  folder / "model.safetensors");
  std::ofstream(folder / "config.json") << config.dump(2);
}

// The fixture's config in transformers' newer style: layer_types, mlp_layer_types,
// compress_rates, partial_rotary_factor and nested rope_parameters.
json newer_style(const json& legacy) {
  json config = legacy;
  json types = json::array();
  for (int ratio : legacy["compress_ratios"]) {
    types.push_back(ratio == 0   ? "sliding_attention"
                    : ratio == 4 ? "compressed_sparse_attention"
                                 : "heavily_compressed_attention");
  }
  config["layer_types"] = types;
  json mlp = json::array();
  for (int i = 0; i < legacy["num_hidden_layers"].get<int>(); ++i)
    mlp.push_back(i < legacy["num_hash_layers"].get<int>() ? "hash_moe" : "moe");
  config["mlp_layer_types"] = mlp;
  config["compress_rates"] = {{"compressed_sparse_attention", 4},
                              {"heavily_compressed_attention", 128}};
  config["partial_rotary_factor"] =
      legacy["qk_rope_head_dim"].get<double>() / legacy["head_dim"].get<double>();
  json compress = legacy["rope_scaling"];
  compress["rope_type"] = compress["type"];
  compress.erase("type");
  compress["rope_theta"] = legacy["compress_rope_theta"];
  compress["attention_factor"] = 1.0;
  config["rope_parameters"] = {
      {"main", {{"rope_type", "default"}, {"rope_theta", legacy["rope_theta"]}}},
      {"compress", compress}};
  for (const char* key : {"compress_ratios", "num_hash_layers", "qk_rope_head_dim", "rope_scaling",
                          "rope_theta", "compress_rope_theta"})
    config.erase(key);
  return config;
}

class DeepseekV4 : public testing::FixtureTest {
 protected:
  void SetUp() override { load(kFixture, make_cpu_ops(), ModelLoadOptions{}); }

  std::vector<int32_t> long_ids() const { return as_ids(ref("case2.input_ids")); }
  std::vector<float> long_logits() const { return as_floats(ref("case2.logits")); }
};

// A decode batch reads the routed experts its rows are expected to touch: one row reads the
// per-token weights, a large batch nearly every expert of every layer.
TEST_F(DeepseekV4, BatchStepsReadTheExpertsTheirRowsTouch) {
  const CausalLM& lm = *model_;
  const MoeConfig& moe = lm.config().moe;
  const auto token = static_cast<double>(lm.weight_bytes_per_token());
  double routed = 0;
  for (const Tensor* tensor : lm.routed_weights_per_token()) {
    routed += static_cast<double>(tensor->nbytes());
    if (tensor->block_scales)
      routed += 4.0 * static_cast<double>(tensor->block_scales->rows * tensor->block_scales->cols);
  }
  ASSERT_GT(routed, 0.0);
  EXPECT_DOUBLE_EQ(lm.weight_bytes_per_step(1), token);
  double previous = token;
  for (int batch : {2, 4, 16, 64}) {
    const double bytes = lm.weight_bytes_per_step(batch);
    EXPECT_GT(bytes, previous) << batch;
    previous = bytes;
  }
  const double all_experts = routed * moe.num_experts / moe.experts_per_token;
  EXPECT_NEAR(lm.weight_bytes_per_step(4096), token - routed + all_experts, 1e-6 * token);
}

TEST_F(DeepseekV4, ConfigStylesAgree) {
  const ModelConfig& legacy = model_->config();
  ModelConfig newer = parse_model_config(newer_style(fixture_config()).dump(), "config.json");
  EXPECT_EQ(legacy.family, ModelFamily::kDeepseekV4);
  EXPECT_EQ(newer.v4.layer_attention, legacy.v4.layer_attention);
  EXPECT_EQ(legacy.v4.layer_rate, (std::vector<int>{0, 4, 128, 4}));
  EXPECT_EQ(newer.v4.layer_rate, legacy.v4.layer_rate);
  EXPECT_EQ(legacy.v4.layer_hash, (std::vector<bool>{true, false, false, false}));
  EXPECT_EQ(newer.v4.layer_hash, legacy.v4.layer_hash);
  EXPECT_EQ(newer.v4.rope_dims, 8);
  EXPECT_EQ(newer.v4.main_rope, legacy.v4.main_rope);
  EXPECT_EQ(newer.v4.compress_rope, legacy.v4.compress_rope);
  EXPECT_EQ(legacy.v4.compress_rope.theta, 160000.0);
  EXPECT_EQ(legacy.v4.compress_rope.attention_factor, 1.0);
  EXPECT_EQ(legacy.moe.scoring, ExpertScoring::kSqrtSoftplus);
  EXPECT_EQ(legacy.num_kv_heads, 1);
}

TEST_F(DeepseekV4, DefaultsFollowTransformers) {
  json config = fixture_config();
  for (const char* key : {"compress_ratios", "num_hash_layers", "max_position_embeddings"})
    config.erase(key);
  config["num_hidden_layers"] = 6;
  config["num_key_value_heads"] = 3;  // ignored: one shared K=V head
  ModelConfig parsed = parse_model_config(config.dump(), "config.json");
  EXPECT_EQ(parsed.num_kv_heads, 1);
  EXPECT_EQ(parsed.max_position_embeddings, 1 << 20);
  using enum V4Attention;
  EXPECT_EQ(parsed.v4.layer_attention,
            (std::vector<V4Attention>{kHeavilyCompressed, kHeavilyCompressed, kHeavilyCompressed,
                                      kCompressedSparse, kHeavilyCompressed, kCompressedSparse}));
  EXPECT_EQ(parsed.v4.layer_hash, (std::vector<bool>{true, true, true, false, false, false}));
}

TEST_F(DeepseekV4, NewerStyleCheckpointGivesTheSameLogits) {
  TempDir dir;
  write_folder(dir.path() / "newer", newer_style(fixture_config()));
  auto newer = load_model(dir.path() / "newer", LoadMode::kMmap, *ops_);
  EXPECT_LE(chunked_logit_error(*newer, long_ids(), long_logits(), long_ids().size()),
            kLogitTolerance);
}

// DeepSeek's own file layout: no "model." prefix, embed.weight / norm.weight /
// hc_head_{fn,base,scale}, and the K=V norm as attn.kv_norm.weight.
TEST_F(DeepseekV4, DeepSeeksTensorNamesGiveTheSameLogits) {
  TempDir dir;
  std::filesystem::create_directories(dir.path() / "release");
  TensorStore store(fixture_model(kFixture), LoadMode::kRead);
  auto renamed = [](std::string name) {
    auto replace = [&](const std::string& from, const std::string& to) {
      if (name.rfind(from, 0) == 0) name = to + name.substr(from.size());
    };
    replace("model.embed_tokens.", "embed.");
    replace("model.norm.", "norm.");
    replace("model.hc_head.hc_", "hc_head_");
    replace("model.layers.", "layers.");
    size_t at = name.find(".attn.norm.weight");
    if (at != std::string::npos) name.replace(at, 17, ".attn.kv_norm.weight");
    return name;
  };
  std::vector<NamedTensor> tensors;
  for (const std::string& name : store.names()) tensors.push_back({renamed(name), store.get(name)});
  EXPECT_TRUE(std::any_of(tensors.begin(), tensors.end(),
                          [](const NamedTensor& t) { return t.name == "hc_head_fn"; }));
  write_safetensors(dir.path() / "release" / "model.safetensors", tensors);
  std::ofstream(dir.path() / "release" / "config.json") << fixture_config().dump(2);
  auto release = load_model(dir.path() / "release", LoadMode::kMmap, *ops_);
  EXPECT_LE(chunked_logit_error(*release, long_ids(), long_logits(), long_ids().size()),
            kLogitTolerance);
}

TEST_F(DeepseekV4, EveryChunkingOfTheLongCaseMatches) {
  for (size_t chunk : {size_t{1}, size_t{7}, size_t{64}}) {
    EXPECT_LE(chunked_logit_error(*model_, long_ids(), long_logits(), chunk), kLogitTolerance)
        << "chunks of " << chunk;
  }
}

TEST_F(DeepseekV4, DecodingAfterAPrefillMatches) {
  EXPECT_LE(decoded_logit_error(*model_, long_ids(), long_logits(), 100), kLogitTolerance);
}

TEST_F(DeepseekV4, BlocksHoldWholeCompressionWindows) {
  EXPECT_EQ(model_->kv_shape(16).block_size, 128);
  EXPECT_EQ(model_->kv_shape(128).block_size, 128);
  EXPECT_EQ(model_->kv_shape(200).block_size, 256);
}

std::string config_error(const json& config) {
  try {
    parse_model_config(config.dump(), "config.json");
  } catch (const Error& error) {
    return error.what();
  }
  return "";
}

TEST(DeepseekV4Config, ErrorsNameTheField) {
  json config = fixture_config();
  config["compress_ratios"] = {0, 4, 7, 4};
  EXPECT_NE(config_error(config).find("compress_ratios"), std::string::npos);
  config = fixture_config();
  config["compress_ratios"] = {0, 4};
  EXPECT_NE(config_error(config).find("compress_ratios"), std::string::npos);
  config = fixture_config();
  config["o_groups"] = 3;
  EXPECT_NE(config_error(config).find("o_groups"), std::string::npos);
  config = newer_style(fixture_config());
  config["mlp_layer_types"][1] = "dense";
  EXPECT_NE(config_error(config).find("mlp_layer_types"), std::string::npos);
  config = newer_style(fixture_config());
  config["layer_types"][0] = "full_attention";
  EXPECT_NE(config_error(config).find("layer_types"), std::string::npos);
  config = fixture_config();
  config["scoring_func"] = "tanh";
  EXPECT_NE(config_error(config).find("scoring_func"), std::string::npos);
  config = fixture_config();
  config["qk_rope_head_dim"] = 7;
  EXPECT_NE(config_error(config).find("qk_rope_head_dim"), std::string::npos);
  config = fixture_config();
  config.erase("n_routed_experts");  // every V4 layer is MoE: a missing count is an error
  EXPECT_NE(config_error(config).find("missing field \"n_routed_experts\""), std::string::npos);
  config = fixture_config();
  config.erase("qk_rope_head_dim");
  config["head_dim"] = 40;  // the default rope dims (head_dim * 64 / 512 = 5) are odd
  EXPECT_NE(config_error(config).find("qk_rope_head_dim"), std::string::npos);
}

std::string load_error(const json& config) {
  TempDir dir;
  write_folder(dir.path() / "model", config);
  auto ops = make_cpu_ops();
  try {
    load_model(dir.path() / "model", LoadMode::kMmap, *ops);
  } catch (const Error& error) {
    return error.what();
  }
  return "";
}

TEST(DeepseekV4Config, WeightShapeErrorsNameTheTensor) {
  json config = fixture_config();
  config["index_head_dim"] = 8;
  EXPECT_NE(load_error(config).find("indexer"), std::string::npos) << load_error(config);
  config = fixture_config();
  config["compress_ratios"] = {0, 4, 4, 4};  // layer 2's compressor is HCA-shaped
  EXPECT_NE(load_error(config).find("layers.2.attn"), std::string::npos) << load_error(config);
  config = fixture_config();
  config["num_hash_layers"] = 2;  // layer 1 has no tid2eid
  EXPECT_NE(load_error(config).find("layers.1.ffn.gate.tid2eid"), std::string::npos);
}

// Requests around the long case: two sharing its first 260 tokens (past two blocks), short
// ones, all decoding a few tokens.
std::vector<GenerationRequest> long_workload(const std::vector<int32_t>& ids, int32_t vocab) {
  std::vector<GenerationRequest> requests;
  auto add = [&](std::vector<int32_t> prompt) {
    GenerationRequest request;
    request.id = "r" + std::to_string(requests.size());
    request.prompt = std::move(prompt);
    request.sampling.temperature = 0.0f;
    request.max_tokens = 5;
    request.ignore_eos = true;
    requests.push_back(request);
  };
  add(ids);
  std::vector<int32_t> branch(ids.begin(), ids.begin() + 260);
  for (int i = 0; i < 9; ++i) branch.push_back((i * 37 + 11) % vocab);
  add(branch);
  for (int r = 0; r < 3; ++r) {
    std::vector<int32_t> prompt;
    for (int i = 0; i < 3 + 11 * r; ++i) prompt.push_back((r * 53 + i * 19 + 5) % vocab);
    add(prompt);
  }
  return requests;
}

TEST_F(DeepseekV4, EngineBatchesAndPrefixHitsGiveTheAloneTokens) {
  std::vector<GenerationRequest> requests = long_workload(long_ids(), 512);
  std::map<std::string, std::vector<int32_t>> alone;
  for (const GenerationRequest& request : requests) {
    GreedyOptions options;
    options.max_new_tokens = request.max_tokens;
    options.stop_at_eos = false;
    alone[request.id] = generate_greedy(*model_, request.prompt, options);
  }
  auto run = [&](const EngineConfig& config, EngineStats* stats) {
    Engine engine(*model_, config);
    std::map<std::string, std::vector<int32_t>> tokens;
    // The first request runs alone first, so the second finds its blocks cached.
    engine.submit(requests.front());
    for (GenerationResult& result : engine.run_to_completion()) tokens[result.id] = result.tokens;
    for (size_t r = 1; r < requests.size(); ++r) engine.submit(requests[r]);
    for (GenerationResult& result : engine.run_to_completion()) tokens[result.id] = result.tokens;
    *stats = engine.stats();
    return tokens;
  };
  int64_t prompt_tokens = 0;
  for (const GenerationRequest& request : requests)
    prompt_tokens += static_cast<int64_t>(request.prompt.size());
  for (int chunk : {7, 64}) {
    EngineConfig config;
    config.num_blocks = 400;
    config.max_batched_tokens = chunk;
    EngineStats stats;
    EXPECT_EQ(run(config, &stats), alone) << "chunk " << chunk;
    // The branch reuses the long prompt's first two blocks (256 tokens).
    EXPECT_LE(stats.prompt_tokens, prompt_tokens - 256) << "chunk " << chunk;
  }
}

TEST_F(DeepseekV4, PreemptedRequestsRecomputeTheSameTokens) {
  // Three prompts one block long each, decoding across the block boundary: admitted together,
  // they cannot all grow.
  std::vector<GenerationRequest> requests;
  std::vector<int32_t> ids = long_ids();
  for (int r = 0; r < 3; ++r) {
    GenerationRequest request;
    request.id = "r" + std::to_string(r);
    request.prompt.assign(ids.begin() + 50 * r, ids.begin() + 50 * r + 120);
    request.sampling.temperature = 0.0f;
    request.max_tokens = 16;
    request.ignore_eos = true;
    requests.push_back(request);
  }
  std::map<std::string, std::vector<int32_t>> alone;
  for (const GenerationRequest& request : requests) {
    GreedyOptions options;
    options.max_new_tokens = request.max_tokens;
    options.stop_at_eos = false;
    alone[request.id] = generate_greedy(*model_, request.prompt, options);
  }
  EngineConfig tiny;
  tiny.num_blocks = 2 + 3 * model_->kv_shape(16).groups().num_groups();
  tiny.max_batched_tokens = 512;
  Engine engine(*model_, tiny);
  for (const GenerationRequest& request : requests) engine.submit(request);
  std::map<std::string, std::vector<int32_t>> tokens;
  for (GenerationResult& result : engine.run_to_completion()) tokens[result.id] = result.tokens;
  EXPECT_EQ(tokens, alone);
  EXPECT_GT(engine.stats().preemptions, 0);
}

// The checkpoint at `fp8` with every FP8 weight replaced by its f32 value (e4m3 times its
// block's scale), unquantized.
void write_dequantized(const std::filesystem::path& fp8, const std::filesystem::path& out) {
  TensorStore store(fp8, LoadMode::kRead);
  std::vector<std::vector<float>> keep;
  std::vector<NamedTensor> tensors;
  for (const std::string& name : store.names()) {
    if (name.ends_with("_scale_inv")) continue;
    const Tensor& tensor = store.get(name);
    if (tensor.dtype != DType::kF8E4M3) {
      tensors.push_back({name, tensor});
      continue;
    }
    const Tensor& scales = store.get(name + "_scale_inv");
    int64_t rows = tensor.dim(0), cols = tensor.dim(1);
    std::vector<float>& values = keep.emplace_back(static_cast<size_t>(rows * cols));
    for (int64_t r = 0; r < rows; ++r) {
      for (int64_t c = 0; c < cols; ++c) {
        float scale = scales.as<const float>()[(r / 128) * scales.dim(1) + c / 128];
        values[static_cast<size_t>(r * cols + c)] =
            f8e4m3_to_f32(tensor.as<const uint8_t>()[r * cols + c]) * scale;
      }
    }
    tensors.push_back({name, Tensor::contiguous(values.data(), DType::kF32, {rows, cols})});
  }
  std::filesystem::create_directories(out);
  write_safetensors(out / "model.safetensors", tensors);
  std::ifstream in(fp8 / "config.json");
  json config = json::parse(in);
  config.erase("quantization_config");
  std::ofstream(out / "config.json") << config.dump(2);
}

TEST(DeepseekV4Checkpoint, Fp8BlockScaledWeightsComputeAsTheirValues) {
  TempDir dir;
  MakeModelOptions o = testing::small_deepseek_v4();
  o.dtype = DType::kF8E4M3;
  make_random_model(o, dir.path() / "fp8");
  write_dequantized(dir.path() / "fp8", dir.path() / "f32");
  auto ops = make_cpu_ops();
  auto quantized = load_model(dir.path() / "fp8", LoadMode::kMmap, *ops);
  auto reference = load_model(dir.path() / "f32", LoadMode::kMmap, *ops);
  EXPECT_EQ(quantized->config().weight_block_rows, 128);
  std::vector<int32_t> prompt;
  for (int i = 0; i < 150; ++i) prompt.push_back((i * 31 + 7) % o.vocab_size);
  SequenceRunner a(*quantized, 150), b(*reference, 150);
  std::vector<float> got = a.feed(prompt, true), want = b.feed(prompt, true);
  EXPECT_LE(max_abs_difference(got.data(), want.data(), got.size()), 1e-4f);
}

// DeepSeek's own FP8 layout names a weight's scales "<prefix>.scale": the same model.
TEST(DeepseekV4Checkpoint, Fp8ScalesUnderDeepSeeksNames) {
  TempDir dir;
  MakeModelOptions o = testing::small_deepseek_v4();
  o.dtype = DType::kF8E4M3;
  make_random_model(o, dir.path() / "hf");
  TensorStore store(dir.path() / "hf", LoadMode::kRead);
  std::vector<NamedTensor> tensors;
  for (const std::string& name : store.names()) {
    std::string own = name;
    if (name.ends_with(".weight_scale_inv")) own = name.substr(0, name.size() - 17) + ".scale";
    tensors.push_back({own, store.get(name)});
  }
  std::filesystem::create_directories(dir.path() / "own");
  write_safetensors(dir.path() / "own" / "model.safetensors", tensors);
  std::filesystem::copy_file(dir.path() / "hf" / "config.json", dir.path() / "own" / "config.json");
  auto ops = make_cpu_ops();
  auto hf = load_model(dir.path() / "hf", LoadMode::kMmap, *ops);
  auto own = load_model(dir.path() / "own", LoadMode::kMmap, *ops);
  std::vector<int32_t> prompt = {5, 9, 11, 2, 7, 100, 3};
  SequenceRunner a(*hf, 7), b(*own, 7);
  std::vector<float> want = a.feed(prompt, true), got = b.feed(prompt, true);
  EXPECT_EQ(got, want);
}

TEST(DeepseekV4Checkpoint, MadeModelsLoadAndDecodeLikeTheirPrefill) {
  TempDir dir;
  MakeModelOptions o = testing::small_deepseek_v4();
  o.sliding_window = 0;    // V4's default window (128)
  o.compress_ratios = {};  // transformers' default schedule
  make_random_model(o, dir.path());
  auto ops = make_cpu_ops();
  auto model = load_model(dir.path(), LoadMode::kMmap, *ops);
  EXPECT_EQ(model->config().v4.window, 128);
  EXPECT_EQ(model->config().v4.layer_rate, (std::vector<int>{128, 128, 128, 4}));
  std::vector<int32_t> prompt;
  for (int i = 0; i < 140; ++i) prompt.push_back((i * 13 + 2) % o.vocab_size);
  SequenceRunner oneshot(*model, 140), stepwise(*model, 140);
  std::vector<float> expected = oneshot.feed(prompt, true);
  stepwise.feed({prompt.begin(), prompt.begin() + 120}, false);
  const auto vocab = static_cast<size_t>(o.vocab_size);
  for (size_t i = 120; i < prompt.size(); ++i) {
    std::vector<float> logits = stepwise.feed({prompt[i]}, false);
    EXPECT_LE(max_abs_difference(logits.data(), expected.data() + i * vocab, vocab), 1e-4f)
        << "position " << i;
  }
}

}  // namespace
}  // namespace deepinfer
