#include "model/config.h"

#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "core/error.h"

namespace deepinfer {

using nlohmann::json;

namespace {

struct Architecture {
  const char* name;
  ModelFamily family;
};
constexpr Architecture kArchitectures[] = {
    {"LlamaForCausalLM", ModelFamily::kLlama},
    {"MistralForCausalLM", ModelFamily::kMistral},
    {"Qwen2ForCausalLM", ModelFamily::kQwen2},
    {"Qwen3ForCausalLM", ModelFamily::kQwen3},
};

// Typed field access with errors that name the file and field.
class Fields {
 public:
  Fields(const json& object, const std::string& source, std::string prefix = "")
      : object_(object), source_(source), prefix_(std::move(prefix)) {}

  bool has(const char* key) const { return object_.contains(key) && !object_.at(key).is_null(); }

  int positive_int(const char* key) const {
    const json& value = require(key);
    if (!value.is_number_integer() || value.get<int64_t>() <= 0 ||
        value.get<int64_t>() > (1ll << 31)) {
      bad(key, "a positive integer");
    }
    return value.get<int>();
  }
  int int_or(const char* key, int fallback) const {
    return has(key) ? positive_int(key) : fallback;
  }
  int non_negative_int_or(const char* key, int fallback) const {
    if (!has(key)) return fallback;
    const json& value = object_.at(key);
    if (!value.is_number_integer() || value.get<int64_t>() < 0 ||
        value.get<int64_t>() > (1ll << 31)) {
      bad(key, "a non-negative integer");
    }
    return value.get<int>();
  }
  double number(const char* key) const {
    const json& value = require(key);
    if (!value.is_number()) bad(key, "a number");
    return value.get<double>();
  }
  double number_or(const char* key, double fallback) const {
    return has(key) ? number(key) : fallback;
  }
  bool boolean_or(const char* key, bool fallback) const {
    if (!has(key)) return fallback;
    if (!object_.at(key).is_boolean()) bad(key, "true or false");
    return object_.at(key).get<bool>();
  }
  std::string string_or(const char* key, const std::string& fallback) const {
    if (!has(key)) return fallback;
    if (!object_.at(key).is_string()) bad(key, "a string");
    return object_.at(key).get<std::string>();
  }
  const json& require(const char* key) const {
    if (!has(key)) fail("{}: missing field \"{}{}\"", source_, prefix_, key);
    return object_.at(key);
  }
  [[noreturn]] void bad(const char* key, const char* expected) const {
    fail("{}: field \"{}{}\" must be {} (got {})", source_, prefix_, key, expected,
         object_.at(key).dump());
  }

