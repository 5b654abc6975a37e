#include "model/config.h"

#include <gtest/gtest.h>

#include "core/error.h"

namespace deepinfer {
namespace {

std::string llama_config(const std::string& extra) {
  return R"({"architectures": ["LlamaForCausalLM"], "vocab_size": 100, "hidden_size": 64,
             "intermediate_size": 128, "num_hidden_layers": 2, "num_attention_heads": 4,
             "num_key_value_heads": 2, "max_position_embeddings": 2048)" +
         extra + "}";
}

std::string parse_error(const std::string& text) {
  try {
    parse_model_config(text, "config.json");
  } catch (const Error& error) {
    return error.what();
  }
  return "";
}

TEST(Config, DefaultsFollowTransformers) {
  ModelConfig config = parse_model_config(llama_config(""), "config.json");
  EXPECT_EQ(config.family, ModelFamily::kLlama);
  EXPECT_EQ(config.head_dim, 16);
  EXPECT_EQ(config.layer_rope[0].type, RopeType::kDefault);
  EXPECT_EQ(config.layer_rope[0].theta, 10000.0);
  EXPECT_FALSE(config.any_sliding());
}

TEST(Config, HubAndNewerRopeStylesAgree) {
  ModelConfig hub = parse_model_config(
      llama_config(
          R"(, "rope_theta": 500000.0, "rope_scaling": {"rope_type": "llama3", "factor": 8.0,
                   "low_freq_factor": 1.0, "high_freq_factor": 4.0, "original_max_position_embeddings": 8192})"),
      "config.json");
  ModelConfig newer = parse_model_config(
      llama_config(
          R"(, "rope_parameters": {"rope_theta": 500000.0, "rope_type": "llama3", "factor": 8.0,
                   "low_freq_factor": 1.0, "high_freq_factor": 4.0, "original_max_position_embeddings": 8192})"),
      "config.json");
  for (const ModelConfig* config : {&hub, &newer}) {
    EXPECT_EQ(config->layer_rope[1].type, RopeType::kLlama3);
    EXPECT_EQ(config->layer_rope[1].theta, 500000.0);
    EXPECT_EQ(config->layer_rope[1].factor, 8.0);
    EXPECT_EQ(config->layer_rope[1].original_max_position_embeddings, 8192);
  }
}

TEST(Config, LegacyTypeKeyAndEveryRopeType) {
  ModelConfig linear = parse_model_config(
      llama_config(R"(, "rope_scaling": {"type": "linear", "factor": 2.0})"), "c");
  EXPECT_EQ(linear.layer_rope[0].type, RopeType::kLinear);
  ModelConfig dynamic = parse_model_config(
      llama_config(R"(, "rope_scaling": {"type": "dynamic", "factor": 2.0})"), "c");
  EXPECT_EQ(dynamic.layer_rope[0].type, RopeType::kDynamic);
  EXPECT_EQ(dynamic.layer_rope[0].original_max_position_embeddings, 2048);
  ModelConfig yarn = parse_model_config(
      llama_config(
          R"(, "rope_scaling": {"rope_type": "yarn", "factor": 40, "beta_fast": 32, "beta_slow": 1,
                   "mscale": 1.0, "mscale_all_dim": 1.0, "original_max_position_embeddings": 4096})"),
      "c");
  EXPECT_EQ(yarn.layer_rope[0].type, RopeType::kYarn);
  EXPECT_EQ(yarn.layer_rope[0].mscale_all_dim, 1.0);
  EXPECT_NE(
      parse_error(llama_config(R"(, "rope_scaling": {"rope_type": "longrope", "factor": 2.0})"))
          .find("unsupported rope type \"longrope\""),
      std::string::npos);
  EXPECT_NE(parse_error(llama_config(R"(, "rope_scaling": {"rope_type": "linear"})"))
                .find("rope_scaling.factor"),
            std::string::npos);
}

TEST(Config, SlidingWindowsPerFamily) {
  std::string mistral =
      R"({"architectures": ["MistralForCausalLM"], "vocab_size": 10, "hidden_size": 8,
      "intermediate_size": 16, "num_hidden_layers": 3, "num_attention_heads": 2, "sliding_window": 4})";
  EXPECT_EQ(parse_model_config(mistral, "c").layer_window, (std::vector<int>{4, 4, 4}));
  std::string qwen_off =
      R"({"architectures": ["Qwen2ForCausalLM"], "vocab_size": 10, "hidden_size": 8,
      "intermediate_size": 16, "num_hidden_layers": 2, "num_attention_heads": 2, "sliding_window": 4,
      "use_sliding_window": false})";
  EXPECT_FALSE(parse_model_config(qwen_off, "c").any_sliding());
  std::string qwen_hybrid =
      R"({"architectures": ["Qwen3ForCausalLM"], "vocab_size": 10, "hidden_size": 8,
      "intermediate_size": 16, "num_hidden_layers": 2, "num_attention_heads": 2, "sliding_window": 4,
      "use_sliding_window": true, "layer_types": ["sliding_attention", "full_attention"]})";
  ModelConfig hybrid = parse_model_config(qwen_hybrid, "c");
  EXPECT_EQ(hybrid.layer_window, (std::vector<int>{4, 0}));
  EXPECT_TRUE(hybrid.qk_norm);
}

