// Model configuration parsed from a Hugging Face config.json.
#pragma once

#include <filesystem>
#include <nlohmann/json_fwd.hpp>
#include <string>
#include <vector>

namespace deepinfer {

enum class ModelFamily { kLlama, kMistral, kQwen2, kQwen3, kDeepseekV2, kDeepseekV3, kDeepseekV4 };

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

// Multi-head latent attention (DeepSeek-V2/V3).
struct MlaConfig {
  int q_lora_rank = 0;  // 0: queries come straight from q_proj
  int kv_lora_rank = 0;
  int qk_nope_head_dim = 0;
  int qk_rope_head_dim = 0;
  int v_head_dim = 0;

  int qk_head_dim() const { return qk_nope_head_dim + qk_rope_head_dim; }
};

// sqrt_softplus: sqrt(softplus(logit)) (DeepSeek-V4).
enum class ExpertScoring { kSoftmax, kSigmoid, kSqrtSoftplus };
// greedy: top-k of all experts. group_limited_greedy (V2): groups ranked by their best expert.
// noaux_tc (V3): groups ranked by the sum of their top-2 biased scores; the bias
// (e_score_correction_bias) only chooses, the unbiased scores weight.
enum class ExpertSelection { kGreedy, kGroupLimitedGreedy, kNoAuxTc };

struct MoeConfig {
  int num_experts = 0;  // 0: every layer is dense
  int num_shared_experts = 0;
  int experts_per_token = 0;
  int expert_intermediate_size = 0;
  int first_dense_layers = 0;  // first_k_dense_replace
  int layer_frequency = 1;     // moe_layer_freq
  ExpertScoring scoring = ExpertScoring::kSoftmax;
  ExpertSelection selection = ExpertSelection::kGreedy;
  int num_groups = 1;
  int topk_groups = 1;
  bool normalize_weights = false;  // norm_topk_prob
  double routed_scaling_factor = 1.0;
  // > 0: experts clamp their gate product from above and up product on both sides (V4).
  double swiglu_limit = 0.0;

  bool is_moe_layer(int layer) const {
    return num_experts > 0 && layer >= first_dense_layers && layer % layer_frequency == 0;
  }
};

// DeepSeek-V4's attention kinds: a sliding window only; the window plus overlapping
// compression at a low rate with a lightning indexer choosing entries (CSA); the window plus
// non-overlapping compression at a high rate, every completed entry visible (HCA).
enum class V4Attention : uint8_t { kSliding, kCompressedSparse, kHeavilyCompressed };

struct DeepseekV4Config {
  int q_lora_rank = 0;
  int rope_dims = 0;  // the trailing dims of each head that rotate
  int o_groups = 0;
  int o_lora_rank = 0;
  int window = 0;  // sliding window, counting the query itself
  int index_heads = 0;
  int index_head_dim = 0;
  int index_topk = 0;
  int hc_mult = 0;  // residual streams
  int hc_sinkhorn_iters = 20;
  double hc_eps = 1e-6;
  std::vector<V4Attention> layer_attention;
  std::vector<int> layer_rate;   // tokens per compressed entry; 0 for sliding layers
  std::vector<bool> layer_hash;  // the MoE routes by token id (tid2eid)
  RopeConfig main_rope;          // sliding layers
  RopeConfig compress_rope;      // every rope inside CSA and HCA layers
};

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
  MlaConfig mla;        // DeepSeek-V2/V3 only
  DeepseekV4Config v4;  // DeepSeek-V4 only
  MoeConfig moe;
  int num_mtp_layers = 0;  // num_nextn_predict_layers: extra layers after the last
  // quantization_config of block-scaled FP8 checkpoints: the scale block, 0 when unquantized.
  int weight_block_rows = 0;
  int weight_block_cols = 0;

  bool any_sliding() const;
  // DeepSeek-V2/V3 (multi-head latent attention).
  bool is_deepseek() const {
    return family == ModelFamily::kDeepseekV2 || family == ModelFamily::kDeepseekV3;
  }
};

// Parses config.json text. `source` names the file in errors: every error is one line naming
// the file and the field at fault.
ModelConfig parse_model_config(const std::string& text, const std::string& source);
ModelConfig load_model_config(const std::filesystem::path& folder);

// The names this build can load, for error messages and --help.
std::string supported_architectures();

}  // namespace deepinfer
