// Writes a tiny Qwen3 checkpoint whose greedy (and, by a wide margin, sampled) output is a
// fixed script: a bigram model. Attention and MLP outputs are zero, so the last hidden state
// is the current token's embedding; lm_head row `next` points along the embedding of the
// token before it. End-to-end tests use it to see a real model emit tool-call tags.
//
//   make_scripted_model OUT_DIR TOKENIZER_DIR AFTER_TEXT SCRIPT_TEXT
//
// AFTER_TEXT's last token (the end of the prompt) is followed by SCRIPT_TEXT's tokens; every
// token may have only one successor in that chain.
#include <fmt/format.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>

#include "core/dtype.h"
#include "core/error.h"
#include "model/make_model.h"
#include "model/safetensors.h"
#include "tokenizer/tokenizer.h"

namespace fs = std::filesystem;
using namespace deepinfer;

namespace {

constexpr float kScale = 6.0f;  // logit of the scripted successor per unit of RMS-normed length

std::map<int32_t, int32_t> successors(const std::vector<int32_t>& chain) {
  std::map<int32_t, int32_t> next;
  for (size_t i = 0; i + 1 < chain.size(); ++i) {
    auto [it, inserted] = next.emplace(chain[i], chain[i + 1]);
    if (!inserted && it->second != chain[i + 1])
      fail("token {} is followed by both {} and {}: respell the script", chain[i], it->second,
           chain[i + 1]);
  }
  return next;
}

std::vector<float> to_f32(const Tensor& tensor) {
  std::vector<float> values(static_cast<size_t>(tensor.numel()));
  for (size_t i = 0; i < values.size(); ++i)
    values[i] = tensor.dtype == DType::kBF16 ? bf16_to_f32(tensor.as<uint16_t>()[i])
                                             : tensor.as<float>()[i];
  return values;
}

// The checkpoint's tensors rewritten: zero attention/MLP outputs, unit norms, scripted head.
void rewrite_weights(const fs::path& dir, const std::map<int32_t, int32_t>& next) {
  std::vector<std::vector<uint16_t>> storage;
  std::vector<NamedTensor> tensors;
  {
    TensorStore store(dir, LoadMode::kRead);
    std::vector<float> embed = to_f32(store.get("model.embed_tokens.weight"));
    const int64_t hidden = store.get("model.embed_tokens.weight").dim(1);
    for (const std::string& name : store.names()) {
      const Tensor& tensor = store.get(name);
      std::vector<float> values = to_f32(tensor);
      bool zero = name.find("o_proj") != std::string::npos ||
                  name.find("down_proj") != std::string::npos || name == "lm_head.weight";
      bool norm = name.find("norm") != std::string::npos;
      for (float& value : values) value = zero ? 0.0f : norm ? 1.0f : value;
      if (name == "lm_head.weight") {
        for (auto [from, to] : next) {
          const float* source = embed.data() + from * hidden;
          double length = 0;
          for (int64_t d = 0; d < hidden; ++d) length += source[d] * source[d];
          auto inverse =
              static_cast<float>(kScale / std::sqrt(length / static_cast<double>(hidden)) /
                                 std::sqrt(static_cast<double>(hidden)));
          for (int64_t d = 0; d < hidden; ++d) values[to * hidden + d] += source[d] * inverse;
        }
      }
      storage.emplace_back(values.size());
      for (size_t i = 0; i < values.size(); ++i) storage.back()[i] = f32_to_bf16(values[i]);
      Tensor out = tensor;
      out.data = storage.back().data();
      out.dtype = DType::kBF16;
      tensors.push_back({name, out});
    }
  }
  write_safetensors(dir / "model.safetensors", tensors);
}

void write_json(const fs::path& path, const nlohmann::json& value) {
  std::ofstream(path) << value.dump(2) << "\n";
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 5) {
    fmt::print(stderr, "usage: make_scripted_model OUT_DIR TOKENIZER_DIR AFTER_TEXT SCRIPT_TEXT\n");
    return 2;
  }
  try {
    fs::path out = argv[1], tokenizer_dir = argv[2];
    auto tokenizer = Tokenizer::load(tokenizer_dir);
    std::vector<int32_t> chain = {tokenizer->encode(argv[3]).back()};
    for (int32_t id : tokenizer->encode(argv[4])) chain.push_back(id);
    std::map<int32_t, int32_t> next = successors(chain);

    MakeModelOptions options;
    options.family = "qwen3";
    options.vocab_size = tokenizer->vocab_size();
    options.hidden_size = 64;
    options.intermediate_size = 64;
    options.num_layers = 1;
    options.num_heads = 2;
    options.num_kv_heads = 1;
    options.head_dim = 32;
    options.seed = 11;
    make_random_model(options, out);
    rewrite_weights(out, next);
    // Generation ends at the script's last token.
    nlohmann::json config = nlohmann::json::parse(std::ifstream(out / "config.json"));
    config["eos_token_id"] = chain.back();
    write_json(out / "config.json", config);
    write_json(out / "generation_config.json", {{"eos_token_id", chain.back()}});
    for (const char* file : {"tokenizer.json", "tokenizer_config.json"})
      fs::copy_file(tokenizer_dir / file, out / file, fs::copy_options::overwrite_existing);
    fmt::print("{}: a {}-token script after token {}\n", out.string(), chain.size() - 1, chain[0]);
  } catch (const std::exception& error) {
    fmt::print(stderr, "make_scripted_model: {}\n", error.what());
    return 1;
  }
  return 0;
}
