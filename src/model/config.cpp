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
    {"DeepseekV4ForCausalLM", ModelFamily::kDeepseekV4},
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
    // A field may be at fault through its default (absent, and the default does not fit).
    fail("{}: field \"{}{}\" must be {} (got {})", source_, prefix_, key, expected,
         has(key) ? object_.at(key).dump() : "nothing: its default does not fit");
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
  // DeepSeek-V4 always renormalises the chosen experts' weights, whatever norm_topk_prob says.
  moe.normalize_weights =
      model.family == ModelFamily::kDeepseekV4 || fields.boolean_or("norm_topk_prob", false);
  moe.routed_scaling_factor = fields.number_or("routed_scaling_factor", 1.0);
  std::string scoring = fields.string_or(
      "scoring_func", model.family == ModelFamily::kDeepseekV4 ? "sqrtsoftplus" : "softmax");
  if (scoring == "softmax") {
    moe.scoring = ExpertScoring::kSoftmax;
  } else if (scoring == "sigmoid") {
    moe.scoring = ExpertScoring::kSigmoid;
  } else if (scoring == "sqrtsoftplus" && model.family == ModelFamily::kDeepseekV4) {
    moe.scoring = ExpertScoring::kSqrtSoftplus;
  } else {
    fields.bad("scoring_func", model.family == ModelFamily::kDeepseekV4
                                   ? "\"sqrtsoftplus\", \"softmax\" or \"sigmoid\""
                                   : "\"softmax\" or \"sigmoid\"");
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

// DeepSeek-V4 layer schedule: the attention kind and compression rate of every layer, from
// `layer_types` (transformers' style) or `compress_ratios` (DeepSeek's), with the rate of each
// kind from `compress_rates` (or the scalar compress_rate_csa / compress_rate_hca keys).
void parse_v4_layers(const json& config, const Fields& fields, ModelConfig& model,
                     const std::string& source) {
  DeepseekV4Config& v4 = model.v4;
  int rate_csa = 4, rate_hca = 128;
  if (fields.has("compress_rates")) {
    const json& rates = config.at("compress_rates");
    if (!rates.is_object()) fields.bad("compress_rates", "an object keyed by attention type");
    Fields rate_fields(rates, source, "compress_rates.");
    rate_csa = rate_fields.int_or("compressed_sparse_attention", rate_csa);
    rate_hca = rate_fields.int_or("heavily_compressed_attention", rate_hca);
  }
  rate_csa = fields.int_or("compress_rate_csa", rate_csa);
  rate_hca = fields.int_or("compress_rate_hca", rate_hca);
  constexpr int kMaxRate = 1 << 16;
  if (rate_csa > kMaxRate || rate_hca > kMaxRate)
    fail("{}: compression rates {} and {} must be at most {}", source, rate_csa, rate_hca,
         kMaxRate);
  auto add = [&](V4Attention kind) {
    v4.layer_attention.push_back(kind);
    v4.layer_rate.push_back(kind == V4Attention::kSliding            ? 0
                            : kind == V4Attention::kCompressedSparse ? rate_csa
                                                                     : rate_hca);
  };
  if (fields.has("layer_types")) {
    const json& types = config.at("layer_types");
    if (!types.is_array() || static_cast<int>(types.size()) < model.num_layers)
      fail("{}: field \"layer_types\" must list one type per layer ({})", source, model.num_layers);
    for (int layer = 0; layer < model.num_layers; ++layer) {
      const json& type = types[static_cast<size_t>(layer)];
      std::string name = type.is_string() ? type.get<std::string>() : "";
      if (name == "sliding_attention") {
        add(V4Attention::kSliding);
      } else if (name == "compressed_sparse_attention") {
        add(V4Attention::kCompressedSparse);
      } else if (name == "heavily_compressed_attention") {
        add(V4Attention::kHeavilyCompressed);
      } else {
        fail(
            "{}: field \"layer_types\" has unsupported entry {} (supported: sliding_attention, "
            "compressed_sparse_attention, heavily_compressed_attention)",
            source, type.dump());
      }
    }
  } else if (fields.has("compress_ratios")) {
    const json& ratios = config.at("compress_ratios");
    if (!ratios.is_array() || static_cast<int>(ratios.size()) < model.num_layers)
      fail("{}: field \"compress_ratios\" must list one ratio per layer ({})", source,
           model.num_layers);
    for (int layer = 0; layer < model.num_layers; ++layer) {
      const json& ratio = ratios[static_cast<size_t>(layer)];
      int64_t value = ratio.is_number_integer() ? ratio.get<int64_t>() : -1;
      if (value == 0) {
        add(V4Attention::kSliding);
      } else if (value == 4 || value == rate_csa) {
        add(V4Attention::kCompressedSparse);
      } else if (value == 128 || value == rate_hca) {
        add(V4Attention::kHeavilyCompressed);
      } else {
        fail("{}: field \"compress_ratios\" has entry {} at layer {} (supported: 0, {}, {})",
             source, ratio.dump(), layer, rate_csa, rate_hca);
      }
    }
  } else {
    for (int layer = 0; layer < model.num_layers; ++layer) {
      bool hca = layer < 2 || (layer - 2) % 2 == 0;
      add(hca ? V4Attention::kHeavilyCompressed : V4Attention::kCompressedSparse);
    }
  }
  if (fields.has("mlp_layer_types")) {
    const json& types = config.at("mlp_layer_types");
    if (!types.is_array() || static_cast<int>(types.size()) < model.num_layers)
      fail("{}: field \"mlp_layer_types\" must list one type per layer ({})", source,
           model.num_layers);
    for (int layer = 0; layer < model.num_layers; ++layer) {
      const json& type = types[static_cast<size_t>(layer)];
      std::string name = type.is_string() ? type.get<std::string>() : "";
      if (name != "hash_moe" && name != "moe")
        fail("{}: field \"mlp_layer_types\" has unsupported entry {} (supported: hash_moe, moe)",
             source, type.dump());
      v4.layer_hash.push_back(name == "hash_moe");
    }
  } else {
    int hash_layers = fields.non_negative_int_or("num_hash_layers", 3);
    for (int layer = 0; layer < model.num_layers; ++layer)
      v4.layer_hash.push_back(layer < hash_layers);
  }
}

// DeepSeek-V4's two rope tables: "main" (plain, sliding layers) and "compress" (YaRN over
// compress_rope_theta, everything inside CSA and HCA layers).
void parse_v4_ropes(const json& config, const Fields& fields, ModelConfig& model,
                    const std::string& source) {
  DeepseekV4Config& v4 = model.v4;
  double theta = fields.number_or("rope_theta", 10000.0);
  double compress_theta = fields.number_or("compress_rope_theta", 160000.0);
  int max_positions = model.max_position_embeddings;
  const char* key = fields.has("rope_parameters") ? "rope_parameters" : "rope_scaling";
  json params = fields.has(key) ? config.at(key) : json();
  if (params.is_object() && params.contains("main") && params.contains("compress")) {
    v4.main_rope =
        parse_rope(params.at("main"), theta, max_positions, source, std::string(key) + ".main");
    v4.compress_rope = parse_rope(params.at("compress"), compress_theta, max_positions, source,
                                  std::string(key) + ".compress");
  } else {
    v4.main_rope = parse_rope(json(), theta, max_positions, source, key);
    json compress = params;
    if (compress.is_object()) compress.erase("rope_theta");
    v4.compress_rope = parse_rope(compress, compress_theta, max_positions, source, key);
    // DeepSeek's flat YaRN description leaves cos and sin unscaled.
    if (v4.compress_rope.type == RopeType::kYarn && v4.compress_rope.attention_factor == 0)
      v4.compress_rope.attention_factor = 1.0;
  }
  for (int layer = 0; layer < model.num_layers; ++layer) {
    bool sliding = v4.layer_attention[static_cast<size_t>(layer)] == V4Attention::kSliding;
    model.layer_rope.push_back(sliding ? v4.main_rope : v4.compress_rope);
  }
}

void parse_deepseek_v4(const json& config, const Fields& fields, ModelConfig& model,
                       const std::string& source) {
  DeepseekV4Config& v4 = model.v4;
  model.num_kv_heads = 1;  // one shared K=V head, whatever num_key_value_heads says
  v4.q_lora_rank = fields.int_or("q_lora_rank", 1024);
  if (fields.has("partial_rotary_factor")) {
    double factor = fields.number("partial_rotary_factor");
    if (!(factor > 0 && factor <= 1)) fields.bad("partial_rotary_factor", "in (0, 1]");
    v4.rope_dims = static_cast<int>(model.head_dim * factor);
  } else {
    v4.rope_dims = fields.int_or("qk_rope_head_dim", model.head_dim * 64 / 512);
  }
  if (v4.rope_dims % 2 != 0 || v4.rope_dims > model.head_dim)
    fields.bad(fields.has("partial_rotary_factor") ? "partial_rotary_factor" : "qk_rope_head_dim",
               "an even number of rope dims within head_dim");
  v4.o_groups = fields.int_or("o_groups", 8);
  v4.o_lora_rank = fields.int_or("o_lora_rank", 1024);
  if (model.num_heads % v4.o_groups != 0)
    fail("{}: o_groups ({}) must divide num_attention_heads ({})", source, v4.o_groups,
         model.num_heads);
  v4.window = fields.int_or("sliding_window", 128);
  v4.index_heads = fields.int_or("index_n_heads", 64);
  v4.index_head_dim = fields.int_or("index_head_dim", 128);
  v4.index_topk = fields.int_or("index_topk", 512);
  if (v4.index_head_dim % 2 != 0 || v4.index_head_dim < v4.rope_dims)
    fields.bad("index_head_dim", "even and at least the rope dims");
  v4.hc_mult = fields.int_or("hc_mult", 4);
  v4.hc_sinkhorn_iters = fields.int_or("hc_sinkhorn_iters", 20);
  v4.hc_eps = fields.number_or("hc_eps", 1e-6);
  constexpr int kMaxStreams = 64;
  if (v4.hc_mult > kMaxStreams) fields.bad("hc_mult", "at most 64");
  if (v4.hc_sinkhorn_iters > 1000) fields.bad("hc_sinkhorn_iters", "at most 1000");
  constexpr int kMaxWidth = 65536;
  for (int width : {v4.q_lora_rank, v4.o_lora_rank, v4.index_heads * v4.index_head_dim,
                    v4.index_topk, v4.window}) {
    if (width > kMaxWidth)
      fail("{}: a DeepSeek-V4 width ({}) exceeds {}", source, width, kMaxWidth);
  }
  parse_v4_layers(config, fields, model, source);
  model.layer_window.assign(static_cast<size_t>(model.num_layers), v4.window);
  parse_v4_ropes(config, fields, model, source);
}

void check_deepseek_v4_moe(const Fields& fields, ModelConfig& model) {
  // Every V4 layer is a mixture of experts: the expert count must be there (a present 0 was
  // refused by parse_moe already).
  if (model.moe.num_experts == 0) fields.require("n_routed_experts");
  model.moe.swiglu_limit = fields.number_or("swiglu_limit", 10.0);
  if (model.moe.swiglu_limit < 0) fields.bad("swiglu_limit", "a non-negative number");
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
  bool v4 = model.family == ModelFamily::kDeepseekV4;
  // DeepSeek-V4 has no dense layers, so no dense width.
  model.intermediate_size =
      v4 ? fields.int_or("intermediate_size", 0) : fields.positive_int("intermediate_size");
  model.num_layers = fields.positive_int("num_hidden_layers");
  model.num_heads = fields.positive_int("num_attention_heads");
  model.num_kv_heads = fields.int_or("num_key_value_heads", model.num_heads);
  // DeepSeek-V4 has one shared K=V head whatever num_key_value_heads says (set below).
  if (!v4 && model.num_heads % model.num_kv_heads != 0) {
    fail("{}: num_attention_heads ({}) is not a multiple of num_key_value_heads ({})", source,
         model.num_heads, model.num_kv_heads);
  }
  bool deepseek =
      model.family == ModelFamily::kDeepseekV2 || model.family == ModelFamily::kDeepseekV3;
  if (!deepseek && !v4 && !fields.has("head_dim") && model.hidden_size % model.num_heads != 0) {
    fail(
        "{}: hidden_size ({}) is not a multiple of num_attention_heads ({}) and head_dim is not "
        "set",
        source, model.hidden_size, model.num_heads);
  }
  model.head_dim = fields.int_or("head_dim", v4 ? 512 : model.hidden_size / model.num_heads);
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
  // transformers' defaults: DeepSeek-V4's context is 1M tokens.
  model.max_position_embeddings = fields.int_or("max_position_embeddings", v4 ? 1 << 20 : 4096);
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
  if (v4) {
    parse_deepseek_v4(config, fields, model, source);
  } else {
    std::vector<std::string> layer_types;
    parse_layer_windows(config, fields, model, source, layer_types);
    parse_layer_ropes(config, fields, model, source, layer_types);
  }
  if (deepseek || v4) {
    parse_moe(fields, model, source);
    model.num_mtp_layers = fields.non_negative_int_or("num_nextn_predict_layers", 0);
    if (!v4) model.num_kv_heads = model.num_heads;
  }
  if (v4) check_deepseek_v4_moe(fields, model);
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