TEST(Config, EosListsAndNullBos) {
  ModelConfig config =
      parse_model_config(llama_config(R"(, "eos_token_id": [5, 6], "bos_token_id": null)"), "c");
  EXPECT_EQ(config.eos_token_ids, (std::vector<int>{5, 6}));
  EXPECT_EQ(config.bos_token_id, -1);
}

TEST(Config, ErrorsNameFileAndField) {
  EXPECT_EQ(parse_error(llama_config(R"(, "num_key_value_heads": 3)")),
            "config.json: num_attention_heads (4) is not a multiple of num_key_value_heads (3)");
  EXPECT_EQ(parse_error("[1]"), "config.json: expected a JSON object");
  EXPECT_EQ(parse_error("{\"vocab_size\": 3}"),
            "config.json: missing field \"architectures\" (a list naming the model class)");
  EXPECT_NE(parse_error(llama_config(R"(, "hidden_act": "relu2")"))
                .find("unsupported activation \"relu2\""),
            std::string::npos);
}

std::string deepseek_config(const std::string& extra) {
  return R"({"architectures": ["DeepseekV3ForCausalLM"], "vocab_size": 100, "hidden_size": 64,
             "intermediate_size": 128, "num_hidden_layers": 3, "num_attention_heads": 4,
             "num_key_value_heads": 4, "q_lora_rank": 48, "kv_lora_rank": 32,
             "qk_nope_head_dim": 16, "qk_rope_head_dim": 8, "v_head_dim": 16,
             "n_routed_experts": 8, "n_shared_experts": 1, "num_experts_per_tok": 2,
             "moe_intermediate_size": 32, "first_k_dense_replace": 1, "n_group": 4,
             "topk_group": 2, "norm_topk_prob": true, "routed_scaling_factor": 2.5,
             "topk_method": "noaux_tc", "scoring_func": "sigmoid", "num_nextn_predict_layers": 1)" +
         extra + "}";
}

TEST(Config, DeepseekMlaMoeAndMtpFields) {
  ModelConfig config = parse_model_config(deepseek_config(""), "config.json");
  EXPECT_TRUE(config.is_deepseek());
  EXPECT_EQ(config.mla.q_lora_rank, 48);
  EXPECT_EQ(config.mla.kv_lora_rank, 32);
  EXPECT_EQ(config.mla.qk_head_dim(), 24);
  EXPECT_EQ(config.moe.selection, ExpertSelection::kNoAuxTc);
  EXPECT_EQ(config.moe.scoring, ExpertScoring::kSigmoid);
  EXPECT_FALSE(config.moe.is_moe_layer(0));
  EXPECT_TRUE(config.moe.is_moe_layer(1));
  EXPECT_EQ(config.num_mtp_layers, 1);
  EXPECT_EQ(config.weight_block_rows, 0);
  ModelConfig fp8 = parse_model_config(
      deepseek_config(R"(, "quantization_config": {"quant_method": "fp8", "fmt": "e4m3",
                      "activation_scheme": "dynamic", "weight_block_size": [128, 128]})"),
      "config.json");
  EXPECT_EQ(fp8.weight_block_rows, 128);
  EXPECT_EQ(fp8.weight_block_cols, 128);
}

TEST(Config, DeepseekErrorsNameTheField) {
  EXPECT_EQ(parse_error(deepseek_config(R"(, "topk_method": "random")")),
            "config.json: field \"topk_method\" must be \"greedy\", \"group_limited_greedy\" or "
            "\"noaux_tc\" (got \"random\")");
  EXPECT_EQ(parse_error(deepseek_config(R"(, "n_group": 3)")),
            "config.json: n_group (3) must divide n_routed_experts (8) and be at least topk_group "
            "(2)");
  EXPECT_EQ(parse_error(deepseek_config(R"(, "quantization_config": {"quant_method": "awq"})")),
            "config.json: quantization method \"awq\" is not supported (supported: fp8)");
  EXPECT_EQ(parse_error(deepseek_config(R"(, "quantization_config": {"quant_method": "fp8"})")),
            "config.json: FP8 without \"weight_block_size\" (per-tensor scales) is not supported");
  EXPECT_NE(parse_error(deepseek_config(R"(, "kv_lora_rank": 0)")).find("\"kv_lora_rank\""),
            std::string::npos);
}

}  // namespace
}  // namespace deepinfer
