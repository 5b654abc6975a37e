#include "support/test_support.h"

#include <sys/wait.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <nlohmann/json.hpp>
#include <random>

#include "core/error.h"
#include "engine/sequence_runner.h"

namespace deepinfer::testing {

namespace fs = std::filesystem;

std::shared_ptr<const structured::TokenTable> json_piece_table(int32_t vocab) {
  const std::vector<std::string> pieces = {"{", "}", "\"", "a", "b",     ":",      ",",    " ",
                                           "1", "2", "[",  "]", "\"a\"", "\"b\":", "true", "null"};
  std::vector<std::string> bytes;
  for (int32_t id = 0; id < vocab; ++id)
    bytes.push_back(pieces[static_cast<size_t>(id) % pieces.size()]);
  bytes[0] = "<eos>";
  return std::make_shared<structured::TokenTable>(bytes, std::vector<int32_t>{0},
                                                  std::vector<int32_t>{});
}

Served serve(CausalLM& model, const EngineConfig& config,
             const std::vector<GenerationRequest>& requests) {
  Engine engine(model, config);
  for (const GenerationRequest& request : requests) engine.submit(request);
  Served served;
  for (GenerationResult& result : engine.run_to_completion())
    served.results[result.id] = std::move(result);
  served.stats = engine.stats();
  return served;
}

fs::path fixture_path(const std::string& relative) {
  // Test binaries built on one host and run on another (a GPU host) find the fixtures
  // through the environment: the repository may lie elsewhere there.
  const char* moved = std::getenv("DEEPINFER_FIXTURES");
  return fs::path(moved ? moved : DEEPINFER_FIXTURES) / relative;
}

fs::path fixture_model(const std::string& name) {
  return fixture_path("models") / name;
}

void FixtureTest::load(const std::string& fixture, std::unique_ptr<Ops> ops,
                       const ModelLoadOptions& options) {
  folder_ = fixture_model(fixture);
  ops_ = std::move(ops);
  model_ = load_model(folder_, options, *ops_);
  reference_ =
      std::make_unique<SafetensorsFile>(folder_ / "reference.safetensors", LoadMode::kRead);
}

const Tensor& FixtureTest::ref(const std::string& name) const {
  return reference_->tensors().at(name);
}

bool FixtureTest::has_ref(const std::string& name) const {
  return reference_->tensors().count(name) != 0;
}

std::vector<std::string> FixtureTest::cases() const {
  std::vector<std::string> names;
  while (has_ref("case" + std::to_string(names.size()) + ".input_ids"))
    names.push_back("case" + std::to_string(names.size()));
  return names;
}

std::string fixture_test_name(const ::testing::TestParamInfo<std::string>& param_info) {
  std::string name = param_info.param;
  for (char& ch : name) {
    if (ch == '-' || ch == '@') ch = '_';
  }
  return name;
}

TempDir::TempDir() {
  std::random_device device;
  path_ = fs::temp_directory_path() /
          ("deepinfer-test-" + std::to_string(device()) + std::to_string(device()));
  fs::create_directories(path_);
}

TempDir::~TempDir() {
  std::error_code ignored;
  fs::remove_all(path_, ignored);
}

std::vector<float> as_floats(const Tensor& tensor) {
  DI_CHECK(tensor.dtype == DType::kF32, "expected F32");
  return std::vector<float>(tensor.as<const float>(), tensor.as<const float>() + tensor.numel());
}

std::vector<int32_t> as_ids(const Tensor& tensor) {
  DI_CHECK(tensor.dtype == DType::kI64, "expected I64");
  std::vector<int32_t> ids;
  for (int64_t i = 0; i < tensor.numel(); ++i)
    ids.push_back(static_cast<int32_t>(tensor.as<const int64_t>()[i]));
  return ids;
}

float max_abs_difference(const float* a, const float* b, size_t count) {
  float worst = 0.0f;
  for (size_t i = 0; i < count; ++i) worst = std::max(worst, std::fabs(a[i] - b[i]));
  return worst;
}

float chunked_logit_error(CausalLM& model, const std::vector<int32_t>& ids,
                          const std::vector<float>& expected, size_t chunk) {
  const auto vocab = static_cast<size_t>(model.config().vocab_size);
  SequenceRunner runner(model, static_cast<int64_t>(ids.size()));
  float worst = 0.0f;
  for (size_t start = 0; start < ids.size(); start += chunk) {
    size_t end = std::min(ids.size(), start + chunk);
    std::vector<float> logits = runner.feed({ids.begin() + static_cast<std::ptrdiff_t>(start),
                                             ids.begin() + static_cast<std::ptrdiff_t>(end)},
                                            true);
    worst = std::max(
        worst, max_abs_difference(logits.data(), expected.data() + start * vocab, logits.size()));
  }
  return worst;
}

float decoded_logit_error(CausalLM& model, const std::vector<int32_t>& ids,
                          const std::vector<float>& expected, size_t prefill) {
  const auto vocab = static_cast<size_t>(model.config().vocab_size);
  SequenceRunner runner(model, static_cast<int64_t>(ids.size()));
  runner.feed({ids.begin(), ids.begin() + static_cast<std::ptrdiff_t>(prefill)}, false);
  float worst = 0.0f;
  for (size_t i = prefill; i < ids.size(); ++i) {
    std::vector<float> logits = runner.feed({ids[i]}, false);
    worst = std::max(worst, max_abs_difference(logits.data(), expected.data() + i * vocab, vocab));
  }
  return worst;
}

CommandResult run_command(const std::string& command) {
  std::string full = command + " 2>&1";
  FILE* pipe = popen(full.c_str(), "r");
  DI_CHECK(pipe != nullptr, "cannot run {}", command);
  std::string output;
  std::array<char, 4096> chunk{};
  size_t got;
  while ((got = fread(chunk.data(), 1, chunk.size(), pipe)) > 0) output.append(chunk.data(), got);
  int status = pclose(pipe);
  return {WIFEXITED(status) ? WEXITSTATUS(status) : -1, output};
}

void write_deepseek_v4_tokenizer(const std::filesystem::path& folder, bool v41) {
  std::ifstream in(std::string(DEEPINFER_TOKENIZERS) + "/deepseek_v3/tokenizer.json");
  nlohmann::json spec = nlohmann::json::parse(in);  // unordered: the vocabulary is large
  std::vector<std::string> renamed = {"<｜latest_reminder｜>", "<think>", "</think>", "｜DSML｜"};
  if (v41) renamed.push_back("<｜System｜>");
  for (nlohmann::json& token : spec["added_tokens"]) {
    if (renamed.empty()) break;
    if (token["content"].get<std::string>().find("place▁holder") == std::string::npos) continue;
    token["content"] = renamed.back();
    renamed.pop_back();
  }
  std::ofstream(folder / "tokenizer.json") << spec.dump();
}

MakeModelOptions small_deepseek_v3() {
  MakeModelOptions o;
  o.family = "deepseek_v3";
  o.vocab_size = 300;
  o.hidden_size = 64;
  o.intermediate_size = 96;
  o.num_layers = 3;
  o.num_heads = 4;
  o.q_lora_rank = 32;
  o.kv_lora_rank = 32;
  o.qk_nope_head_dim = 16;
  o.qk_rope_head_dim = 8;
  o.v_head_dim = 16;
  o.num_experts = 8;
  o.num_shared_experts = 1;
  o.experts_per_token = 2;
  o.moe_intermediate_size = 32;
  o.expert_groups = 4;
  o.topk_groups = 2;
  o.seed = 7;
  return o;
}

MakeModelOptions small_deepseek_v4() {
  MakeModelOptions o;
  o.family = "deepseek_v4";
  o.vocab_size = 300;
  o.hidden_size = 128;
  o.num_layers = 4;
  o.num_heads = 4;
  o.head_dim = 64;
  o.q_lora_rank = 64;
  o.qk_rope_head_dim = 16;
  o.o_groups = 2;
  o.o_lora_rank = 128;  // FP8 scale blocks of 128 rows split cleanly per group
  o.index_heads = 2;
  o.index_head_dim = 32;
  o.index_topk = 3;
  o.num_experts = 8;
  o.experts_per_token = 2;
  o.num_shared_experts = 1;
  o.moe_intermediate_size = 136;
  o.sliding_window = 16;
  o.compress_ratios = {0, 4, 128, 4};
  o.num_hash_layers = 1;
  o.seed = 3;
  return o;
}

}  // namespace deepinfer::testing
