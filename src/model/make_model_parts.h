// Pieces of make_random_model shared by the family writers (internal to the model module).
#pragma once

#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "model/make_model.h"
#include "model/safetensors.h"

namespace deepinfer::make_model_parts {

constexpr int kFp8Block = 128;

// A projection: FP8 with its block scales beside it, or the model's dtype.
void add_projection(std::vector<TensorSpec>& specs, const MakeModelOptions& o,
                    const std::string& name, int64_t rows, int64_t cols);

// DeepSeek-V4: the config fields and tensors (transformers' saved names).
void add_deepseek_v4_config(const MakeModelOptions& o, nlohmann::json& config);
std::vector<TensorSpec> deepseek_v4_specs(const MakeModelOptions& o);
// tid2eid: `experts_per_token` distinct experts for every token id.
void fill_token_experts(const TensorSpec& spec, void* data, int num_experts, uint64_t seed);

}  // namespace deepinfer::make_model_parts
