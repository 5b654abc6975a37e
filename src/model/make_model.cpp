#include "model/make_model.h"

#include <fmt/format.h>
#include <unistd.h>

#include <fstream>
#include <functional>
#include <nlohmann/json.hpp>

#include "core/error.h"
#include "core/json.h"
#include "core/thread_pool.h"
#include "model/make_model_parts.h"
#include "model/safetensors.h"

namespace deepinfer {

namespace fs = std::filesystem;
using nlohmann::json;

using make_model_parts::add_projection;
using make_model_parts::kFp8Block;

void make_model_parts::add_projection(std::vector<TensorSpec>& specs, const MakeModelOptions& o,
                                      const std::string& name, int64_t rows, int64_t cols) {
  if (o.dtype != DType::kF8E4M3) {
    specs.push_back({name, o.dtype, {rows, cols}});
    return;
  }
  specs.push_back({name, DType::kF8E4M3, {rows, cols}});
  specs.push_back({name + "_scale_inv",
                   DType::kF32,
                   {(rows + kFp8Block - 1) / kFp8Block, (cols + kFp8Block - 1) / kFp8Block}});
}

namespace {

uint64_t splitmix64(uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

uint64_t name_hash(const std::string& name) {
  uint64_t hash = 1469598103934665603ull;
  for (char ch : name) hash = (hash ^ static_cast<uint8_t>(ch)) * 1099511628211ull;
  return hash;
}

bool is_deepseek(const MakeModelOptions& o) {
  return o.family == "deepseek_v2" || o.family == "deepseek_v3";
}

// The MLA, MoE and FP8 fields of a DeepSeek config.json.
void add_deepseek_config(const MakeModelOptions& o, json& config) {
  bool v3 = o.family == "deepseek_v3";
  config.erase("head_dim");
  config["num_key_value_heads"] = o.num_heads;  // MLA has no grouped key/value heads
  config["q_lora_rank"] = o.q_lora_rank > 0 ? json(o.q_lora_rank) : json();
  config["kv_lora_rank"] = o.kv_lora_rank;
  config["qk_nope_head_dim"] = o.qk_nope_head_dim;
  config["qk_rope_head_dim"] = o.qk_rope_head_dim;
  config["v_head_dim"] = o.v_head_dim;
  config["n_routed_experts"] = o.num_experts;
  config["n_shared_experts"] = o.num_shared_experts;
  config["num_experts_per_tok"] = o.experts_per_token;
  config["moe_intermediate_size"] = o.moe_intermediate_size;
  config["first_k_dense_replace"] = o.first_dense_layers;
  config["moe_layer_freq"] = 1;
  config["n_group"] = o.expert_groups;
  config["topk_group"] = o.topk_groups;
  config["scoring_func"] = v3 ? "sigmoid" : "softmax";
  config["topk_method"] =
      v3 ? "noaux_tc" : (o.expert_groups > 1 ? "group_limited_greedy" : "greedy");
  config["norm_topk_prob"] = v3;
  config["routed_scaling_factor"] = v3 ? 2.5 : 1.0;
  config["num_nextn_predict_layers"] = o.num_mtp_layers;
  config["attention_bias"] = false;
  if (o.dtype == DType::kF8E4M3) {
    config["torch_dtype"] = "bfloat16";
    config["quantization_config"] = {{"activation_scheme", "dynamic"},
                                     {"fmt", "e4m3"},
                                     {"quant_method", "fp8"},
                                     {"weight_block_size", {kFp8Block, kFp8Block}}};
  }
}

json family_config(const MakeModelOptions& o, int head_dim) {
  static const std::map<std::string, std::pair<const char*, const char*>> kFamilies = {
      {"llama", {"LlamaForCausalLM", "llama"}},
      {"mistral", {"MistralForCausalLM", "mistral"}},
      {"qwen2", {"Qwen2ForCausalLM", "qwen2"}},
      {"qwen3", {"Qwen3ForCausalLM", "qwen3"}},
      {"deepseek_v2", {"DeepseekV2ForCausalLM", "deepseek_v2"}},
      {"deepseek_v3", {"DeepseekV3ForCausalLM", "deepseek_v3"}},
      {"deepseek_v4", {"DeepseekV4ForCausalLM", "deepseek_v4"}},
  };
  auto found = kFamilies.find(o.family);
  if (found == kFamilies.end()) {
    fail(
        "make-model: unknown family \"{}\" (llama, mistral, qwen2, qwen3, deepseek_v2, "
        "deepseek_v3, deepseek_v4)",
        o.family);
  }
  json config = {
      {"architectures", {found->second.first}},
      {"model_type", found->second.second},
      {"vocab_size", o.vocab_size},
      {"hidden_size", o.hidden_size},
      {"intermediate_size", o.intermediate_size},
      {"num_hidden_layers", o.num_layers},
      {"num_attention_heads", o.num_heads},
      {"num_key_value_heads", o.num_kv_heads},
      {"head_dim", head_dim},
      {"hidden_act", "silu"},
      {"max_position_embeddings", o.max_position_embeddings},
      {"rms_norm_eps", 1e-5},
      {"rope_theta", o.rope_theta},
      {"tie_word_embeddings", o.tie_word_embeddings},
      {"torch_dtype", o.dtype == DType::kBF16  ? "bfloat16"
                      : o.dtype == DType::kF16 ? "float16"
                                               : "float32"},
      {"bos_token_id", 1},
      {"eos_token_id", 2},
  };
  if (!o.rope_scaling_json.empty()) {
    json scaling = parse_json_or_discarded<json>(o.rope_scaling_json);
    if (scaling.is_discarded() || !scaling.is_object())
      fail("make-model: --rope-scaling is not a JSON object");
    config["rope_scaling"] = scaling;
  }
  if (o.family == "llama") config["attention_bias"] = false;
  if (o.family == "mistral")
    config["sliding_window"] = o.sliding_window > 0 ? json(o.sliding_window) : json();
  if (o.family == "qwen2" || o.family == "qwen3") {
    config["use_sliding_window"] = o.sliding_window > 0;
    config["sliding_window"] = o.sliding_window > 0 ? json(o.sliding_window) : json();
    config["max_window_layers"] = 0;
  }
  if (is_deepseek(o)) add_deepseek_config(o, config);
  if (o.family == "deepseek_v4") make_model_parts::add_deepseek_v4_config(o, config);
  return config;
}

void add_gated_mlp(std::vector<TensorSpec>& specs, const MakeModelOptions& o,
                   const std::string& prefix, int64_t hidden, int64_t inter) {
  add_projection(specs, o, prefix + "gate_proj.weight", inter, hidden);
  add_projection(specs, o, prefix + "up_proj.weight", inter, hidden);
  add_projection(specs, o, prefix + "down_proj.weight", hidden, inter);
}

// One DeepSeek decoder layer (MLA attention; dense MLP or experts) under `p`.
void add_deepseek_layer(std::vector<TensorSpec>& specs, const MakeModelOptions& o,
                        const std::string& p, int layer) {
  DType dt = o.dtype == DType::kF8E4M3 ? DType::kBF16 : o.dtype;
  int64_t h = o.hidden_size;
  int64_t heads = o.num_heads;
  int64_t qk = int64_t{o.qk_nope_head_dim} + o.qk_rope_head_dim;
  specs.push_back({p + "input_layernorm.weight", dt, {h}});
  if (o.q_lora_rank > 0) {
    add_projection(specs, o, p + "self_attn.q_a_proj.weight", o.q_lora_rank, h);
    specs.push_back({p + "self_attn.q_a_layernorm.weight", dt, {o.q_lora_rank}});
    add_projection(specs, o, p + "self_attn.q_b_proj.weight", heads * qk, o.q_lora_rank);
  } else {
    add_projection(specs, o, p + "self_attn.q_proj.weight", heads * qk, h);
  }
  add_projection(specs, o, p + "self_attn.kv_a_proj_with_mqa.weight",
                 int64_t{o.kv_lora_rank} + o.qk_rope_head_dim, h);
  specs.push_back({p + "self_attn.kv_a_layernorm.weight", dt, {o.kv_lora_rank}});
  add_projection(specs, o, p + "self_attn.kv_b_proj.weight",
                 heads * (o.qk_nope_head_dim + o.v_head_dim), o.kv_lora_rank);
  add_projection(specs, o, p + "self_attn.o_proj.weight", h, heads * o.v_head_dim);
  specs.push_back({p + "post_attention_layernorm.weight", dt, {h}});
  if (layer < o.first_dense_layers) {
    add_gated_mlp(specs, o, p + "mlp.", h, o.intermediate_size);
    return;
  }
  specs.push_back({p + "mlp.gate.weight", dt, {o.num_experts, h}});
  if (o.family == "deepseek_v3")
    specs.push_back({p + "mlp.gate.e_score_correction_bias", DType::kF32, {o.num_experts}});
  for (int e = 0; e < o.num_experts; ++e)
    add_gated_mlp(specs, o, fmt::format("{}mlp.experts.{}.", p, e), h, o.moe_intermediate_size);
  if (o.num_shared_experts > 0) {
    add_gated_mlp(specs, o, p + "mlp.shared_experts.", h,
                  int64_t{o.moe_intermediate_size} * o.num_shared_experts);
  }
}

std::vector<TensorSpec> deepseek_specs(const MakeModelOptions& o) {
  DType dt = o.dtype == DType::kF8E4M3 ? DType::kBF16 : o.dtype;
  int64_t h = o.hidden_size;
  std::vector<TensorSpec> specs;
  specs.push_back({"model.embed_tokens.weight", dt, {o.vocab_size, h}});
  for (int i = 0; i < o.num_layers; ++i)
    add_deepseek_layer(specs, o, fmt::format("model.layers.{}.", i), i);
  // MTP modules as DeepSeek-V3 ships them: a full layer plus the joining projections.
  for (int m = 0; m < o.num_mtp_layers; ++m) {
    int index = o.num_layers + m;
    std::string p = fmt::format("model.layers.{}.", index);
    add_deepseek_layer(specs, o, p, index);
    specs.push_back({p + "enorm.weight", dt, {h}});
    specs.push_back({p + "hnorm.weight", dt, {h}});
    add_projection(specs, o, p + "eh_proj.weight", h, 2 * h);
    specs.push_back({p + "embed_tokens.weight", dt, {o.vocab_size, h}});
    specs.push_back({p + "shared_head.norm.weight", dt, {h}});
    specs.push_back({p + "shared_head.head.weight", dt, {o.vocab_size, h}});
  }
  specs.push_back({"model.norm.weight", dt, {h}});
  if (!o.tie_word_embeddings) specs.push_back({"lm_head.weight", dt, {o.vocab_size, h}});
  return specs;
}

std::vector<TensorSpec> tensor_specs(const MakeModelOptions& o, int head_dim) {
  if (is_deepseek(o)) return deepseek_specs(o);
  if (o.family == "deepseek_v4") return make_model_parts::deepseek_v4_specs(o);
  DType dt = o.dtype;
  int64_t h = o.hidden_size;
  int64_t q = int64_t{o.num_heads} * head_dim;
  int64_t kv = int64_t{o.num_kv_heads} * head_dim;
  int64_t inter = o.intermediate_size;
  std::vector<TensorSpec> specs;
  specs.push_back({"model.embed_tokens.weight", dt, {o.vocab_size, h}});
  for (int i = 0; i < o.num_layers; ++i) {
    std::string p = fmt::format("model.layers.{}.", i);
    specs.push_back({p + "input_layernorm.weight", dt, {h}});
    specs.push_back({p + "self_attn.q_proj.weight", dt, {q, h}});
    specs.push_back({p + "self_attn.k_proj.weight", dt, {kv, h}});
    specs.push_back({p + "self_attn.v_proj.weight", dt, {kv, h}});
    if (o.family == "qwen2") {
      specs.push_back({p + "self_attn.q_proj.bias", dt, {q}});
      specs.push_back({p + "self_attn.k_proj.bias", dt, {kv}});
      specs.push_back({p + "self_attn.v_proj.bias", dt, {kv}});
    }
    if (o.family == "qwen3") {
      specs.push_back({p + "self_attn.q_norm.weight", dt, {head_dim}});
      specs.push_back({p + "self_attn.k_norm.weight", dt, {head_dim}});
    }
    specs.push_back({p + "self_attn.o_proj.weight", dt, {h, q}});
    specs.push_back({p + "post_attention_layernorm.weight", dt, {h}});
    specs.push_back({p + "mlp.gate_proj.weight", dt, {inter, h}});
    specs.push_back({p + "mlp.up_proj.weight", dt, {inter, h}});
    specs.push_back({p + "mlp.down_proj.weight", dt, {h, inter}});
  }
  specs.push_back({"model.norm.weight", dt, {h}});
  if (!o.tie_word_embeddings) specs.push_back({"lm_head.weight", dt, {o.vocab_size, h}});
  return specs;
}

void store_value(DType dtype, void* data, int64_t index, float value) {
  switch (dtype) {
    case DType::kBF16:
      static_cast<uint16_t*>(data)[index] = f32_to_bf16(value);
      break;
    case DType::kF16:
      static_cast<uint16_t*>(data)[index] = f32_to_f16(value);
      break;
    case DType::kF8E4M3:
      static_cast<uint8_t*>(data)[index] = f32_to_f8e4m3(value);
      break;
    default:
      static_cast<float*>(data)[index] = value;
  }
}

// Norm weights near 1, everything else uniform with standard deviation 0.02 (the usual
// initializer range), so activations stay in a realistic range through many layers. FP8
// weights span the e4m3 range and their block scales (0.75-1.25 x half-width / 448) bring
// them back to the same distribution, a little different per block.
void fill_random(const TensorSpec& spec, void* data, uint64_t seed) {
  bool is_norm = spec.name.find("norm") != std::string::npos;
  bool is_scale = spec.name.ends_with("_scale_inv");
  uint64_t stream = splitmix64(seed ^ name_hash(spec.name));
  auto count = static_cast<int64_t>(spec.nbytes() / dtype_size(spec.dtype));
  constexpr float kHalfWidth = 0.02f * 1.7320508f;
  constexpr float kFp8Max = 448.0f;
  ThreadPool::global().parallel_for(count, 4096, [&](int64_t begin, int64_t end) {
    for (int64_t i = begin; i < end; ++i) {
      uint64_t bits = splitmix64(stream + static_cast<uint64_t>(i));
      float unit = static_cast<float>(bits >> 40) * (1.0f / 16777216.0f) * 2.0f - 1.0f;
      float value = kHalfWidth * unit;
      if (is_norm) value = 1.0f + 0.1f * unit;
      if (is_scale) value = kHalfWidth / kFp8Max * (1.0f + 0.25f * unit);
      if (spec.dtype == DType::kF8E4M3) value = kFp8Max * unit;
      store_value(spec.dtype, data, i, value);
    }
  });
}

void write_json(const fs::path& path, const json& value) {
  std::ofstream out(path);
  out << value.dump(2) << "\n";
  if (!out) fail("{}: write failed", path.string());
}

}  // namespace

void make_random_model(const MakeModelOptions& o, const fs::path& folder) {
  DI_CHECK(is_deepseek(o) || o.family == "deepseek_v4" ||
               (o.num_heads > 0 && o.num_kv_heads > 0 && o.num_heads % o.num_kv_heads == 0),
           "make-model: --heads ({}) must be a positive multiple of --kv-heads ({})", o.num_heads,
           o.num_kv_heads);
  DI_CHECK(o.head_dim > 0 || o.hidden_size % o.num_heads == 0,
           "make-model: --hidden ({}) is not a multiple of --heads ({}); pass --head-dim",
           o.hidden_size, o.num_heads);
  bool v4 = o.family == "deepseek_v4";
  DI_CHECK(o.dtype == DType::kBF16 || o.dtype == DType::kF16 || o.dtype == DType::kF32 ||
               (o.dtype == DType::kF8E4M3 && (is_deepseek(o) || v4)),
           "make-model: --dtype must be bf16, f16 or f32 (fp8 for the deepseek families)");
  if (is_deepseek(o) || v4) {
    DI_CHECK(o.experts_per_token <= o.num_experts && o.num_experts % o.expert_groups == 0 &&
                 o.topk_groups <= o.expert_groups,
             "make-model: need --experts-per-token <= --experts, --expert-groups dividing "
             "--experts and --topk-groups <= --expert-groups");
  }
  int head_dim = o.head_dim > 0 ? o.head_dim : o.hidden_size / o.num_heads;
  json config = family_config(o, head_dim);
  fs::create_directories(folder);
  write_json(folder / "config.json", config);
  write_json(folder / "generation_config.json", {{"bos_token_id", 1}, {"eos_token_id", 2}});
  std::vector<TensorSpec> specs = tensor_specs(o, head_dim);
  std::vector<std::vector<TensorSpec>> shards(1);
  size_t shard_bytes = 0;
  size_t total = 0;
  for (const TensorSpec& spec : specs) {
    if (shard_bytes > 0 && shard_bytes + spec.nbytes() > o.max_shard_bytes) {
      shards.emplace_back();
      shard_bytes = 0;
    }
    shards.back().push_back(spec);
    shard_bytes += spec.nbytes();
    total += spec.nbytes();
  }
  // Progress on a terminal: large models take a while to generate and write.
  bool show_progress = isatty(STDERR_FILENO) != 0;
  size_t written = 0;
  auto fill = [&](const TensorSpec& spec, void* data) {
    if (spec.dtype == DType::kI64) {
      make_model_parts::fill_token_experts(spec, data, o.num_experts, o.seed);
    } else {
      fill_random(spec, data, o.seed);
    }
    written += spec.nbytes();
    if (show_progress) {
      fmt::print(stderr, "\rmake-model: {:3.0f}% ({:.2f} of {:.2f} GB)",
                 100.0 * static_cast<double>(written) / static_cast<double>(total),
                 static_cast<double>(written) / 1e9, static_cast<double>(total) / 1e9);
      if (written == total) fmt::print(stderr, "\n");
    }
  };
  std::map<std::string, std::string> metadata = {{"format", "pt"}};
  if (shards.size() == 1) {
    write_safetensors_streaming(folder / "model.safetensors", shards[0], fill, metadata);
    return;
  }
  json weight_map = json::object();
  for (size_t i = 0; i < shards.size(); ++i) {
    std::string name = fmt::format("model-{:05d}-of-{:05d}.safetensors", i + 1, shards.size());
    write_safetensors_streaming(folder / name, shards[i], fill, metadata);
    for (const TensorSpec& spec : shards[i]) weight_map[spec.name] = name;
  }
  write_json(folder / "model.safetensors.index.json",
             {{"metadata", {{"total_size", total}}}, {"weight_map", weight_map}});
}

}  // namespace deepinfer
