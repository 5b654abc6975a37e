// Random-weight checkpoints in the exact Hugging Face layout, for tests and benchmarks.
#pragma once

#include <cstdint>
#include <filesystem>
#include <string>
#include <vector>

#include "core/dtype.h"

namespace deepinfer {

struct MakeModelOptions {
  // llama | mistral | qwen2 | qwen3 | deepseek_v2 | deepseek_v3 | deepseek_v4
  std::string family = "llama";
  int vocab_size = 32000;
  int hidden_size = 512;
  int intermediate_size = 1536;
  int num_layers = 4;
  int num_heads = 8;
  int num_kv_heads = 8;
  int head_dim = 0;  // 0: hidden_size / num_heads
  int max_position_embeddings = 4096;
  int sliding_window = 0;  // mistral/qwen: 0 means none
  double rope_theta = 10000.0;
  std::string rope_scaling_json;  // e.g. {"rope_type":"llama3",...}; empty for none
  bool tie_word_embeddings = false;
  // kF8E4M3: DeepSeek-style FP8 (e4m3 projections with 128x128 block scales, bf16 elsewhere).
  DType dtype = DType::kBF16;
  uint64_t seed = 0;
  size_t max_shard_bytes = size_t{5} << 30;  // hub default; larger models are sharded
  // deepseek_v2 / deepseek_v3 only (defaults: DeepSeek-V2-Lite's attention and experts).
  int q_lora_rank = 0;  // 0: q_proj without a LoRA (V2-Lite)
  int kv_lora_rank = 512;
  int qk_nope_head_dim = 128;
  int qk_rope_head_dim = 64;
  int v_head_dim = 128;
  int num_experts = 64;
  int num_shared_experts = 2;
  int experts_per_token = 6;
  int moe_intermediate_size = 1408;
  int first_dense_layers = 1;
  int expert_groups = 1;
  int topk_groups = 1;
  int num_mtp_layers = 0;
  // deepseek_v4 only (with q_lora_rank, qk_rope_head_dim, head_dim, sliding_window and the
  // expert fields above; defaults: DeepSeek-V4-Flash's shapes).
  int o_groups = 8;
  int o_lora_rank = 1024;
  int index_heads = 64;
  int index_head_dim = 128;
  int index_topk = 512;
  int hc_mult = 4;
  int num_hash_layers = 3;
  std::vector<int> compress_ratios;  // per layer 0, 4 or 128; empty: transformers' default
};

// Writes config.json, generation_config.json and model.safetensors (or shards with
// model.safetensors.index.json) into `folder`, which is created if needed.
void make_random_model(const MakeModelOptions& options, const std::filesystem::path& folder);

}  // namespace deepinfer
