// make-model's DeepSeek-V4 checkpoints: the config in DeepSeek's style and the tensors under
// the names transformers saves.
#include <fmt/format.h>

#include <cstring>

#include "core/error.h"
#include "model/make_model_parts.h"

namespace deepinfer::make_model_parts {

using nlohmann::json;

namespace {

// transformers' default schedule: two HCA layers, then HCA and CSA alternating.
std::vector<int> compress_ratios(const MakeModelOptions& o) {
  if (!o.compress_ratios.empty()) {
    DI_CHECK(static_cast<int>(o.compress_ratios.size()) == o.num_layers,
             "make-model: --compress-ratios lists {} layers, --layers is {}",
             o.compress_ratios.size(), o.num_layers);
    for (int ratio : o.compress_ratios)
      DI_CHECK(ratio == 0 || ratio == 4 || ratio == 128,
               "make-model: --compress-ratios entries must be 0, 4 or 128 (got {})", ratio);
    return o.compress_ratios;
  }
  std::vector<int> ratios;
  for (int layer = 0; layer < o.num_layers; ++layer)
    ratios.push_back(layer < 2 || (layer - 2) % 2 == 0 ? 128 : 4);
  return ratios;
}

int head_dim(const MakeModelOptions& o) {
  return o.head_dim > 0 ? o.head_dim : 512;
}

void add_compressor(std::vector<TensorSpec>& specs, const MakeModelOptions& o, const std::string& p,
                    int64_t width, int64_t rate, bool overlapping) {
  DType dt = o.dtype == DType::kF8E4M3 ? DType::kBF16 : o.dtype;
  int64_t projected = overlapping ? 2 * width : width;
  add_projection(specs, o, p + "wkv.weight", projected, o.hidden_size);
  add_projection(specs, o, p + "wgate.weight", projected, o.hidden_size);
  specs.push_back({p + "ape", dt, {rate, projected}});
  specs.push_back({p + "norm.weight", dt, {width}});
}

void add_attention(std::vector<TensorSpec>& specs, const MakeModelOptions& o, const std::string& p,
                   int ratio) {
  DType dt = o.dtype == DType::kF8E4M3 ? DType::kBF16 : o.dtype;
  int64_t h = o.hidden_size, hd = head_dim(o), heads = o.num_heads, rank = o.q_lora_rank;
  add_projection(specs, o, p + "wq_a.weight", rank, h);
  specs.push_back({p + "q_norm.weight", dt, {rank}});
  add_projection(specs, o, p + "wq_b.weight", heads * hd, rank);
  add_projection(specs, o, p + "wkv.weight", hd, h);
  specs.push_back({p + "norm.weight", dt, {hd}});
  specs.push_back({p + "attn_sink", dt, {heads}});
  add_projection(specs, o, p + "wo_a.weight", int64_t{o.o_groups} * o.o_lora_rank,
                 heads * hd / o.o_groups);
  add_projection(specs, o, p + "wo_b.weight", h, int64_t{o.o_groups} * o.o_lora_rank);
  if (ratio == 0) return;
  add_compressor(specs, o, p + "compressor.", hd, ratio, ratio == 4);
  if (ratio != 4) return;
  add_compressor(specs, o, p + "indexer.compressor.", o.index_head_dim, ratio, true);
  add_projection(specs, o, p + "indexer.wq_b.weight", int64_t{o.index_heads} * o.index_head_dim,
                 rank);
  specs.push_back({p + "indexer.weights_proj.weight", dt, {o.index_heads, h}});
}

void add_experts(std::vector<TensorSpec>& specs, const MakeModelOptions& o, const std::string& p,
                 bool hash_routed) {
  DType dt = o.dtype == DType::kF8E4M3 ? DType::kBF16 : o.dtype;
  int64_t h = o.hidden_size, width = o.moe_intermediate_size;
  specs.push_back({p + "gate.weight", dt, {o.num_experts, h}});
  if (hash_routed) {
    specs.push_back({p + "gate.tid2eid", DType::kI64, {o.vocab_size, o.experts_per_token}});
  } else {
    specs.push_back({p + "gate.bias", dt, {o.num_experts}});
  }
  auto expert = [&](const std::string& name) {
    add_projection(specs, o, name + "w1.weight", width, h);
    add_projection(specs, o, name + "w2.weight", h, width);
    add_projection(specs, o, name + "w3.weight", width, h);
  };
  for (int e = 0; e < o.num_experts; ++e) expert(fmt::format("{}experts.{}.", p, e));
  if (o.num_shared_experts > 0) expert(p + "shared_experts.");
}

void add_hyper_connection(std::vector<TensorSpec>& specs, const MakeModelOptions& o,
                          const std::string& p) {
  int64_t streams = o.hc_mult, mixes = (2 + streams) * streams;
  specs.push_back({p + "_fn", DType::kF32, {mixes, streams * o.hidden_size}});
  specs.push_back({p + "_base", DType::kF32, {mixes}});
  specs.push_back({p + "_scale", DType::kF32, {3}});
}

}  // namespace

void add_deepseek_v4_config(const MakeModelOptions& o, json& config) {
  DI_CHECK(o.q_lora_rank > 0, "make-model: deepseek_v4 needs --q-lora-rank");
  DI_CHECK(o.num_heads % o.o_groups == 0, "make-model: --o-groups must divide --heads");
  DI_CHECK(o.index_head_dim >= o.qk_rope_head_dim && head_dim(o) >= o.qk_rope_head_dim,
           "make-model: --qk-rope-dim must fit in --head-dim and --index-head-dim");
  config.erase("intermediate_size");
  config["head_dim"] = head_dim(o);
  config["num_key_value_heads"] = 1;
  config["q_lora_rank"] = o.q_lora_rank;
  config["qk_rope_head_dim"] = o.qk_rope_head_dim;
  config["o_groups"] = o.o_groups;
  config["o_lora_rank"] = o.o_lora_rank;
  config["sliding_window"] = o.sliding_window > 0 ? o.sliding_window : 128;
  config["index_n_heads"] = o.index_heads;
  config["index_head_dim"] = o.index_head_dim;
  config["index_topk"] = o.index_topk;
  config["hc_mult"] = o.hc_mult;
  config["hc_sinkhorn_iters"] = 20;
  config["hc_eps"] = 1e-6;
  config["compress_ratios"] = compress_ratios(o);
  config["compress_rope_theta"] = 160000.0;
  config["num_hash_layers"] = o.num_hash_layers;
  config["n_routed_experts"] = o.num_experts;
  config["n_shared_experts"] = o.num_shared_experts;
  config["num_experts_per_tok"] = o.experts_per_token;
  config["moe_intermediate_size"] = o.moe_intermediate_size;
  config["scoring_func"] = "sqrtsoftplus";
  config["norm_topk_prob"] = true;
  config["routed_scaling_factor"] = 1.5;
  config["swiglu_limit"] = 10.0;
  config["num_nextn_predict_layers"] = 0;
  config["attention_bias"] = false;
  if (!config.contains("rope_scaling")) {
    config["rope_scaling"] = {{"type", "yarn"},
                              {"factor", 16.0},
                              {"original_max_position_embeddings", 65536},
                              {"beta_fast", 32},
                              {"beta_slow", 1}};
  }
  if (o.dtype == DType::kF8E4M3) {
    config["torch_dtype"] = "bfloat16";
    config["quantization_config"] = {{"activation_scheme", "dynamic"},
                                     {"fmt", "e4m3"},
                                     {"quant_method", "fp8"},
                                     {"weight_block_size", {kFp8Block, kFp8Block}}};
  }
}

std::vector<TensorSpec> deepseek_v4_specs(const MakeModelOptions& o) {
  DType dt = o.dtype == DType::kF8E4M3 ? DType::kBF16 : o.dtype;
  int64_t h = o.hidden_size;
  std::vector<int> ratios = compress_ratios(o);
  std::vector<TensorSpec> specs;
  specs.push_back({"model.embed_tokens.weight", dt, {o.vocab_size, h}});
  for (int i = 0; i < o.num_layers; ++i) {
    std::string p = fmt::format("model.layers.{}.", i);
    specs.push_back({p + "attn_norm.weight", dt, {h}});
    specs.push_back({p + "ffn_norm.weight", dt, {h}});
    add_hyper_connection(specs, o, p + "hc_attn");
    add_hyper_connection(specs, o, p + "hc_ffn");
    add_attention(specs, o, p + "attn.", ratios[static_cast<size_t>(i)]);
    add_experts(specs, o, p + "ffn.", i < o.num_hash_layers);
  }
  specs.push_back({"model.norm.weight", dt, {h}});
  specs.push_back({"model.hc_head.hc_fn", DType::kF32, {o.hc_mult, int64_t{o.hc_mult} * h}});
  specs.push_back({"model.hc_head.hc_base", DType::kF32, {o.hc_mult}});
  specs.push_back({"model.hc_head.hc_scale", DType::kF32, {1}});
  specs.push_back({"head.weight", dt, {o.vocab_size, h}});
  return specs;
}

void fill_token_experts(const TensorSpec& spec, void* data, int num_experts, uint64_t seed) {
  int64_t tokens = spec.shape[0], k = spec.shape[1];
  DI_CHECK(k <= num_experts, "make-model: more experts per token than experts");
  for (int64_t t = 0; t < tokens; ++t) {
    // k consecutive experts from a start that depends on the token: distinct, spread evenly.
    uint64_t start = (static_cast<uint64_t>(t) * 0x9e3779b97f4a7c15ull + seed) >> 33;
    for (int64_t j = 0; j < k; ++j) {
      int64_t expert = static_cast<int64_t>((start + static_cast<uint64_t>(j)) %
                                            static_cast<uint64_t>(num_experts));
      std::memcpy(static_cast<char*>(data) + (t * k + j) * 8, &expert, 8);
    }
  }
}

}  // namespace deepinfer::make_model_parts