 private:
  const json& object_;
  const std::string& source_;
  std::string prefix_;
};

RopeType parse_rope_type(const std::string& name, const std::string& source,
                         const std::string& field) {
  if (name == "default") return RopeType::kDefault;
  if (name == "linear") return RopeType::kLinear;
  if (name == "dynamic") return RopeType::kDynamic;
  if (name == "llama3") return RopeType::kLlama3;
  if (name == "yarn") return RopeType::kYarn;
  fail(
      "{}: field \"{}\" has unsupported rope type \"{}\" (supported: default, linear, dynamic, "
      "llama3, yarn)",
      source, field, name);
}

// Reads one rope description: `params` holds rope_type/type and the scaling fields, and
// maybe rope_theta (newer style); `theta` is the fallback base.
RopeConfig parse_rope(const json& params, double theta, int max_positions,
                      const std::string& source, const std::string& prefix) {
  RopeConfig rope;
  rope.theta = theta;
  rope.original_max_position_embeddings = max_positions;
  if (params.is_null()) return rope;
  if (!params.is_object()) fail("{}: field \"{}\" must be an object", source, prefix);
  Fields fields(params, source, prefix + ".");
  rope.theta = fields.number_or("rope_theta", theta);
  std::string type = fields.string_or("rope_type", fields.string_or("type", "default"));
  rope.type = parse_rope_type(type, source, prefix + ".rope_type");
  if (rope.type == RopeType::kDefault) return rope;
  rope.factor = fields.number("factor");
  if (rope.factor <= 0) fields.bad("factor", "a positive number");
  rope.original_max_position_embeddings =
      fields.int_or("original_max_position_embeddings", max_positions);
  if (rope.type == RopeType::kLlama3) {
    rope.low_freq_factor = fields.number("low_freq_factor");
    rope.high_freq_factor = fields.number("high_freq_factor");
    rope.original_max_position_embeddings = fields.positive_int("original_max_position_embeddings");
    if (rope.high_freq_factor <= rope.low_freq_factor)
      fields.bad("high_freq_factor", "above low_freq_factor");
  }
  if (rope.type == RopeType::kYarn) {
    rope.beta_fast = fields.number_or("beta_fast", 32.0);
    rope.beta_slow = fields.number_or("beta_slow", 1.0);
    rope.mscale = fields.number_or("mscale", 0.0);
    rope.mscale_all_dim = fields.number_or("mscale_all_dim", 0.0);
    rope.attention_factor = fields.number_or("attention_factor", 0.0);
    rope.truncate = fields.boolean_or("truncate", true);
  }
  return rope;
}

std::vector<int> parse_token_ids(const json& config, const char* key, const std::string& source) {
  std::vector<int> ids;
  if (!config.contains(key) || config.at(key).is_null()) return ids;
  const json& value = config.at(key);
  auto take = [&](const json& item) {
    if (!item.is_number_integer() || item.get<int64_t>() < 0) {
      fail("{}: field \"{}\" must be a token id or a list of them (got {})", source, key,
           value.dump());
    }
    ids.push_back(item.get<int>());
  };
  if (value.is_array()) {
    for (const json& item : value) take(item);
  } else {
    take(value);
  }
  return ids;
}

ModelFamily parse_architecture(const json& config, const std::string& source, std::string* name) {
  if (!config.contains("architectures") || !config["architectures"].is_array() ||
      config["architectures"].empty() || !config["architectures"][0].is_string()) {
    fail("{}: missing field \"architectures\" (a list naming the model class)", source);
  }
  *name = config["architectures"][0].get<std::string>();
  for (const auto& architecture : kArchitectures) {
    if (*name == architecture.name) return architecture.family;
  }
  fail("{}: unknown architecture \"{}\" (supported: {})", source, *name, supported_architectures());
}

void parse_layer_windows(const json& config, const Fields& fields, ModelConfig& model,
                         const std::string& source, std::vector<std::string>& layer_types) {
  int window = fields.has("sliding_window") ? fields.positive_int("sliding_window") : 0;
  bool qwen = model.family == ModelFamily::kQwen2 || model.family == ModelFamily::kQwen3;
  if (qwen && !fields.boolean_or("use_sliding_window", false)) window = 0;
  if (fields.has("layer_types")) {
    const json& types = config.at("layer_types");
    if (!types.is_array() || static_cast<int>(types.size()) != model.num_layers) {
      fail("{}: field \"layer_types\" must list one type per layer ({})", source, model.num_layers);
    }
    for (const json& type : types) {
      std::string name = type.is_string() ? type.get<std::string>() : "";
      if (name != "full_attention" && name != "sliding_attention") {
        fail("{}: field \"layer_types\" has unsupported entry {}", source, type.dump());
      }
      if (name == "sliding_attention" && !fields.has("sliding_window")) {
        fail("{}: \"layer_types\" has sliding layers but \"sliding_window\" is not set", source);
      }
      layer_types.push_back(name);
      model.layer_window.push_back(
          name == "sliding_attention" ? fields.positive_int("sliding_window") : 0);
    }
    return;
  }
  // Qwen's older configs keep the first max_window_layers layers on full attention.
  int first_sliding = qwen ? fields.non_negative_int_or("max_window_layers", 28) : 0;
  for (int layer = 0; layer < model.num_layers; ++layer) {
    bool sliding = window > 0 && layer >= first_sliding;
    layer_types.push_back(sliding ? "sliding_attention" : "full_attention");
    model.layer_window.push_back(sliding ? window : 0);
  }
}

void parse_layer_ropes(const json& config, const Fields& fields, ModelConfig& model,
                       const std::string& source, const std::vector<std::string>& layer_types) {
  double theta = fields.number_or("rope_theta", 10000.0);
  int max_positions = model.max_position_embeddings;
  json params = config.contains("rope_scaling") ? config.at("rope_scaling") : json();
  std::string prefix = "rope_scaling";
  if (config.contains("rope_parameters") && !config.at("rope_parameters").is_null()) {
    params = config.at("rope_parameters");
    prefix = "rope_parameters";
  }
  bool per_layer_type = params.is_object() &&
                        (params.contains("full_attention") || params.contains("sliding_attention"));
  for (int layer = 0; layer < model.num_layers; ++layer) {
    const std::string& type = layer_types[static_cast<size_t>(layer)];
    if (per_layer_type) {
      if (!params.contains(type))
        fail("{}: field \"{}\" has no entry for \"{}\"", source, prefix, type);
      model.layer_rope.push_back(
          parse_rope(params.at(type), theta, max_positions, source, prefix + "." + type));
    } else {
      model.layer_rope.push_back(parse_rope(params, theta, max_positions, source, prefix));
    }
  }
}

}  // namespace

bool ModelConfig::any_sliding() const {
  for (int window : layer_window) {
    if (window > 0) return true;
  }
  return false;
}

std::string supported_architectures() {
  std::string names;
  for (const auto& architecture : kArchitectures) {
    if (!names.empty()) names += ", ";
    names += architecture.name;
  }
  return names;
}

ModelConfig parse_model_config(const std::string& text, const std::string& source) {
  json config = json::parse(text, nullptr, false);
  if (config.is_discarded()) fail("{}: malformed JSON", source);
  if (!config.is_object()) fail("{}: expected a JSON object", source);
  ModelConfig model;
  model.family = parse_architecture(config, source, &model.architecture);
  Fields fields(config, source);
  model.vocab_size = fields.positive_int("vocab_size");
  model.hidden_size = fields.positive_int("hidden_size");
  model.intermediate_size = fields.positive_int("intermediate_size");
  model.num_layers = fields.positive_int("num_hidden_layers");
  model.num_heads = fields.positive_int("num_attention_heads");
  model.num_kv_heads = fields.int_or("num_key_value_heads", model.num_heads);
  if (model.num_heads % model.num_kv_heads != 0) {
    fail("{}: num_attention_heads ({}) is not a multiple of num_key_value_heads ({})", source,
         model.num_heads, model.num_kv_heads);
  }
  if (!fields.has("head_dim") && model.hidden_size % model.num_heads != 0) {
    fail(
        "{}: hidden_size ({}) is not a multiple of num_attention_heads ({}) and head_dim is not "
        "set",
        source, model.hidden_size, model.num_heads);
  }
  model.head_dim = fields.int_or("head_dim", model.hidden_size / model.num_heads);
  if (model.head_dim % 2 != 0)
    fail("{}: field \"head_dim\" must be even for rotary embeddings", source);
  // Bounds far above any real model, so a corrupt config fails here rather than in a huge
  // allocation later.
  constexpr int kMaxLayers = 4096;
  constexpr int kMaxHeads = 4096;
  if (model.num_layers > kMaxLayers)
    fail("{}: num_hidden_layers {} exceeds {}", source, model.num_layers, kMaxLayers);
  if (model.num_heads > kMaxHeads || model.head_dim > kMaxHeads) {
    fail("{}: num_attention_heads {} or head_dim {} exceeds {}", source, model.num_heads,
         model.head_dim, kMaxHeads);
  }
  model.max_position_embeddings = fields.int_or("max_position_embeddings", 4096);
  model.rms_norm_eps = fields.number_or("rms_norm_eps", 1e-6);
  model.tie_word_embeddings = fields.boolean_or("tie_word_embeddings", false);
  model.qkv_bias =
      model.family == ModelFamily::kQwen2 || fields.boolean_or("attention_bias", false);
  model.o_bias = model.family != ModelFamily::kQwen2 && fields.boolean_or("attention_bias", false);
  model.mlp_bias = fields.boolean_or("mlp_bias", false);
  model.qk_norm = model.family == ModelFamily::kQwen3;
  std::string activation = fields.string_or("hidden_act", "silu");
  if (activation == "silu" || activation == "swish") {
    model.activation = Activation::kSilu;
  } else if (activation == "gelu_pytorch_tanh") {
    model.activation = Activation::kGeluTanh;
  } else {
    fail(
        "{}: field \"hidden_act\" has unsupported activation \"{}\" (supported: silu, "
        "gelu_pytorch_tanh)",
        source, activation);
  }
  std::vector<std::string> layer_types;
  parse_layer_windows(config, fields, model, source, layer_types);
  parse_layer_ropes(config, fields, model, source, layer_types);
  model.eos_token_ids = parse_token_ids(config, "eos_token_id", source);
  std::vector<int> bos = parse_token_ids(config, "bos_token_id", source);
  model.bos_token_id = bos.empty() ? -1 : bos.front();
  return model;
}

ModelConfig load_model_config(const std::filesystem::path& folder) {
  std::filesystem::path path = folder / "config.json";
  std::ifstream stream(path);
  if (!stream) fail("{}: cannot open (is {} a model folder?)", path.string(), folder.string());
  std::stringstream text;
  text << stream.rdbuf();
  return parse_model_config(text.str(), path.string());
}

}  // namespace deepinfer
