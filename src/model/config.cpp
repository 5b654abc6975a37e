#include "model/config.h"

#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "core/error.h"
#include "core/json.h"

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
    {"DeepseekV2ForCausalLM", ModelFamily::kDeepseekV2},
    {"DeepseekV3ForCausalLM", ModelFamily::kDeepseekV3},
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

void parse_mla(const Fields& fields, ModelConfig& model) {
  MlaConfig& mla = model.mla;
  mla.q_lora_rank = fields.int_or("q_lora_rank", 0);
  mla.kv_lora_rank = fields.positive_int("kv_lora_rank");
  mla.qk_nope_head_dim = fields.positive_int("qk_nope_head_dim");
  mla.qk_rope_head_dim = fields.positive_int("qk_rope_head_dim");
  mla.v_head_dim = fields.positive_int("v_head_dim");
  if (mla.qk_rope_head_dim % 2 != 0) fields.bad("qk_rope_head_dim", "even");
  constexpr int kMaxWidth = 65536;
  for (int width : {mla.q_lora_rank, mla.kv_lora_rank, mla.qk_head_dim(), mla.v_head_dim}) {
    if (width > kMaxWidth) fields.bad("kv_lora_rank", "within the supported sizes");
  }
  model.head_dim = mla.qk_head_dim();
}

void parse_moe(const Fields& fields, ModelConfig& model, const std::string& source) {
  MoeConfig& moe = model.moe;
  moe.num_experts = fields.int_or("n_routed_experts", 0);
  if (moe.num_experts == 0) return;
  constexpr int kMaxExperts = 4096;
  if (moe.num_experts > kMaxExperts) fields.bad("n_routed_experts", "at most 4096");
  moe.num_shared_experts = fields.non_negative_int_or("n_shared_experts", 0);
  moe.experts_per_token = fields.positive_int("num_experts_per_tok");
  moe.expert_intermediate_size = fields.positive_int("moe_intermediate_size");
  moe.first_dense_layers = fields.non_negative_int_or("first_k_dense_replace", 0);
  moe.layer_frequency = fields.int_or("moe_layer_freq", 1);
  moe.num_groups = fields.int_or("n_group", 1);
  moe.topk_groups = fields.int_or("topk_group", moe.num_groups);
  moe.normalize_weights = fields.boolean_or("norm_topk_prob", false);
  moe.routed_scaling_factor = fields.number_or("routed_scaling_factor", 1.0);
  std::string scoring = fields.string_or("scoring_func", "softmax");
  if (scoring == "softmax") {
    moe.scoring = ExpertScoring::kSoftmax;
  } else if (scoring == "sigmoid") {
    moe.scoring = ExpertScoring::kSigmoid;
  } else {
    fields.bad("scoring_func", "\"softmax\" or \"sigmoid\"");
  }
  std::string method = fields.string_or("topk_method", "greedy");
  if (method == "greedy") {
    moe.selection = ExpertSelection::kGreedy;
  } else if (method == "group_limited_greedy") {
    moe.selection = ExpertSelection::kGroupLimitedGreedy;
  } else if (method == "noaux_tc") {
    moe.selection = ExpertSelection::kNoAuxTc;
  } else {
    fields.bad("topk_method", "\"greedy\", \"group_limited_greedy\" or \"noaux_tc\"");
  }
  if (moe.experts_per_token > moe.num_experts)
    fields.bad("num_experts_per_tok", "at most n_routed_experts");
  if (moe.num_experts % moe.num_groups != 0 || moe.topk_groups > moe.num_groups) {
    fail("{}: n_group ({}) must divide n_routed_experts ({}) and be at least topk_group ({})",
         source, moe.num_groups, moe.num_experts, moe.topk_groups);
  }
  int per_group = moe.num_experts / moe.num_groups;
  if (moe.selection == ExpertSelection::kNoAuxTc && per_group < 2)
    fail("{}: noaux_tc needs at least 2 experts per group", source);
  if (moe.experts_per_token > moe.topk_groups * per_group)
    fail("{}: num_experts_per_tok exceeds the experts of topk_group groups", source);
}

// Block-scaled FP8 (DeepSeek-V3, Qwen3-FP8); other schemes are refused by name.
void parse_quantization(const json& config, ModelConfig& model, const std::string& source) {
  if (!config.contains("quantization_config") || config.at("quantization_config").is_null()) return;
  const json& quant = config.at("quantization_config");
  if (!quant.is_object()) fail("{}: field \"quantization_config\" must be an object", source);
  Fields fields(quant, source, "quantization_config.");
  std::string method = fields.string_or("quant_method", "");
  if (method != "fp8")
    fail("{}: quantization method \"{}\" is not supported (supported: fp8)", source, method);
  if (fields.string_or("fmt", "e4m3") != "e4m3") fields.bad("fmt", "\"e4m3\"");
  if (!fields.has("weight_block_size"))
    fail("{}: FP8 without \"weight_block_size\" (per-tensor scales) is not supported", source);
  const json& block = quant.at("weight_block_size");
  if (!block.is_array() || block.size() != 2 || !block[0].is_number_integer() ||
      !block[1].is_number_integer() || block[0].get<int64_t>() <= 0 ||
      block[1].get<int64_t>() <= 0 || block[0].get<int64_t>() > 65536 ||
      block[1].get<int64_t>() > 65536) {
    fields.bad("weight_block_size", "two positive integers");
  }
  model.weight_block_rows = block[0].get<int>();
  model.weight_block_cols = block[1].get<int>();
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
  json config = parse_json_or_discarded<json>(text);
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
  bool deepseek =
      model.family == ModelFamily::kDeepseekV2 || model.family == ModelFamily::kDeepseekV3;
  if (!deepseek && !fields.has("head_dim") && model.hidden_size % model.num_heads != 0) {
    fail(
        "{}: hidden_size ({}) is not a multiple of num_attention_heads ({}) and head_dim is not "
        "set",
        source, model.hidden_size, model.num_heads);
  }
  model.head_dim = fields.int_or("head_dim", model.hidden_size / model.num_heads);
  if (deepseek) parse_mla(fields, model);
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
  if (deepseek) {
    parse_moe(fields, model, source);
    model.num_mtp_layers = fields.non_negative_int_or("num_nextn_predict_layers", 0);
    model.num_kv_heads = model.num_heads;
  }
  parse_quantization(config, model, source);
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
