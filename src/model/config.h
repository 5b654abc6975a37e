// Model configuration parsed from a Hugging Face config.json.
#pragma once

#include <filesystem>
#include <nlohmann/json_fwd.hpp>
#include <string>
#include <vector>

namespace deepinfer {

enum class ModelFamily { kLlama, kMistral, kQwen2, kQwen3 };

enum class RopeType { kDefault, kLinear, kDynamic, kLlama3, kYarn };

// Rotary embedding parameters, from either `rope_theta` + `rope_scaling` (hub style) or
// `rope_parameters` (newer style); both end up here.
struct RopeConfig {
  RopeType type = RopeType::kDefault;
  double theta = 10000.0;
  double factor = 1.0;
  double low_freq_factor = 1.0;   // llama3
  double high_freq_factor = 4.0;  // llama3
  int original_max_position_embeddings = 0;
  double beta_fast = 32.0;  // yarn
  double beta_slow = 1.0;   // yarn
  double mscale = 0.0;      // yarn (DeepSeek); 0 means absent
  double mscale_all_dim = 0.0;
  double attention_factor = 0.0;  // yarn; 0 means derive from factor
  bool truncate = true;           // yarn

  bool operator==(const RopeConfig&) const = default;
};

enum class Activation { kSilu, kGeluTanh };

struct ModelConfig {
  std::string architecture;  // "LlamaForCausalLM"
  ModelFamily family = ModelFamily::kLlama;
  int vocab_size = 0;
  int hidden_size = 0;
  int intermediate_size = 0;
  int num_layers = 0;
  int num_heads = 0;
  int num_kv_heads = 0;
  int head_dim = 0;
  int max_position_embeddings = 0;
  double rms_norm_eps = 1e-6;
  bool tie_word_embeddings = false;
  bool qkv_bias = false;
  bool o_bias = false;
  bool mlp_bias = false;
  bool qk_norm = false;
  Activation activation = Activation::kSilu;
  // Per layer: 0 for full attention, else the sliding window in tokens (a query attends to
  // itself and the window-1 tokens before it, as transformers does).
  std::vector<int> layer_window;
  // Per layer rope (the newer config style may give sliding layers their own).
  std::vector<RopeConfig> layer_rope;
  std::vector<int> eos_token_ids;
  int bos_token_id = -1;

  bool any_sliding() const;
};

// Parses config.json text. `source` names the file in errors: every error is one line naming
// the file and the field at fault.
ModelConfig parse_model_config(const std::string& text, const std::string& source);
ModelConfig load_model_config(const std::filesystem::path& folder);

// The names this build can load, for error messages and --help.
std::string supported_architectures();

}  // namespace deepinfer
