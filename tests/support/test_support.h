// Helpers shared by the tests: fixture paths, temporary folders, reference loading.
#pragma once

#include <gtest/gtest.h>

#include <filesystem>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "engine/engine.h"
#include "engine/request.h"
#include "kernels/ops.h"
#include "model/make_model.h"
#include "model/model.h"
#include "model/safetensors.h"
#include "structured/structured.h"

namespace deepinfer::testing {

std::filesystem::path fixture_model(const std::string& name);
// A file or folder under tests/fixtures.
std::filesystem::path fixture_path(const std::string& relative);
// A fixture name as a gtest parameter name ("llama-gqa" -> "llama_gqa").
std::string fixture_test_name(const ::testing::TestParamInfo<std::string>& param_info);

// The fixture models every engine and invariance test runs on.
inline const std::vector<std::string> kFixtureModels = {"llama-gqa",
                                                        "llama3-rope-tied",
                                                        "qwen2-mqa-bias-f32",
                                                        "qwen3-qknorm",
                                                        "qwen3-hybrid-swa",
                                                        "mistral-swa",
                                                        "deepseek-v3-mla-moe",
                                                        "deepseek-v3-fp8",
                                                        "deepseek-v2-lite-style",
                                                        "deepseek-v4-flash-style"};

// A request for `max_tokens` greedy tokens that ignores eos, under cache salt `salt`.
inline GenerationRequest greedy_request(const std::string& id, std::vector<int32_t> prompt,
                                        int max_tokens, uint64_t salt = 0) {
  GenerationRequest request;
  request.id = id;
  request.prompt = std::move(prompt);
  request.sampling.temperature = 0.0f;
  request.max_tokens = max_tokens;
  request.ignore_eos = true;
  request.cache_salt = salt;
  return request;
}

// A vocabulary of `vocab` tokens that spell pieces of JSON ("{", "\"a\"", "true", ...), id 0
// the end token: random models then write JSON objects under json_object_constraint.
std::shared_ptr<const structured::TokenTable> json_piece_table(int32_t vocab);

// Requests served together by one engine: each one's result by id, and the engine's stats
// once they are all done (its end writes what its disk tier queued).
struct Served {
  std::map<std::string, GenerationResult> results;
  EngineStats stats;
};
Served serve(CausalLM& model, const EngineConfig& config,
             const std::vector<GenerationRequest>& requests);

// A fresh directory under the system temp dir, removed when the object dies.
class TempDir {
 public:
  TempDir();
  ~TempDir();
  const std::filesystem::path& path() const { return path_; }

 private:
  std::filesystem::path path_;
};

// A fixture model loaded on a backend, beside what transformers computed for it
// (reference.safetensors): the base of the fixture parity suites.
class FixtureTest : public ::testing::TestWithParam<std::string> {
 protected:
  void load(const std::string& fixture, std::unique_ptr<Ops> ops, const ModelLoadOptions& options);
  const Tensor& ref(const std::string& name) const;
  bool has_ref(const std::string& name) const;
  // "case0", "case1", ...: the recorded prompts, each with input_ids and logits.
  std::vector<std::string> cases() const;

  std::filesystem::path folder_;
  std::unique_ptr<Ops> ops_;
  std::unique_ptr<CausalLM> model_;
  std::unique_ptr<SafetensorsFile> reference_;
};

std::vector<float> as_floats(const Tensor& tensor);
std::vector<int32_t> as_ids(const Tensor& tensor);
float max_abs_difference(const float* a, const float* b, size_t count);
// The largest |logit - expected| (expected [T, vocab], every position) when `ids` is fed
// `chunk` tokens at a time through a fresh cache (chunk >= ids.size(): one shot).
float chunked_logit_error(CausalLM& model, const std::vector<int32_t>& ids,
                          const std::vector<float>& expected, size_t chunk);
// The same after a `prefill`-token prefill, then decoding the rest one token a step.
float decoded_logit_error(CausalLM& model, const std::vector<int32_t>& ids,
                          const std::vector<float>& expected, size_t prefill);

// No DeepSeek-V4 tokenizer is published in the fixtures: writes `folder`/tokenizer.json as the
// V3 vocabulary with five of its reserved placeholder tokens renamed to V4's new control
// tokens (<｜System｜> only for V4.1), which is how the V4 vocabulary is described as
// extending V3's.
void write_deepseek_v4_tokenizer(const std::filesystem::path& folder, bool v41);

// Runs a command line, returning its exit status and combined stdout+stderr.
struct CommandResult {
  int status;
  std::string output;
};
CommandResult run_command(const std::string& command);

// A small DeepSeek-V3 for make_random_model: 3 layers of MLA (q LoRA 32, latent 32) and 8
// experts top-2 in 4 groups, a 300-token vocabulary.
MakeModelOptions small_deepseek_v3();

// A small DeepSeek-V4 for make_random_model: 4 layers (window, CSA, HCA, CSA), one hash
// layer, 8 experts of width 136 (FP8 scale blocks and the GPU's expert chunks do not divide it).
MakeModelOptions small_deepseek_v4();

}  // namespace deepinfer::testing
